/**
 * The native sampler draws from the distribution the request asks for: softmax(logits / T),
 * cut by top_k, then min_p, then top_p (the smallest set of the most likely tokens, lower id
 * first on ties, whose probability reaches top_p). Thousands of seeded draws from the fixture
 * model's logits are checked against that distribution computed here in double: no token
 * outside the kept set, and counts within a chi-square bound. The seeds are fixed, so the
 * outcome is too.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIXTURES } from "./helpers.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner, type RunnerSampling, type RunnerSequence } from "../src/runtime/model-runner.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

const BLOCK = 8;
const ROWS = 512;
const STEPS = 8;
const PROMPT = [9707, 1052, 374];
const ckpt = loadCheckpoint(path.join(FIXTURES, "tiny-qwen3"));
const runner = await ModelRunner.create(ckpt, { numBlocks: ROWS, blockSize: BLOCK }, "float32");

/** Each row prefills PROMPT in its own block and samples its last position. */
async function draw(params: RunnerSampling): Promise<number[]> {
  const tokens: number[] = [];
  for (let step = 0; step < STEPS; step++) {
    const seqs: RunnerSequence[] = Array.from({ length: ROWS }, (_, i) => ({
      tokenIds: PROMPT, startPosition: 0, blockTable: [i],
      sample: { params: { ...params, seed: step * ROWS + i }, counter: 0, promptIds: PROMPT, outputIds: [] },
    }));
    const r = await runner.execute(seqs);
    tokens.push(...r.samples.map((s) => s!.tokenId));
  }
  return tokens;
}

const logits = await (async () => {
  const r = await runner.execute([{ tokenIds: PROMPT, startPosition: 0, blockTable: [0], allLogits: true, sample: null }]);
  return Array.from(r.logits![0]!.subarray((PROMPT.length - 1) * ckpt.config.vocab));
})();

/** Token ids, most likely first (lower id first on equal logits). */
const ranked = logits.map((_, i) => i).sort((a, b) => logits[b]! - logits[a]! || a - b);

/** The distribution asked for, in double: token id → probability. */
function expected(p: { temperature: number; topK?: number; minP?: number; topP?: number }): Map<number, number> {
  const max = logits[ranked[0]!]!;
  let kept = ranked.slice(0, p.topK || ranked.length).map((id) => [id, Math.exp((logits[id]! - max) / p.temperature)] as const);
  kept = kept.filter(([, w]) => w >= (p.minP ?? 0) && w > 0);
  let total = kept.reduce((s, [, w]) => s + w, 0);
  if (p.topP !== undefined && p.topP < 1) {
    let cum = 0;
    const n = kept.findIndex(([, w]) => (cum += w) >= p.topP! * total);
    kept = kept.slice(0, n + 1);
    total = cum;
  }
  return new Map(kept.map(([id, w]) => [id, w / total]));
}

/** The chi-square statistic's value that a true distribution exceeds with probability about 1e-6 (Wilson–Hilferty). */
function chiSquareBound(df: number): number {
  const z = 4.75, a = 2 / (9 * df);
  return df * (1 - a + z * Math.sqrt(a)) ** 3;
}

function assertDrawnFrom(tokens: number[], probs: Map<number, number>, what: string): void {
  const counts = new Map<number, number>();
  for (const t of tokens) {
    assert.ok(probs.has(t), `${what}: token ${t} is outside the kept set of ${probs.size}`);
    counts.set(t, (counts.get(t) ?? 0) + 1);
  }
  // Tokens expected at least 5 times get a bin each; the rest share one.
  let chi = 0, bins = 0, restExpected = 0, restSeen = 0;
  for (const [id, q] of probs) {
    const e = q * tokens.length, seen = counts.get(id) ?? 0;
    if (e >= 5) {
      chi += (seen - e) ** 2 / e;
      bins++;
    } else {
      restExpected += e;
      restSeen += seen;
    }
  }
  if (restExpected >= 5) {
    chi += (restSeen - restExpected) ** 2 / restExpected;
    bins++;
  }
  assert.ok(bins >= 3, `${what}: too few bins (${bins}) to test`);
  const bound = chiSquareBound(bins - 1);
  assert.ok(chi < bound, `${what}: chi-square ${chi.toFixed(1)} over ${bins} bins, bound ${bound.toFixed(1)}`);
}

// A temperature at which the 40th most likely token weighs e^-4 of the first: a peaked
// distribution whose cuts keep a countable number of tokens.
const T = (logits[ranked[0]!]! - logits[ranked[39]!]!) / 4;

for (const cut of [{}, { topK: 7 }, { minP: 0.2 }, { topP: 0.6 }, { topK: 30, minP: 0.05, topP: 0.8 }]) {
  test(`temperature ${T.toExponential(2)} with ${JSON.stringify(cut)}: ${ROWS * STEPS} draws from the distribution asked for`, async () => {
    const probs = expected({ temperature: T, ...cut });
    const tokens = await draw(defaultSamplingParams({ temperature: T, ...cut }));
    assertDrawnFrom(tokens, probs, JSON.stringify(cut));
  });
}

test("temperature 1 over the whole vocabulary: draws land where the probability mass is", async () => {
  const probs = expected({ temperature: 1 });
  const tokens = await draw(defaultSamplingParams({ temperature: 1 }));
  // Near-flat over 151,936 tokens: bin by rank in 8 groups of equal mass instead.
  const groups = new Map<number, number>();
  let cum = 0;
  for (const id of ranked) groups.set(id, Math.min(7, Math.floor((cum += probs.get(id) ?? 0) * 8 - 1e-9)));
  const counts = Array.from({ length: 8 }, () => 0);
  for (const t of tokens) counts[groups.get(t)!]!++;
  const e = tokens.length / 8;
  const chi = counts.reduce((s, c) => s + (c - e) ** 2 / e, 0);
  assert.ok(chi < chiSquareBound(7), `chi-square ${chi.toFixed(1)} over 8 equal-mass groups: ${counts.join(", ")}`);
});
