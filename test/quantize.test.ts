/**
 * `weft quantize`: the blocks it writes are the ones llama.cpp reads (ggml's own
 * to_float gives our dequantizer's bits), their error is no worse than
 * ggml_quantize_chunk's, the tensor types follow llama_model_quantize's recipes,
 * and llama.cpp (node-llama-cpp) loads and runs the files with Weft's log-probs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { Llama, Token } from "node-llama-cpp";
import { readGguf, type GgmlType } from "../src/model/gguf.js";
import { dequantize } from "../src/model/gguf-dequant.js";
import { exportGguf } from "../src/model/gguf-export.js";
import { QUANT_RECIPES, quantizeModel, type QuantRecipe } from "../src/model/gguf-quantize.js";
import { makeModel } from "../src/model/make-model.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { CheckpointError } from "../src/model/errors.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { loadNative, type QuantizeType } from "../src/runtime/native.js";
import { ggmlQuantize, ggmlToFloat, llamaModelQuantize } from "./support/ggml.js";
import { tempDir } from "./helpers.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const TYPES: GgmlType[] = ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"];

/** Rows of gaussian values at several scales (1e-3 to 10), one all-zero row, one all-positive row, 1 % outliers ×20. */
function testValues(rows: number, perRow: number, seed: number): Float32Array {
  const x = new Float32Array(rows * perRow);
  let s = seed >>> 0;
  const rand = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  for (let r = 0; r < rows; r++) {
    const scale = r === 1 ? 0 : 10 ** ((r % 5) - 3);
    for (let i = 0; i < perRow; i++) {
      const g = Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand());
      x[r * perRow + i] = (r === 2 ? Math.abs(g) : g) * scale * (rand() < 0.01 ? 20 : 1);
    }
  }
  return x;
}

/** Mean over rows of RMS(x − y) / RMS(x) (rows of zeros left out). */
function relRms(x: Float32Array, y: Float32Array, perRow: number): number {
  let sum = 0, n = 0;
  for (let r = 0; r < x.length / perRow; r++) {
    let e = 0, m = 0;
    for (let i = r * perRow; i < (r + 1) * perRow; i++) {
      e += (x[i]! - y[i]!) ** 2;
      m += x[i]! ** 2;
    }
    if (m > 0) {
      sum += Math.sqrt(e / m);
      n++;
    }
  }
  return sum / n;
}

test("blocks: ggml's to_float reads weft's blocks bit for bit as weft's dequantizer does; the error is no worse than ggml_quantize_chunk's", () => {
  const perRow = 1024, rows = 40;
  for (const [k, type] of TYPES.entries()) {
    const x = testValues(rows, perRow, 31 + k);
    const ours = loadNative().quantizeWeights(type.toLowerCase() as QuantizeType, x, perRow);
    const mine = dequantize(type, ours, x.length);
    const theirs = ggmlToFloat(type, ours, x.length);
    const bad = new Uint32Array(mine.buffer).findIndex((v, i) => v !== new Uint32Array(theirs.buffer)[i]);
    assert.equal(bad, -1, `${type}: element ${bad} read differently by ggml's to_float`);
    assert.ok(mine.subarray(perRow, 2 * perRow).every((v) => v === 0), `${type}: a row of zeros stays zero`);
    const errOurs = relRms(x, mine, perRow);
    const errGgml = relRms(x, dequantize(type, ggmlQuantize(type, x, perRow), x.length), perRow);
    console.log(`NOTICE: ${type}: RMS error / RMS(x) ${errOurs.toFixed(5)} (weft) vs ${errGgml.toFixed(5)} (ggml_quantize_chunk)`);
    assert.ok(errOurs <= errGgml * 1.001, `${type}: error ${errOurs} above ggml's ${errGgml}`);
  }
});

test("blocks: a row that is not whole blocks, and a non-finite value, are refused clearly", () => {
  assert.throws(() => loadNative().quantizeWeights("q4_k", new Float32Array(128), 128), /row length 128 is not a multiple of the block size 256/);
  const x = new Float32Array(64);
  x[37] = NaN;
  assert.throws(() => loadNative().quantizeWeights("q8_0", x, 32), /value 5 of row 1 is not finite/);
});

// ---- whole files ----

let checkpoints: Map<string, string> | undefined;
/** small-llama (untied output, llama's permuted q/k) and small (Qwen3, tied embeddings): hidden 256, whole K-quant blocks. */
function checkpoint(preset: "small-llama" | "small"): string {
  checkpoints ??= new Map();
  let dir = checkpoints.get(preset);
  if (!dir) {
    dir = makeModel({ preset, out: path.join(tempDir("weft-quantize-"), preset), seed: 5 });
    checkpoints.set(preset, dir);
  }
  return dir;
}

const files = new Map<string, string>();
function quantized(preset: "small-llama" | "small", recipe: QuantRecipe): string {
  const key = `${preset}-${recipe}`;
  let file = files.get(key);
  if (!file) {
    file = path.join(path.dirname(checkpoint(preset)), `${key}.gguf`);
    quantizeModel(checkpoint(preset), file, recipe);
    files.set(key, file);
  }
  return file;
}

