/**
 * Quantized kernels: GGUF Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K weights served as they
 * are, on data and files made by llama.cpp's own quantizer (ggml_quantize_chunk
 * and llama_model_quantize from node-llama-cpp's prebuilt libraries, through
 * test/support/ggml.ts).
 *
 * The matmul is probed through a real model: one layer whose matrices are zero,
 * so the logits are exactly output.weight · rmsnorm(embedding row), with the
 * matrix under test as output.weight and test activations as embedding rows.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { GGML_TYPES, type GgmlType } from "../src/model/gguf.js";
import { dequantize } from "../src/model/gguf-dequant.js";
import { exportGguf, writeGguf, ALIGN, type Meta } from "../src/model/gguf-export.js";
import { makeModel } from "../src/model/make-model.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { loadNative } from "../src/runtime/native.js";
import { tempDir } from "./helpers.js";
import { nativeRmsnorm } from "./support/native-rmsnorm.js";
import { ggmlQuantize, llamaModelQuantize } from "./support/ggml.js";

const here = path.dirname(fileURLToPath(import.meta.url));

/** Deterministic gaussian-ish values with a few outliers, as weights and activations have. */
function gaussian(n: number, seed: number, scale = 1): Float32Array {
  let s = seed >>> 0;
  const rand = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  return new Float32Array(n).map(() => Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand()) * scale * (rand() < 0.01 ? 8 : 1));
}

// probe: hidden K, vocabulary = output rows = test activation rows; 42 leaves a partial
// panel of output columns and a partial tile of activation rows in every kernel set.
const K = 512, ROWS = 42;
const RMS_EPS = Math.fround(1e-6);
const QUANT_TYPES: GgmlType[] = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"];

/** A one-layer llama GGUF whose logits are `weights` (ROWS × K, quantized as `type`) · rmsnorm(embedding row). */
function probeGguf(type: GgmlType, weights: Uint8Array, embed: Float32Array): string {
  const file = path.join(tempDir("weft-probe-"), `probe-${type}.gguf`);
  const f32 = (a: Float32Array): (() => Uint8Array) => () => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const zeros = (rows: number, cols: number) => ({ type: "F32" as const, shape: [rows, cols], data: f32(new Float32Array(rows * cols)) });
  const ones = { type: "F32" as const, shape: [K], data: f32(new Float32Array(K).fill(1)) };
  const inter = 256;
  const meta: Meta[] = [["general.alignment", "u32", ALIGN], ["general.architecture", "str", "llama"], ["llama.embedding_length", "u32", K],
    ["llama.attention.head_count", "u32", 8], ["llama.attention.head_count_kv", "u32", 8], ["llama.feed_forward_length", "u32", inter],
    ["llama.block_count", "u32", 1], ["llama.context_length", "u32", 256], ["llama.rope.freq_base", "f32", 10000],
    ["llama.attention.layer_norm_rms_epsilon", "f32", RMS_EPS], ["tokenizer.ggml.eos_token_id", "u32", 0]];
  writeGguf(file, meta, [
    { name: "token_embd.weight", type: "F32", shape: [ROWS, K], data: f32(embed) },
    { name: "output_norm.weight", ...ones },
    { name: "output.weight", type, shape: [ROWS, K], data: () => weights },
    { name: "blk.0.attn_norm.weight", ...ones }, { name: "blk.0.ffn_norm.weight", ...ones },
    ...["attn_q", "attn_k", "attn_v", "attn_output"].map((n) => ({ name: `blk.0.${n}.weight`, ...zeros(K, K) })),
    { name: "blk.0.ffn_gate.weight", ...zeros(inter, K) }, { name: "blk.0.ffn_up.weight", ...zeros(inter, K) },
    { name: "blk.0.ffn_down.weight", ...zeros(K, inter) },
  ]);
  return file;
}

/**
 * Activations quantized to int8 as the kernels do, one scale per `run` inputs (a weight block's
 * worth: 32, or the K-quants' 256): returns x̂ = d·q and each element's scale d.
 */
