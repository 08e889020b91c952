/**
 * The CUDA backend on the fixtures: logits within transformers' own CUDA bf16 band of the float32
 * references (for each KV cache element), greedy continuations through the paged cache equal to the
 * reference's except at near-ties, a prefill split into chunks equal to one pass up to rounding,
 * batch invariance within its documented limit, a decode step's folded kernels against the unfolded
 * ones, a row's bits across steps of 3 to 16 rows (the tensor-core GEMMs), a long row's attention split into chunks of keys
 * against the CPU's float32 path, the GPU's greedy sampling equal to the CPU sampler's, and the
 * device on /v1/models and in the start-up log. Where the addon has no CUDA
 * backend or no GPU is visible, the GPU tests skip with a printed notice (run `npm run test:cuda`
 * on a GPU host: docs/GPU.md).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIXTURES, readReference, tempDir } from "./helpers.js";
import { band, bandError, tieGap } from "./support/bf16-band.js";
import { startServer } from "./support/server.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { makeModel } from "../src/model/make-model.js";
import { ModelRunner, resolveDevice, resolveDtype, type RunnerSequence } from "../src/runtime/model-runner.js";
import { loadNative, type KvCacheDtype } from "../src/runtime/native.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

const MODELS = ["tiny-llama", "tiny-qwen3"] as const;
const BLOCK = 16;
const native = loadNative();
const gpus = native.cudaBuilt() ? native.cudaDevices() : [];
const skip = gpus.length > 0 ? false
  : `NOTICE: CUDA tests skipped: ${native.cudaBuilt() ? "no CUDA GPU is visible" : "this addon was built without CUDA (no nvcc and cuBLAS at build time)"}`;
if (skip) console.log(skip);
else console.log(`CUDA: ${gpus.map((g) => `${g.name} (sm ${g.computeCapability}, ${(g.totalBytes / 2 ** 30).toFixed(0)} GiB)`).join(", ")}`);

const blocks = (n: number, offset = 1): number[] => Array.from({ length: Math.ceil(n / BLOCK) }, (_, i) => offset + i * 2);
const gpuRunner = (model: string, kv: KvCacheDtype = "bfloat16", numBlocks = 256): Promise<ModelRunner> =>
  ModelRunner.create(loadCheckpoint(path.join(FIXTURES, model)), { numBlocks, blockSize: BLOCK, dtype: kv }, "bfloat16", "cuda");
const prefill = (ids: number[], offset = 1): RunnerSequence => ({ tokenIds: ids, startPosition: 0, blockTable: blocks(ids.length, offset), sample: null, allLogits: true });
/** One decode row after `ids` (a cached prefix), returning its logits. */
const decode = (ids: number[], offset: number): RunnerSequence =>
  ({ tokenIds: [ids.length % 97], startPosition: ids.length, blockTable: blocks(ids.length + 1, offset), sample: null, allLogits: true });
const maxAbsDiff = (a: Float32Array, b: Float32Array): number => a.reduce((m, v, i) => Math.max(m, Math.abs(v - b[i]!)), 0);