function tensorTypes(file: string): Map<string, GgmlType> {
  return new Map([...readGguf(file).tensors.values()].map((t) => [t.name, t.type]));
}

test("recipe: every tensor gets the type llama_model_quantize gives it (each file type; Q4_K_M with tied embeddings)", () => {
  for (const preset of ["small-llama", "small"] as const) {
    const f16 = path.join(path.dirname(checkpoint(preset)), `${preset}-f16.gguf`);
    exportGguf(checkpoint(preset), f16, "f16");
    for (const recipe of preset === "small" ? (["q4_k_m"] as const) : QUANT_RECIPES) {
      const theirs = path.join(path.dirname(f16), `${preset}-${recipe}-llama.gguf`);
      llamaModelQuantize(f16, theirs, recipe);
      const want = tensorTypes(theirs), got = tensorTypes(quantized(preset, recipe));
      assert.deepEqual(Object.fromEntries(got), Object.fromEntries(want), `${preset} ${recipe}`);
      const meta = readGguf(quantized(preset, recipe)).metadata, theirMeta = readGguf(theirs).metadata;
      for (const k of ["general.file_type", "general.quantization_version"]) assert.equal(meta.get(k), theirMeta.get(k), `${preset} ${recipe}: ${k}`);
    }
  }
});

let llama: Llama | undefined;
/** llama.cpp's log-probs of the next token at every position of `ids`, over the whole vocabulary (indexed by token). */
async function llamaCppLogprobs(file: string, ids: number[]): Promise<Float64Array[]> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  llama ??= await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const ctx = await model.createContext({ contextSize: 64, sequences: 1, threads: Math.min(4, os.cpus().length) });
  try {
    const items = ids.map((t) => [t as Token, { generateNext: { probabilities: true, options: { temperature: 0 } } }] as const);
    const out = await ctx.getSequence().controlledEvaluate(items as unknown as Parameters<ReturnType<typeof ctx.getSequence>["controlledEvaluate"]>[0]);
    return out.map((o) => {
      const p = o!.next!.probabilities!, row = new Float64Array(p.size).fill(NaN);
      for (const [t, v] of p) row[t] = Math.log(v);
      return row;
    });
  } finally {
    await ctx.dispose();
    await model.dispose();
  }
}

/** Weft's log-probs at every position of `ids` on the same file. */
async function weftLogprobs(file: string, ids: number[]): Promise<Float64Array[]> {
  const runner = await ModelRunner.create(loadCheckpoint(file), { numBlocks: 8, blockSize: 16 });
  try {
    const logits = (await runner.execute([{ tokenIds: ids, startPosition: 0, blockTable: [0, 1], sample: null, allLogits: true }])).logits![0]!;
    const V = logits.length / ids.length;
    return ids.map((_, t) => {
      const row = logits.subarray(t * V, (t + 1) * V);
      const max = row.reduce((m, v) => Math.max(m, v), -Infinity);
      const lse = max + Math.log(row.reduce((s, v) => s + Math.exp(v - max), 0));
      return Float64Array.from(row, (v) => v - lse);
    });
  } finally {
    await runner.dispose();
  }
}

/** The k most likely [token, log-prob] of a row, best first (one pass: rows hold a whole vocabulary). */
function topK(row: Float64Array, k: number): [number, number][] {
  const best: [number, number][] = [];
  for (let id = 0; id < row.length; id++) {
    const v = row[id]!;
    if (best.length === k && v <= best[k - 1]![1]) continue;
    let i = best.length;
    while (i > 0 && best[i - 1]![1] < v) i--;
    best.splice(i, 0, [id, v]);
    if (best.length > k) best.pop();
  }
  return best;
}

/** Largest |Δ log-prob| over the reference's top-k tokens at every position. */
function topKGap(ref: Float64Array[], got: (t: number, id: number) => number, k = 10): number {
  let worst = 0;
  ref.forEach((row, t) => {
    for (const [id, lp] of topK(row, k)) worst = Math.max(worst, Math.abs(got(t, id) - lp));
  });
  return worst;
}

const PROMPTS = { "small-llama": [1, 450, 4955, 310, 278, 3303, 338, 263, 1407, 29892, 322, 278, 6221, 310], small: [785, 3681, 315, 9625, 374, 12095, 11, 323] };

/** Every type on the Llama shape; on the Qwen3 shape (tied embeddings: token_embd is the Q6_K output) the two common ones. */
const ROUND_TRIPS = { "small-llama": QUANT_RECIPES, small: ["q8_0", "q4_k_m"] } as const;

