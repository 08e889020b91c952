/**
 * A sequence's logits and samples do not depend on its batch, its block placement or its prefill
 * chunking, in both compute modes (bfloat16 on the default kernels: AMX tiles where the CPU has them).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIXTURES } from "./helpers.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner, type RunnerSequence } from "../src/runtime/model-runner.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

const BLOCK = 8;
const ckpt = loadCheckpoint(path.join(FIXTURES, "tiny-qwen3"));
const runners = {
  float32: await ModelRunner.create(ckpt, { numBlocks: 512, blockSize: BLOCK }, "float32"),
  bfloat16: await ModelRunner.create(ckpt, { numBlocks: 512, blockSize: BLOCK }, "bfloat16"),
};
const V = ckpt.config.vocab;

function prng(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

const rand = prng(7);
const PROMPT = Array.from({ length: 37 }, () => Math.floor(rand() * 150000));
const sampling = defaultSamplingParams({ temperature: 0.8, topP: 0.9, topK: 50, seed: 1234, logprobs: 3 });
// The target's blocks: scattered, out of order.
const TARGET_BLOCKS = [301, 17, 222, 90, 5, 460, 133];

/** Filler sequences with their own blocks (ids < 300 apart from the target's): prefill chunks and decodes. */
function fillers(n: number): RunnerSequence[] {
  const r = prng(n);
  const used = new Set(TARGET_BLOCKS);
  let next = 300;
  const block = (): number => {
    do next = (next + 37) % 512; while (used.has(next));
    used.add(next);
    return next;
  };
  return Array.from({ length: n }, (_, i) => {
    const len = 1 + Math.floor(r() * 40);
    const decoding = i % 2 === 1;
    const start = decoding ? len : Math.floor(r() * 10);
    const count = decoding ? 1 : len;
    const blocks = Array.from({ length: Math.ceil((start + count) / BLOCK) }, block);
    return {
      tokenIds: Array.from({ length: count }, () => Math.floor(r() * V)),
      startPosition: start,
      blockTable: blocks,
      sample: { params: defaultSamplingParams({ temperature: 1, seed: i }), counter: 0, promptIds: [], outputIds: [] },
    };
  });
}

async function runTarget(runner: ModelRunner, others: number, chunk = PROMPT.length): Promise<{ logits: Float32Array[]; tokens: number[] }> {
  const logits: Float32Array[] = [];
  const tokens: number[] = [];
  // Prefill in chunks, then two decode steps; fillers ride along on every step.
  const steps: { ids: number[]; start: number }[] = [];
  for (let s = 0; s < PROMPT.length; s += chunk) steps.push({ ids: PROMPT.slice(s, s + chunk), start: s });
  let ids = [...PROMPT];
  for (let step = 0; step < steps.length + 2; step++) {
    const cur = steps[step] ?? { ids: [ids.at(-1)!], start: ids.length - 1 };
    const last = cur.start + cur.ids.length === ids.length;
    const target: RunnerSequence = {
      tokenIds: cur.ids, startPosition: cur.start, blockTable: TARGET_BLOCKS, allLogits: true,
      sample: last ? { params: sampling, counter: tokens.length, promptIds: PROMPT, outputIds: tokens } : null,
    };
    const batch = fillers(others);
    const at = Math.floor(others / 2);
    batch.splice(at, 0, target);
    const out = await runner.execute(batch);
    logits.push(out.logits![at]!);
    if (last) {
      tokens.push(out.samples[at]!.tokenId);
      ids = [...PROMPT, ...tokens];
    }
  }
  return { logits, tokens };
}

for (const [dtype, runner] of Object.entries(runners)) {
  test(`${dtype}: logits and samples are bit-identical alone and in batches of 2, 8 and 32`, async () => {
    const alone = await runTarget(runner, 0);
    for (const others of [1, 7, 31]) {
      const batched = await runTarget(runner, others);
      assert.deepEqual(batched.tokens, alone.tokens, `tokens with ${others} others`);
      batched.logits.forEach((l, i) => assert.ok(Buffer.compare(Buffer.from(l.buffer), Buffer.from(alone.logits[i]!.buffer)) === 0, `step ${i} logits differ with ${others} others`));
    }
  });

  test(`${dtype}: chunked prefill (chunks of 1, 7, 32) gives the same logits as one step`, async () => {
    const whole = await runTarget(runner, 0);
    const finalRows = (r: { logits: Float32Array[] }): Float32Array[] => r.logits.slice(-2);
    for (const chunk of [1, 7, 32]) {
      const chunked = await runTarget(runner, 3, chunk);
      assert.deepEqual(chunked.tokens, whole.tokens, `tokens with chunk ${chunk}`);
      // Every prompt row's logits, reassembled from the chunks.
      const rows = Buffer.concat(chunked.logits.slice(0, -2).map((l) => Buffer.from(l.buffer)));
      assert.equal(Buffer.compare(rows, Buffer.from(whole.logits[0]!.buffer)), 0, `prefill logits differ with chunk ${chunk}`);
      finalRows(chunked).forEach((l, i) => assert.equal(Buffer.compare(Buffer.from(l.buffer), Buffer.from(finalRows(whole)[i]!.buffer)), 0));
    }
  });
}

test("seeded sampling repeats across runs; other seeds differ", async () => {
  const runner = runners.float32;
  const a = await runTarget(runner, 5);
  const b = await runTarget(runner, 0);
  assert.deepEqual(a.tokens, b.tokens);
  const seq = (seed: number): RunnerSequence => ({
    tokenIds: PROMPT, startPosition: 0, blockTable: TARGET_BLOCKS,
    sample: { params: { ...sampling, seed, topK: 0, topP: 1, temperature: 5 }, counter: 0, promptIds: PROMPT, outputIds: [] },
  });
  const picks = new Set<number>();
  for (let seed = 0; seed < 8; seed++) picks.add((await runner.execute([seq(seed)])).samples[0]!.tokenId);
  assert.ok(picks.size > 1, "different seeds should sample different tokens at high temperature");
  const again = (await runner.execute([seq(3)])).samples[0]!.tokenId;
  const first = (await runner.execute([seq(3)])).samples[0]!.tokenId;
  assert.equal(again, first);
});

test("a second step while one is in flight is rejected, and bad input rejects without crashing", async () => {
  const runner = runners.float32;
  const seq: RunnerSequence = { tokenIds: PROMPT, startPosition: 0, blockTable: TARGET_BLOCKS, sample: null, allLogits: true };
  const first = runner.execute([seq]);
  await assert.rejects(runner.execute([seq]), /already running/);
  await first;
  await assert.rejects(runner.execute([{ ...seq, tokenIds: [V + 5] }]), /token id out of vocabulary/);
  await assert.rejects(runner.execute([{ ...seq, blockTable: [9999] }]), /block id out of range/);
  const ok = await runner.execute([seq]);
  assert.equal(ok.logits![0]!.length, PROMPT.length * V);
});