for (const model of MODELS) {
  for (const kv of ["bfloat16", "float16", "float32"] as const) {
    test(`cuda ${model}, KV ${kv}: logits within transformers' CUDA bf16 band on every reference position`, { skip }, async () => {
      const runner = await gpuRunner(model, kv);
      const logits: Float32Array[] = [];
      for (const ref of readReference(model)) logits.push((await runner.execute([prefill(ref.input_ids)])).logits![0]!);
      await runner.dispose();
      const err = bandError(model, (i) => logits[i]!);
      console.log(`cuda ${model} KV ${kv}: max |Δ log-prob| on the top-20 ${err.toFixed(4)} (transformers bf16 on CUDA ${band(model).cuda.toFixed(4)})`);
      assert.ok(err <= band(model).cuda, `${err} exceeds transformers' CUDA bf16 band ${band(model).cuda}`);
    });
  }

  test(`cuda ${model}: greedy decoding of every prompt together through the paged cache follows the reference except at near-ties`, { skip }, async () => {
    const ckpt = loadCheckpoint(path.join(FIXTURES, model));
    const gpu = await gpuRunner(model);
    const exact = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: BLOCK }, "float32");  // the CPU's float32 path judges near-ties
    const V = ckpt.config.vocab;
    const params = defaultSamplingParams({ temperature: 0, maxTokens: 1 });
    const refs = readReference(model);
    const ids = refs.map((r) => [...r.input_ids]);
    let next = 0;  // each sequence its own run of blocks
    const tables = refs.map((r) => Array.from({ length: Math.ceil((r.input_ids.length + r.greedy_continuation.length) / BLOCK) }, () => next++));
    const starts = refs.map(() => 0);
    // One batch per step: the prompts first, then one token per sequence (a decode step, replayed as a
    // CUDA graph); each sequence is fed the reference's token, so every step is checked.
    for (let step = 0; step < refs[0]!.greedy_continuation.length; step++) {
      const out = await gpu.execute(refs.map((_, i) => ({ tokenIds: ids[i]!.slice(starts[i]), startPosition: starts[i]!, blockTable: tables[i]!,
        sample: { params, counter: step, promptIds: [], outputIds: [] } })));
      for (const [i, ref] of refs.entries()) {
        const got = out.samples[i]!.tokenId, want = ref.greedy_continuation[step]!;
        if (got !== want) {
          const l = (await exact.execute([prefill(ids[i]!)])).logits![0]!.subarray((ids[i]!.length - 1) * V);
          const gap = l[want]! - l[got]!;
          console.log(`cuda ${model} prompt ${i}: differs from the reference at step ${step}, where float32's gap is ${gap.toFixed(4)} (near-tie below ${tieGap(model).toFixed(4)})`);
          assert.ok(gap < tieGap(model), `prompt ${i} step ${step}: picked ${got} over ${want} with a float32 gap of ${gap}`);
        }
        starts[i] = ids[i]!.length;
        ids[i]!.push(want);
      }
    }
    await Promise.all([gpu.dispose(), exact.dispose()]);
  });

  test(`cuda ${model}: a prefill in chunks over the cache equals one pass; batch invariance within a bf16 rounding`, { skip }, async () => {
    const runner = await gpuRunner(model);
    const V = loadCheckpoint(path.join(FIXTURES, model)).config.vocab;
    const target = readReference(model).reduce((a, b) => (b.input_ids.length > a.input_ids.length ? b : a)).input_ids;
    const whole = (await runner.execute([prefill(target)])).logits![0]!;
    // Chunks of 5 tokens, each attending to the cached ones before it (causal over cached + new).
    const table = blocks(target.length, 100);
    const chunks: Float32Array[] = [];
    for (let at = 0; at < target.length; at += 5) {
      const ids = target.slice(at, at + 5);
      chunks.push((await runner.execute([{ tokenIds: ids, startPosition: at, blockTable: table, sample: null, allLogits: true }])).logits![0]!);
    }
    const chunked = new Float32Array(target.length * V);
    chunks.reduce((at, c) => (chunked.set(c, at), at + c.length), 0);
    const scale = whole.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    const chunkDiff = maxAbsDiff(whole, chunked);
    // Beside 300 rows of another sequence: cuBLAS may pick another GEMM kernel for another row count,
    // and so many rows take the attention kernel that serves a KV head's query heads in one block.
    const others = Array.from({ length: 300 }, (_, j) => (j * 7919 + 13) % V);
    const batched = (await runner.execute([prefill(others, 60), prefill(target, 1)])).logits![1]!;
    const batchDiff = maxAbsDiff(whole, batched);
    console.log(`cuda ${model}: max |Δlogit| chunked ${chunkDiff.toExponential(3)}, batched ${batchDiff.toExponential(3)} (logit scale ${scale.toFixed(3)}; bit-identical in a batch: ${batchDiff === 0})`);
    assert.ok(chunkDiff / scale < 2e-2, `chunked prefill differs by ${chunkDiff}`);
    assert.ok(batchDiff / scale < 2e-2, `batched rows differ by ${batchDiff}`);
    await runner.dispose();
  });

  test(`cuda ${model}: greedy rows sampled on the GPU equal the CPU sampler on the same logits`, { skip }, async () => {
    const runner = await gpuRunner(model);
    const refs = readReference(model);
    const params = defaultSamplingParams({ temperature: 0, maxTokens: 1 });
    const logprobs = defaultSamplingParams({ temperature: 0, maxTokens: 1, logprobs: 2 });  // top-N: sampled on the CPU
    const seqs = (p: typeof params): RunnerSequence[] => refs.map((r, i) => ({ ...prefill(r.input_ids, 1 + i * 40), allLogits: false, sample: { params: p, counter: 0, promptIds: [], outputIds: [] } }));
    const gpuSide = await runner.execute(seqs(params));
    const cpuSide = await runner.execute(seqs(logprobs));
    gpuSide.samples.forEach((s, i) => {
      assert.equal(s!.tokenId, cpuSide.samples[i]!.tokenId);
      assert.ok(Math.abs(s!.logprob - cpuSide.samples[i]!.logprob) < 1e-4, `log-prob ${s!.logprob} vs ${cpuSide.samples[i]!.logprob}`);
      assert.equal(cpuSide.samples[i]!.top[0]!.tokenId, s!.tokenId);
    });
    // Seeded sampling goes through the CPU sampler: the same draw on the same seed.
    const seeded = defaultSamplingParams({ temperature: 0.8, topP: 0.9, maxTokens: 1, seed: 7 });
    const [a, b] = [await runner.execute(seqs(seeded)), await runner.execute(seqs(seeded))];
    assert.deepEqual(a.samples.map((s) => s!.tokenId), b.samples.map((s) => s!.tokenId));
    await runner.dispose();
  });
}