function quantizeActs(x: Float32Array, run: number): { xq: Float64Array; d: Float64Array } {
  const fr = Math.fround, xq = new Float64Array(x.length), d = new Float64Array(x.length);
  const roundEven = (v: number): number => { const r = Math.round(v); return r - v === 0.5 && r % 2 !== 0 ? r - 1 : r; };
  for (let b = 0; b < x.length; b += run) {
    let amax = 0;
    for (let i = b; i < b + run; i++) amax = Math.max(amax, Math.abs(x[i]!));
    const s = fr(amax / 127), id = s !== 0 ? fr(1 / s) : 0;
    for (let i = b; i < b + run; i++) {
      xq[i] = s * Math.max(-127, Math.min(127, roundEven(fr(x[i]! * id))));
      d[i] = s;
    }
  }
  return { xq, d };
}

/** Logits of each token alone (one sequence each, one step), or all ROWS tokens as one batch of single-token sequences. */
async function probeLogits(file: string, tokens: number[], batched: boolean): Promise<Float32Array[]> {
  const runner = await ModelRunner.create(loadCheckpoint(file), { numBlocks: 64, blockSize: 16 });
  try {
    const req = (t: number, i: number) => ({ tokenIds: [t], startPosition: 0, blockTable: [i], sample: null, allLogits: true });
    if (batched) return (await runner.execute(tokens.map(req))).logits!.map((l) => l!);
    const out: Float32Array[] = [];
    for (const t of tokens) out.push((await runner.execute([req(t, 0)])).logits![0]!);
    return out;
  } finally {
    await runner.dispose();
  }
}

/**
 * The kernel sets to force, by reduction order: the VNNI panels' (the AVX-512 sets where the CPU
 * has AVX512-VNNI, and amx where it has AMX) and quant.h's lanes (AVX2, scalar). Each order's sets
 * give the same bits.
 */
function orderSets(): { panels: string[]; lanes: string[] } {
  const f = loadNative().cpuFeatures();
  const vnni = f.avx512vnni ? (f.avx512bf16 ? "avx512bf16" : "avx512") : null;  // avx512vnni implies AVX-512
  if (!vnni) console.log("NOTICE: no AVX512-VNNI on this CPU: the VNNI panel path is not tested");
  if (!f.amx) console.log("NOTICE: no AMX on this CPU: the AMX-INT8 path is not tested");
  if (!f.avx2) console.log("NOTICE: no AVX2 on this CPU: the AVX2 path is not tested");
  return {
    panels: [vnni, f.amx ? "amx" : null].filter((x): x is string => x !== null),
    lanes: [f.avx2 ? "avx2" : null, "scalar"].filter((x): x is string => x !== null),
  };
}

/** How many tokens a forced set also runs one step each: every set's few-row path (it reads some types in place) against its batched one. */
const ALONE_IN_CHILD = 3;

/**
 * The probe's logits with WEFT_ISA forced, in a child process (the set is chosen once per process):
 * all tokens as one batch, and the first ALONE_IN_CHILD tokens each alone.
 */
function probeInChild(file: string, isa: string): { batched: Float32Array[]; alone: Float32Array[] } {
  const code = `
    import { loadCheckpoint } from ${JSON.stringify(path.join(here, "..", "src", "model", "checkpoint.js"))};
    import { ModelRunner } from ${JSON.stringify(path.join(here, "..", "src", "runtime", "model-runner.js"))};
    const r = await ModelRunner.create(loadCheckpoint(${JSON.stringify(file)}), { numBlocks: 64, blockSize: 16 });
    const req = (t, i) => ({ tokenIds: [t], startPosition: 0, blockTable: [i], sample: null, allLogits: true });
    const b64 = (l) => Buffer.from(l.buffer, l.byteOffset, l.byteLength).toString("base64");
    const batched = (await r.execute(Array.from({ length: ${ROWS} }, (_, i) => req(i, i)))).logits.map(b64);
    const alone = [];
    for (let t = 0; t < ${ALONE_IN_CHILD}; t++) alone.push(b64((await r.execute([req(t, 0)])).logits[0]));
    await r.dispose();
    process.stdout.write(JSON.stringify({ batched, alone }));`;
  const json = execFileSync(process.execPath, ["--input-type=module", "-e", code], { env: { ...process.env, WEFT_ISA: isa }, encoding: "utf8", maxBuffer: 1 << 26 });
  const out = JSON.parse(json) as { batched: string[]; alone: string[] };
  const floats = (b: string) => new Float32Array(new Uint8Array(Buffer.from(b, "base64")).buffer);
  return { batched: out.batched.map(floats), alone: out.alone.map(floats) };
}

