/** A native model's life: loaded off the event loop, stepped, disposed at once; a bad sampled row fails alone. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { FIXTURES, ROOT, tempDir } from "./helpers.js";
import { fileMatrixBytes, stepMatrices } from "../src/bench/machine.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner, type RunnerSampling, type RunnerSequence } from "../src/runtime/model-runner.js";

const TINY = path.join(FIXTURES, "tiny-qwen3");
const MiB = 2 ** 20;

const sampling = (over: Partial<RunnerSampling> = {}): RunnerSampling => ({
  temperature: 0.8, topP: 0.95, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0, seed: 7, logprobs: 3, ...over,
});

/** A prefill of `n` tokens from its own blocks, sampled with `params`. */
function prefill(id: number, n: number, params: RunnerSampling, blockSize = 16): RunnerSequence {
  const tokenIds = Array.from({ length: n }, (_, i) => (id * 7919 + i * 104729) % 150000);
  const blockTable = Array.from({ length: Math.ceil(n / blockSize) }, (_, i) => id * 4 + i);
  return { tokenIds, startPosition: 0, blockTable, sample: { params, counter: 2, promptIds: tokenIds, outputIds: [tokenIds[0]!, 17] } };
}

test("dispose waits for the step in flight, then step and info fail with 'model disposed'; a second dispose is a no-op", async () => {
  const runner = await ModelRunner.create(loadCheckpoint(TINY), { numBlocks: 64, blockSize: 16 });
  const order: string[] = [];
  const step = runner.execute([prefill(1, 20, sampling())]).then((r) => (order.push("step"), r));
  const disposed = runner.dispose().then(() => order.push("dispose"));
  await assert.rejects(runner.execute([prefill(2, 3, sampling())]), /model disposed/, "no new step once dispose has begun");
  const result = await step;
  await disposed;
  assert.deepEqual(order, ["step", "dispose"]);
  assert.equal(result.errors[0], null);
  assert.ok(result.samples[0]!.tokenId >= 0);
  assert.throws(() => runner.info(), /model disposed/);
  assert.throws(() => runner.native.takeProfile(), /model disposed/);
  await assert.rejects(runner.execute([prefill(1, 4, sampling())]), /model disposed/);
  await runner.dispose();
});

test("a load that cannot read its weights rejects with the file named; models come only from loadModel", async () => {
  const ckpt = loadCheckpoint(TINY);
  const missing = { ...ckpt, weights: { ...ckpt.weights, embed: { ...ckpt.weights.embed, file: "/nonexistent/model.safetensors" } } };
  await assert.rejects(ModelRunner.create(missing, { numBlocks: 4, blockSize: 16 }), /cannot open \/nonexistent\/model\.safetensors/);
  const runner = await ModelRunner.create(ckpt, { numBlocks: 4, blockSize: 16 });
  const Model = runner.native.constructor as new () => unknown;
  assert.throws(() => new Model(), /created by loadModel/);
  await runner.dispose();
});

test("a sampled row with bad parameters fails alone: the other rows sample exactly what they sample without it", async () => {
  const runner = await ModelRunner.create(loadCheckpoint(TINY), { numBlocks: 128, blockSize: 16 });
  const good = [
    prefill(0, 21, sampling()),
    prefill(1, 5, sampling({ temperature: 0, logprobs: 0 })),
    prefill(2, 33, sampling({ repetitionPenalty: 1.3, presencePenalty: 0.5, frequencyPenalty: 0.2, topK: 40, seed: 99 })),
  ];
  const bad: [RunnerSequence, RegExp][] = [
    [prefill(3, 9, sampling({ topP: 1e-46 })), /top_p must be > 0/], // 0 in float32
    [prefill(4, 9, sampling({ repetitionPenalty: 1e-46 })), /repetition_penalty must be a finite number > 0/],
    [prefill(5, 9, sampling({ temperature: NaN })), /temperature must be a finite number/],
    [prefill(6, 9, sampling({ logprobs: 5000 })), /logprobs must be at most 1000/],
    // Valid parameters whose penalty overflows float32: the fault shows only while sampling.
    [prefill(7, 9, sampling({ presencePenalty: -3e38, frequencyPenalty: -3e38 })), /penalties or token mask left no token to sample/],
  ];
  const alone = await runner.execute(good);
  assert.deepEqual(alone.errors, [null, null, null]);
  const mixed = [bad[0]![0], good[0]!, bad[1]![0], bad[2]![0], good[1]!, bad[3]![0], good[2]!, bad[4]![0]];
  const out = await runner.execute(mixed);
  const at = (s: RunnerSequence): number => mixed.indexOf(s);
  for (const [i, s] of good.entries()) {
    assert.equal(out.errors[at(s)], null);
    assert.deepEqual(out.samples[at(s)], alone.samples[i], `good row ${i}`);
  }
  for (const [s, why] of bad) {
    assert.equal(out.samples[at(s)], null);
    assert.match(out.errors[at(s)] ?? "", why);
  }
  await runner.dispose();
});