// Two cached prompts of the `small` preset whose decode rows the one-row and folded-attention tests compare.
const promptA = Array.from({ length: 20 }, (_, i) => 100 + i * 37), promptB = Array.from({ length: 24 }, (_, i) => 900 + i * 53);

// The fixtures' hidden sizes (48, 64) are below the GEMV's K = 256·L, so a random `small` (hidden 256,
// intermediate 768) checks it: a lone row takes the GEMVs that fold in the RMSNorm and SiLU·mul, wait
// for the kernel before them (PDL) and, for the LM head, take two columns a warp; beside a second row
// the same row takes the two-row GEMVs, each weight serving both rows. Each row's arithmetic in the
// same order: the same bits.
test("cuda: a one-row decode step (RMSNorm and SiLU·mul folded into the GEMVs, PDL) gives the bits of that row in a two-row step", { skip }, async () => {
  const dir = makeModel({ preset: "small", out: tempDir() });
  const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 64, blockSize: BLOCK, dtype: "bfloat16" }, "bfloat16", "cuda");
  await runner.execute([prefill(promptA, 1), prefill(promptB, 20)]);
  const alone = (await runner.execute([decode(promptA, 1)])).logits![0]!;
  const paired = (await runner.execute([decode(promptA, 1), decode(promptB, 20)])).logits![0]!;
  await runner.dispose();
  assert.equal(maxAbsDiff(alone, paired), 0, "the one-row path must give the same logits as the two-row path");
});

// A decode step (each row its sequence's one new token) folds the q/k/v epilogue into attention; a step
// with a chunk of two tokens runs them as two kernels. A decode row must give the bits of the same
// position as the first row of its sequence's two-token chunk. Every step has at most two rows, so
// every GEMM takes the one- or two-row GEMV (steps of more rows sum in another order). The fold loads its
// first keys before its PDL wait and takes its new key from shared memory: the short prompts' new key
// falls in that first load, the 530-token one's too but in a second chunk of 512 keys, and the
// 800-token one's in a later load of the second chunk (read back from the cache).
test("cuda: a decode step's rows (q/k/v epilogue folded into attention) give the bits of the same rows in a two-token chunk, for each KV element", { skip }, async () => {
  const dir = makeModel({ preset: "small", out: tempDir() });
  const chunk = (ids: number[], offset: number): RunnerSequence =>
    ({ ...decode(ids, offset), tokenIds: [ids.length % 97, 5], blockTable: blocks(ids.length + 2, offset) });
  const long = (n: number): number[] => Array.from({ length: n }, (_, i) => (i * 131) % 5000);
  const pairs = [[[promptA, 1], [promptB, 20]], [[long(800), 30], [long(530), 31]]] as const;
  for (const kv of ["bfloat16", "float16", "float32"] as const) {
    const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 160, blockSize: BLOCK, dtype: kv }, "bfloat16", "cuda");
    for (const pair of pairs) {
      for (const [ids, offset] of pair) await runner.execute([{ ...prefill(ids, offset), allLogits: false }]);
      const folded = (await runner.execute(pair.map(([ids, offset]) => decode(ids, offset)))).logits!;
      for (const [i, [ids, offset]] of pair.entries()) {
        const split = (await runner.execute([chunk(ids, offset)])).logits![0]!;
        assert.equal(split.length, 2 * folded[i]!.length, "the chunk's two rows");
        assert.equal(maxAbsDiff(folded[i]!, split.subarray(0, folded[i]!.length)), 0, `KV ${kv}: decode row of ${ids.length} tokens must not depend on the fold`);
      }
    }
    await runner.dispose();
  }
});