for (const [k, type] of QUANT_TYPES.entries()) {
  test(`matmul ${type}: llama.cpp-quantized weights against dequantize + fp64 dot, every kernel set, batch-invariant`, async () => {
    const w = gaussian(ROWS * K, 101 + k, 0.05);
    const qw = ggmlQuantize(type, w, K);
    const wd = dequantize(type, qw, ROWS * K);  // bit-exact with llama.cpp (test/gguf.test.ts)
    const embed = gaussian(ROWS * K, 7 + k);
    const file = probeGguf(type, qw, embed);
    const tokens = Array.from({ length: ROWS }, (_, i) => i);
    const alone = await probeLogits(file, tokens, false);
    const batched = await probeLogits(file, tokens, true);
    for (const t of tokens) assert.ok(alone[t]!.every((v, i) => Object.is(v, batched[t]![i])), `${type}: token ${t} differs alone and in a batch of ${ROWS}`);
    // Steps of 3 and 10 rows: the lane kernel's passes of eight rows, 10 with Q6_K panels widened per call (the amx set's below tileRowsFrom).
    for (const n of [3, 10]) {
      const few = await probeLogits(file, tokens.slice(0, n), true);
      few.forEach((l, t) => assert.ok(l.every((v, i) => Object.is(v, alone[t]![i])), `${type}: token ${t} differs alone and in a batch of ${n}`));
    }

    checkAgainstFp64(type, `${loadNative().isa()} (in use)`, alone, wd, embed, tokens);

    // Every set forced in turn: batch-invariant, within the bounds, and the same bits as the other
    // sets of its order.
    const orders = orderSets();
    for (const sets of [orders.panels, orders.lanes]) {
      const runs = sets.map((isa) => {
        const { batched: got, alone: gotAlone } = probeInChild(file, isa);
        gotAlone.forEach((l, t) => assert.ok(l.every((v, j) => Object.is(v, got[t]![j])), `${type}: WEFT_ISA=${isa}: token ${t} differs alone and in a batch of ${ROWS}`));
        checkAgainstFp64(type, isa, got, wd, embed, tokens);
        return got;
      });
      runs.forEach((got, i) => {
        for (const t of tokens) assert.ok(got[t]!.every((v, j) => Object.is(v, runs[0]![t]![j])), `${type}: WEFT_ISA=${sets[i]} differs from ${sets[0]} on token ${t}`);
      });
      if (sets.includes(loadNative().isa()))
        for (const t of tokens) assert.ok(runs[0]![t]!.every((v, j) => Object.is(v, batched[t]![j])), `${type}: the set in use differs from ${sets[0]} on token ${t}`);
    }
  });
}

/**
 * Each logit against the dequantized weights in fp64: within a few fp32 ulps of Σ|w·x̂| of
 * the int8 activations' exact product, and within the activation-rounding bound of the exact one.
 */
function checkAgainstFp64(type: GgmlType, set: string, logits: Float32Array[], wd: Float32Array, embed: Float32Array, tokens: number[]): void {
  let worstTight = 0, worstBound = 0;
  for (const t of tokens) {
    const xn = nativeRmsnorm(embed.subarray(t * K, (t + 1) * K), RMS_EPS);
    const { xq, d } = quantizeActs(xn, GGML_TYPES[type].blockSize);
    for (let n = 0; n < ROWS; n++) {
      let withActQuant = 0, exact = 0, mag = 0, bound = 0;
      for (let i = 0; i < K; i++) {
        const wi = wd[n * K + i]!;
        withActQuant += wi * xq[i]!;
        exact += wi * xn[i]!;
        mag += Math.abs(wi * xq[i]!);
        bound += (Math.abs(wi) * d[i]!) / 2;  // |x - x̂| ≤ d/2 per element
      }
      const got = logits[t]![n]!;
      // The kernel computes x̂·w exactly in integers, then scales and sums in fp32: a few ulps of Σ|w·x̂|.
      worstTight = Math.max(worstTight, Math.abs(got - withActQuant) / (1e-5 * mag + 1e-30));
      // Against the unquantized activations: the rounding of x to int8 bounds the error.
      worstBound = Math.max(worstBound, Math.abs(got - exact) / (bound * 1.01 + 1e-5 * mag));
    }
  }
  console.log(`NOTICE: ${type} ${set}: worst error ${worstTight.toFixed(3)} of the fp32 tolerance, ${worstBound.toFixed(3)} of the activation-quantization bound`);
  assert.ok(worstTight <= 1, `${type} ${set}: ${worstTight.toFixed(3)} of the fp32 tolerance against int8 activations · dequantized weights`);
  assert.ok(worstBound <= 1, `${type} ${set}: ${worstBound.toFixed(3)} of the activation-quantization bound against fp64`);
}