test("loading a 1.2 GB model leaves the event loop running; dispose gives its memory back at once", async () => {
  const dir = tempDir("weft-lifecycle-");
  try {
    // Made in a child process so its buffers never count in this process's RSS.
    execFileSync(process.execPath, [path.join(ROOT, "dist", "src", "cli.js"), "make-model", "--preset", "qwen3-0.6b", "--dtype", "bf16", "--out", dir]);
    // Warm-up: the addon, libuv's and OpenMP's threads and their arenas exist before the baseline.
    const tiny = await ModelRunner.create(loadCheckpoint(TINY), { numBlocks: 8, blockSize: 16 });
    await tiny.execute([prefill(0, 20, sampling(), 16)]);
    await tiny.dispose();

    const ckpt = loadCheckpoint(dir);
    const before = process.memoryUsage().rss;
    let ticks = 0;
    const timer = setInterval(() => ticks++, 10);
    const started = performance.now();
    const runner = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: 16 });
    const loadMs = performance.now() - started;
    clearInterval(timer);
    const loaded = process.memoryUsage().rss;
    for (let i = 0; i < 3; i++) {
      const seq = prefill(i, 32, sampling({ repetitionPenalty: 1.1 }));
      assert.equal((await runner.execute([seq])).errors[0], null);
    }
    const stepped = process.memoryUsage().rss;
    await runner.dispose();
    const after = process.memoryUsage().rss;
    console.log(`RSS: before load ${(before / MiB).toFixed(0)} MiB, loaded ${(loaded / MiB).toFixed(0)} MiB, after 3 steps ` +
      `${(stepped / MiB).toFixed(0)} MiB, after dispose ${(after / MiB).toFixed(0)} MiB; load ${loadMs.toFixed(0)} ms, ${ticks} timer ticks during it`);
    // A load on the event loop would let no timer fire before it resolves.
    assert.ok(ticks >= 5, `only ${ticks} 10 ms ticks during a ${loadMs.toFixed(0)} ms load`);
    assert.ok(loaded - before > 1000 * MiB, "the packed weights are resident while loaded");
    // 64 MiB: the model held ~1.4 GiB (packed matrices, the mapped embedding, touched KV pages); what may
    // stay is allocator arenas and per-thread sampling scratch that the next model reuses (~15 MiB measured).
    assert.ok(after - before < 64 * MiB, `RSS after dispose is ${((after - before) / MiB).toFixed(0)} MiB above the pre-load RSS`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

test("the KV pool is resident once loaded (no step pays its pages' first faults) and leaves with dispose", async () => {
  const ckpt = loadCheckpoint(TINY);
  const c = ckpt.config;
  const blockSize = 16;
  const perBlock = 2 * c.layers * c.kvHeads * c.headDim * blockSize * 4; // K and V, float32
  const numBlocks = Math.ceil((256 * MiB) / perBlock);
  const warm = await ModelRunner.create(ckpt, { numBlocks: 8, blockSize }); // the addon's threads and arenas before the baseline
  await warm.dispose();
  const before = process.memoryUsage().rss;
  const runner = await ModelRunner.create(ckpt, { numBlocks, blockSize });
  const loaded = process.memoryUsage().rss;
  await runner.dispose();
  const after = process.memoryUsage().rss;
  const pool = numBlocks * perBlock;
  assert.ok(loaded - before >= pool, `RSS grew ${((loaded - before) / MiB).toFixed(0)} MiB at load, the pool is ${(pool / MiB).toFixed(0)} MiB`);
  assert.ok(after - before < 32 * MiB, `RSS after dispose is ${((after - before) / MiB).toFixed(0)} MiB above the pre-load RSS`);
});

test("info().weightBytes is the bytes a decode step reads: the matrices as held", async () => {
  const ckpt = loadCheckpoint(TINY);
  const stored = fileMatrixBytes(ckpt);
  const asBf16 = stepMatrices(ckpt).reduce((n, t) => n + t.shape[0]! * t.shape[1]! * 2, 0);
  for (const [dtype, bytes] of [["float32", stored], ["bfloat16", asBf16]] as const) {
    const runner = await ModelRunner.create(ckpt, { numBlocks: 8, blockSize: 16 }, dtype);
    // Packed rows are padded to the kernel set's chunk (hidden 48 here), which the kernels stream too.
    const held = runner.info().weightBytes;
    assert.ok(held >= bytes && held < 1.5 * bytes, `${dtype}: ${held} bytes held for ${bytes} bytes of matrices`);
    await runner.dispose();
  }
});