// Steps of 3 to 16 rows take the tensor-core GEMMs (mmaRowsGemm), whose per-row arithmetic does not
// depend on the row count, and attention's per-row bits do not either: a decode row gives the same
// logits beside 2, 7, 8 or 15 other rows (both sides of the 8-row tile and of the few-row attention
// path), close to the CPU's float32 path and to the two-row skinny kernel's.
test("cuda: a decode row gives the same bits in steps of 3 to 16 rows (tensor-core GEMMs), close to float32 and to two rows", { skip }, async () => {
  const dir = makeModel({ preset: "small", out: tempDir() });
  const prompts = Array.from({ length: 16 }, (_, i) => Array.from({ length: 12 + i }, (_, j) => 100 + ((i * 131 + j * 37) % 4000)));
  const offset = (i: number): number => 1 + i * 4;
  const run = async (device: "cpu" | "cuda", sizes: number[]): Promise<Float32Array[]> => {
    const kv = device === "cuda" ? "bfloat16" : "float32";
    const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 80, blockSize: BLOCK, dtype: kv }, kv, device);
    await runner.execute(prompts.map((p, i) => ({ ...prefill(p, offset(i)), allLogits: false })));
    const out: Float32Array[] = [];
    for (const n of sizes) out.push((await runner.execute(prompts.slice(0, n).map((p, i) => decode(p, offset(i))))).logits![0]!);
    await runner.dispose();
    return out;
  };
  const [three, eight, nine, sixteen, two] = await run("cuda", [3, 8, 9, 16, 2]);
  const [cpu] = await run("cpu", [1]);
  for (const [n, l] of [[8, eight!], [9, nine!], [16, sixteen!]] as const)
    assert.equal(maxAbsDiff(three!, l), 0, `the row must give the same bits in a ${n}-row step as in a 3-row one`);
  const scale = cpu!.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const vsCpu = maxAbsDiff(three!, cpu!), vsTwo = maxAbsDiff(three!, two!);
  console.log(`cuda: a decode row in steps of 3-16 rows: max |Δlogit| against the CPU's float32 ${vsCpu.toExponential(3)}, against two rows ${vsTwo.toExponential(3)} (logit scale ${scale.toFixed(3)})`);
  assert.ok(vsCpu / scale < 2e-2, `the 3-16-row path differs from float32 by ${vsCpu}`);
  assert.ok(vsTwo / scale < 2e-2, `the 3-16-row path differs from the two-row path by ${vsTwo}`);
});

// A row past kAttnChunk (512) keys is split over blocks and merged (flash decoding): a decode row at
// 1,300 cached tokens (3 chunks) against the CPU's float32 attention, which never splits, and alone
// against beside a short row (the split depends on the row's own length, not on the batch).
test("cuda: a long row's attention, split into chunks of keys, matches the CPU's float32 path and is the same beside a short row", { skip }, async () => {
  const dir = makeModel({ preset: "small", out: tempDir() });
  const long = Array.from({ length: 1300 }, (_, i) => 100 + ((i * 7919) % 5000)), short = Array.from({ length: 30 }, (_, i) => 900 + i * 53);
  const run = async (device: "cpu" | "cuda"): Promise<{ alone: Float32Array; paired: Float32Array }> => {
    const kv = device === "cuda" ? "bfloat16" : "float32";
    const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 200, blockSize: BLOCK, dtype: kv }, kv, device);
    await runner.execute([{ ...prefill(long, 1), allLogits: false }, { ...prefill(short, 190), allLogits: false }]);
    const alone = (await runner.execute([decode(long, 1)])).logits![0]!;
    const paired = (await runner.execute([decode(short, 190), decode(long, 1)])).logits![1]!;
    await runner.dispose();
    return { alone, paired };
  };
  const gpu = await run("cuda"), cpu = await run("cpu");
  const scale = cpu.alone.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
  const diff = maxAbsDiff(gpu.alone, cpu.alone);
  console.log(`cuda: a decode row at 1,300 keys (3 chunks): max |Δlogit| against the CPU's float32 ${diff.toExponential(3)} (logit scale ${scale.toFixed(3)})`);
  assert.equal(maxAbsDiff(gpu.alone, gpu.paired), 0, "a split row must give the same bits beside another row");
  assert.ok(diff / scale < 2e-2, `the split row differs from float32 attention by ${diff}`);
});