for (const preset of ["small-llama", "small"] as const) {
  test(`round trip ${preset}: llama.cpp loads and runs the files weft quantize writes, with Weft's log-probs on the same file`, async () => {
    const ids = PROMPTS[preset];
    const f16 = path.join(path.dirname(checkpoint(preset)), `${preset}-yardstick-f16.gguf`);
    exportGguf(checkpoint(preset), f16, "f16");
    const llamaF16 = await llamaCppLogprobs(f16, ids);
    // The yardstick: how far llama.cpp itself moves between the F16 file and the Q8_0 file.
    const q8 = await llamaCppLogprobs(quantized(preset, "q8_0"), ids);
    const yardstick = topKGap(llamaF16, (t, id) => q8[t]![id]!);
    for (const recipe of ROUND_TRIPS[preset]) {
      const file = quantized(preset, recipe);
      const [ref, ours] = [await llamaCppLogprobs(file, ids), await weftLogprobs(file, ids)];
      assert.ok(ref.every((r) => r.length === ours[0]!.length && !r.some(Number.isNaN)), "llama.cpp gave the whole vocabulary");
      const gap = topKGap(ref, (t, id) => ours[t]![id]!);
      // Each engine rounds the activations to 8 bits (llama.cpp: q8_0 / q8_K blocks; Weft: int8 per
      // 32), an error of the order of Q8_0's rounding of the weights. Two such independent errors
      // move the log-probs by about √2 × the yardstick; the bound is 2 ×.
      console.log(`NOTICE: ${preset} ${recipe}: Weft vs llama.cpp on the file: max |Δ log-prob| ${gap.toFixed(4)} over llama.cpp's top-10 at ${ids.length} positions; yardstick (llama.cpp F16 → Q8_0) ${yardstick.toFixed(4)}`);
      assert.ok(gap <= 2 * yardstick, `${preset} ${recipe}: ${gap} > 2 × ${yardstick}`);
      // Greedy tokens agree wherever llama.cpp's top two are further apart than the measured gap allows.
      ref.forEach((row, t) => {
        const [first, second] = topK(row, 2);
        const mine = ours[t]!.reduce((m, v, i, a) => (v > a[m]! ? i : m), 0);
        if (first![1] - second![1] > 2 * gap) assert.equal(mine, first![0], `${preset} ${recipe}: argmax at position ${t}`);
      });
    }
  });
}

test("GGUF input: a float GGUF quantizes to the same tensors as its checkpoint directory; a quantized one is refused", () => {
  const dir = checkpoint("small-llama");
  const bf16 = path.join(path.dirname(dir), "from-gguf-bf16.gguf");
  exportGguf(dir, bf16, "bf16");
  const out = path.join(path.dirname(dir), "from-gguf-q4_k_m.gguf");
  quantizeModel(bf16, out, "q4_k_m");
  const [a, b] = [readGguf(out), readGguf(quantized("small-llama", "q4_k_m"))];
  assert.deepEqual([...a.tensors.keys()], [...b.tensors.keys()]);
  const bytes = (f: string) => fs.readFileSync(f);
  const [da, db] = [bytes(out), bytes(quantized("small-llama", "q4_k_m"))];
  for (const [name, t] of a.tensors) {
    const u = b.tensors.get(name)!;
    assert.equal(t.type, u.type, name);
    assert.ok(da.subarray(t.offset, t.offset + t.byteLength).equals(db.subarray(u.offset, u.offset + u.byteLength)), `${name}: data differs`);
  }
  for (const [k, v] of b.metadata) if (k !== "general.name") assert.deepEqual(a.metadata.get(k), v, k);
  assert.throws(() => quantizeModel(out, path.join(path.dirname(dir), "twice.gguf"), "q8_0"),
    (e: unknown) => e instanceof CheckpointError && /\(tensor token_embd\.weight\): is already Q4_K: weft quantize takes float/.test(e.message));
});

test("cli: make-model --quant writes a quantized GGUF of a preset with no checkpoint left behind; quantize checks its arguments", () => {
  const dir = tempDir("weft-make-quant-");
  const cli = path.join(here, "..", "src", "cli.js");
  const out = execFileSync(process.execPath, [cli, "make-model", "--preset", "tiny-llama", "--quant", "q4_0", "--out", path.join(dir, "t.gguf")], { encoding: "utf8" });
  assert.match(out, /wrote tiny-llama \(random weights, q4_0\)/);
  assert.deepEqual(fs.readdirSync(dir), ["t.gguf"]);
  const types = new Set(tensorTypes(path.join(dir, "t.gguf")).values());
  // hidden 64: the output matrix's rows are not whole Q6_K blocks, so it falls back to Q8_0 as llama.cpp's does.
  assert.deepEqual([...types].sort(), ["F32", "Q4_0", "Q8_0"]);
  const bad = (args: string[]) => {
    try {
      execFileSync(process.execPath, [cli, ...args], { encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
    } catch (e) {
      return String((e as { stderr: string }).stderr);
    }
    return assert.fail(`${args.join(" ")} succeeded`);
  };
  assert.match(bad(["quantize", "--model", dir, "--out", path.join(dir, "x.gguf"), "--type", "q3_k"]), /argument 'q3_k' is invalid. Allowed choices are q8_0, q4_0, q4_k_m, q5_k_m, q6_k/);
  assert.match(bad(["make-model", "--preset", "tiny", "--quant", "q8_0", "--out", dir]), /--out names the \.gguf file/);
});
