/**
 * Grammar masks made while the step's forward pass runs: the step waits for
 * them before sampling, a late mask still constrains its row, other rows are
 * untouched, and a mask that cannot be made fails the step without hanging it.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIXTURES } from "./helpers.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner, type MaskSource, type RunnerSequence } from "../src/runtime/model-runner.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

let runner: ModelRunner;
before(async () => {
  runner = await ModelRunner.create(loadCheckpoint(path.join(FIXTURES, "tiny-qwen3")), { numBlocks: 32, blockSize: 16 });
});
after(async () => runner.dispose());

/** A mask allowing only `ids`. */
function only(ids: number[]): Int32Array {
  const m = new Int32Array(Math.ceil(runner.vocab / 32));
  for (const id of ids) m[id >> 5]! |= 1 << (id & 31);
  return m;
}

const later = (mask: Int32Array | undefined, ms: number): MaskSource => () => new Promise((r) => setTimeout(() => r(mask), ms));

/** Sequence `id`: a 9-token prefill from its own blocks, greedy, with `mask`. */
function seq(id: number, mask?: Int32Array | MaskSource): RunnerSequence {
  const tokenIds = Array.from({ length: 9 }, (_, i) => (id * 7919 + i * 104729) % 150000);
  return {
    tokenIds, startPosition: 0, blockTable: [id],
    sample: { params: defaultSamplingParams({ temperature: 0, logprobs: 2 }), counter: 0, promptIds: tokenIds, outputIds: [], ...(mask ? { mask } : {}) },
  };
}

test("a mask made after the step started constrains its row; ready masks and free rows are as without it", async () => {
  const free = await runner.execute([seq(0), seq(1), seq(2)]);
  const out = await runner.execute([seq(0, later(only([4242]), 40)), seq(1, only([777])), seq(2), seq(3, later(undefined, 10))]);
  assert.equal(out.samples[0]!.tokenId, 4242);
  assert.equal(out.samples[1]!.tokenId, 777);
  assert.deepEqual(out.samples[2], free.samples[2], "an unconstrained row is untouched");
  // Log-probs stay those of the raw logits, mask or not.
  assert.deepEqual(out.samples[0]!.top, free.samples[0]!.top);
  const alone = await runner.execute([seq(3)]);
  assert.deepEqual(out.samples[3], alone.samples[0], "a source with no mask leaves its row free");
});

test("a mask that cannot be made fails the step after it ends; the model steps on", async () => {
  const failing: MaskSource = () => Promise.reject(new Error("grammar broke"));
  await assert.rejects(runner.execute([seq(0, failing), seq(1)]), /grammar broke/);
  const out = await runner.execute([seq(0, later(only([99]), 5))]);
  assert.equal(out.samples[0]!.tokenId, 99);
});

test("greedy under a mask alone (the sampler's short path) picks what the general path picks", async () => {
  const allowed = Array.from({ length: 3000 }, (_, i) => (i * 7919) % runner.vocab);
  const mask = only(allowed);
  const shortPath = await runner.execute([seq(0, mask), seq(1, mask), seq(2, mask)]);
  const general = await runner.execute([0, 1, 2].map((id) => {
    const s = seq(id, mask);
    return { ...s, sample: { ...s.sample!, params: { ...s.sample!.params, logitBias: [[5, 0]] } } };
  }));
  assert.deepEqual(shortPath.samples, general.samples);
  for (const s of shortPath.samples) assert.ok(allowed.includes(s!.tokenId));
});