test("--device: auto picks cuda exactly when a GPU is visible; cuda computes in bfloat16; the device shows on /v1/models and in the log", async () => {
  assert.equal(resolveDevice("auto"), gpus.length > 0 ? "cuda" : "cpu");
  assert.equal(resolveDevice("cpu"), "cpu");
  if (gpus.length === 0) assert.throws(() => resolveDevice("cuda"), /--device cuda/);
  assert.equal(resolveDtype("auto", "cuda"), "bfloat16");
  assert.throws(() => resolveDtype("float32", "cuda"), /not available on CUDA/);
  const device = gpus.length > 0 ? "cuda" : "cpu";
  const s = await startServer({ engine: { device: "auto", dtype: "bfloat16" } });
  try {
    const card = async (): Promise<{ device: string; dtype: string; status: string }> =>
      ((await (await fetch(`${s.url}/v1/models`)).json()) as { data: { device: string; dtype: string; status: string }[] }).data[0]!;
    assert.equal((await card()).device, device);
    await s.manager.acquire("tiny", "test");
    assert.deepEqual(await card(), { ...(await card()), status: "ready", device, dtype: "bfloat16" });
    assert.ok(s.logs.some((l) => l.includes(device === "cuda" ? "device cuda (" : "device cpu")), "the start-up log names the device");
  } finally {
    await s.close();
  }
});

// Multi-step decode (NativeStepInput.decodeSteps): rows all sampled on the GPU run every step there,
// each fed the tokens the step before sampled on the device (decodeOnDevice); a row asking for
// log-probs takes the step-by-step path through the CPU sampler. Either way, the tokens and log-probs
// of single steps.
test("cuda: decode steps run back to back (on the GPU, or step by step) give the tokens and log-probs of single steps", { skip }, async () => {
  const dir = makeModel({ preset: "small", out: tempDir() });
  const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 64, blockSize: BLOCK, dtype: "bfloat16" }, "bfloat16", "cuda");
  const prompts = [promptA, promptB];
  const table = (i: number): number[] => Array.from({ length: 8 }, (_, b) => 1 + 8 * i + b);
  const generate = async (logprobs: number, k: number): Promise<{ tokenId: number; logprob: number }[][]> => {
    const params = defaultSamplingParams({ temperature: 0, maxTokens: 64, logprobs });
    const sample = (p: number[], outputs: number[]) => ({ params, counter: outputs.length, promptIds: p, outputIds: outputs });
    const first = await runner.execute(prompts.map((p, i) => ({ tokenIds: p, startPosition: 0, blockTable: table(i), sample: sample(p, []) })));
    const out = first.samples.map((s) => [s!]);
    while (out[0]!.length < 22) {
      const seqs = out.map((o, i) => {
        const ids = o.map((s) => s.tokenId);
        return { tokenIds: [ids[ids.length - 1]!], startPosition: prompts[i]!.length + ids.length - 1, blockTable: table(i), sample: sample(prompts[i]!, ids) };
      });
      const r = await runner.execute(seqs, k);
      for (const step of [r, ...(r.following ?? [])]) step.samples.forEach((s, i) => out[i]!.push(s!));
    }
    return out.map((o) => o.map((s) => ({ tokenId: s.tokenId, logprob: s.logprob })));
  };
  for (const logprobs of [0, 2]) assert.deepEqual(await generate(logprobs, 7), await generate(logprobs, 1), `logprobs ${logprobs}`);
  await runner.dispose();
});