// ---- end to end: llama.cpp-quantized files of a Qwen3 shape, served ----

let f16File: string | undefined;
/** The "small" preset (hidden 256: every row a whole number of K-quant blocks) as an F16 GGUF. */
function smallF16(): string {
  if (!f16File) {
    const dir = tempDir("weft-quant-e2e-");
    const model = makeModel({ preset: "small", out: path.join(dir, "model"), seed: 3 });
    f16File = path.join(dir, "small-f16.gguf");
    exportGguf(model, f16File, "f16");
  }
  return f16File;
}

function llamaQuantize(ftype: "q8_0" | "q4_k_m"): string {
  const out = smallF16().replace(/-f16\.gguf$/, `-${ftype}.gguf`);
  if (!fs.existsSync(out)) llamaModelQuantize(smallF16(), out, ftype);
  return out;
}

async function promptLogits(file: string, ids: number[]): Promise<Float32Array> {
  const runner = await ModelRunner.create(loadCheckpoint(file), { numBlocks: 8, blockSize: 16 });
  try {
    return (await runner.execute([{ tokenIds: ids, startPosition: 0, blockTable: [3, 1], sample: null, allLogits: true }])).logits![0]!;
  } finally {
    await runner.dispose();
  }
}

for (const ftype of ["q8_0", "q4_k_m"] as const) {
  test(`e2e ${ftype}: llama_model_quantize's file loads quantized, tracks the F16 file's logits, and is served with greedy text`, async () => {
    const file = llamaQuantize(ftype);
    const ck = loadCheckpoint(file);
    const dtypes = new Set([ck.weights.lmHead, ...ck.weights.layers.flatMap((l) => [l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down])].map((t) => t.dtype));
    if (ftype === "q8_0") assert.deepEqual([...dtypes], ["q8_0"]);
    else assert.ok([...dtypes].every((d) => ["q4_k", "q5_k", "q6_k"].includes(d)) && ck.weights.lmHead.dtype === "q6_k", [...dtypes].join());

    const ids = [785, 3681, 315, 9625, 374, 12095, 11, 323, 1181, 6722, 374, 279, 1429];
    const [ref, got] = [await promptLogits(smallF16(), ids), await promptLogits(file, ids)];
    const V = ref.length / ids.length;
    let agree = 0, worst = 0;
    for (let t = 0; t < ids.length; t++) {
      const row = (a: Float32Array) => a.subarray(t * V, (t + 1) * V);
      const [r, g] = [row(ref), row(got)];
      const argmax = (a: Float32Array) => a.reduce((m, v, i) => (v > a[m]! ? i : m), 0);
      agree += argmax(r) === argmax(g) ? 1 : 0;
      const rms = (f: (v: number, i: number) => number) => Math.sqrt(r.reduce((s, v, i) => s + f(v, i) ** 2, 0) / V);
      worst = Math.max(worst, rms((v, i) => v - g[i]!) / rms((v) => v));
    }
    console.log(`NOTICE: ${ftype} vs F16: argmax agrees at ${agree}/${ids.length} positions; RMS(Δlogit) ≤ ${worst.toFixed(4)} × RMS(logit)`);
    // Measured on this random-weight model: 0.019 (Q8_0) and 0.148 (Q4_K_M); the bounds leave room for
    // other CPUs' kernel sets while still refusing a matmul that is off by more than quantization noise.
    assert.ok(worst < (ftype === "q8_0" ? 0.05 : 0.3), `${ftype}: logits moved ${worst} × their RMS from F16's`);

    const { startServer, greedyCompletion } = await import("./support/server.js");
    const s = await startServer({ models: { q: file } });
    try {
      const ask = (): ReturnType<typeof greedyCompletion> => greedyCompletion(s.url, "q", 12);
      const a = await ask(), b = await ask();
      assert.equal(a.tokens, 12);
      assert.ok(a.text.length > 0);
      assert.deepEqual(b, a, "greedy text is reproducible");
    } finally {
      await s.close();
    }
  });
}
