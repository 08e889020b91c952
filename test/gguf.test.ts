/**
 * GGUF files: the reader on exported and hand-made files (every metadata type,
 * corrupt and unsupported files), and dequantization bit-exact with llama.cpp's
 * own (ggml_quantize_chunk and to_float from node-llama-cpp's libggml-base,
 * driven by a small C program compiled here).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { readGguf, GGML_TYPES, type GgmlType } from "../src/model/gguf.js";
import { dequantize } from "../src/model/gguf-dequant.js";
import { exportGguf, writeGguf, ALIGN, type Meta } from "../src/model/gguf-export.js";
import { CheckpointError } from "../src/model/errors.js";
import { loadCheckpoint, type Checkpoint } from "../src/model/checkpoint.js";
import { ggufModelConfig } from "../src/model/gguf-model.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { ropeInvFreq, type RopeScaling } from "../src/runtime/rope.js";
import { completeFixtureModel, readReference, ROOT, tempDir } from "./helpers.js";

/** node-llama-cpp's prebuilt CPU binaries for this platform (libggml-base.so, libllama.so). */
export function llamaCppBins(): string {
  const require = createRequire(import.meta.url);
  const name = `${process.platform}-${process.arch}`;
  // The package exports only its entry point (dist/index.js); bins/ sits beside dist/.
  return path.join(path.dirname(require.resolve(`@node-llama-cpp/${name}`)), "..", "bins", name);
}

const GGML_REF_C = String.raw`
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
// ggml's struct ggml_type_traits (ggml.h); its name and block fields are checked against the exported getters.
struct traits { const char* name; int64_t blck; int64_t blck_interleave; size_t type_size; bool quantized;
  void (*to_float)(const void*, float*, int64_t); void (*from_float_ref)(const float*, void*, int64_t); };
static std::vector<char> slurp(const char* f) { FILE* p = fopen(f, "rb"); std::vector<char> b; char c[65536]; size_t n;
  while ((n = fread(c, 1, sizeof c, p)) > 0) b.insert(b.end(), c, c + n); fclose(p); return b; }
static void spill(const char* f, const void* d, size_t n) { FILE* p = fopen(f, "wb"); fwrite(d, 1, n, p); fclose(p); }
int main(int argc, char** argv) {
  void* lib = dlopen(argv[1], RTLD_NOW); if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  auto traitsOf = (const traits* (*)(int)) dlsym(lib, "ggml_get_type_traits");
  auto typeName = (const char* (*)(int)) dlsym(lib, "ggml_type_name");
  auto blck = (int64_t (*)(int)) dlsym(lib, "ggml_blck_size");
  auto quantize = (size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*)) dlsym(lib, "ggml_quantize_chunk");
  int type = atoi(argv[3]); const traits* t = traitsOf(type);
  if (strcmp(t->name, typeName(type)) != 0 || t->blck != blck(type)) { fprintf(stderr, "type_traits layout mismatch\n"); return 3; }
  if (!strcmp(argv[2], "info")) { printf("%s %lld %zu\n", t->name, (long long)t->blck, t->type_size); return 0; }
  std::vector<char> in = slurp(argv[5]);
  if (!strcmp(argv[2], "quantize")) {  // quantize LIB TYPE N_PER_ROW IN OUT
    int64_t per = atoll(argv[4]), rows = (int64_t)(in.size() / 4) / per;
    std::vector<char> out(rows * per / t->blck * t->type_size);
    size_t n = quantize(type, (const float*)in.data(), out.data(), 0, rows, per, nullptr);
    spill(argv[6], out.data(), n); return 0;
  }
  int64_t n = atoll(argv[4]); std::vector<float> out(n);  // dequant LIB TYPE N IN OUT
  t->to_float(in.data(), out.data(), n); spill(argv[6], out.data(), n * 4); return 0;
}
`;

let refBinary: string | undefined;
/** Runs the compiled helper against libggml-base. */
function ggmlRef(...args: string[]): string {
  if (!refBinary) {
    const dir = tempDir("weft-ggml-ref-");
    fs.writeFileSync(path.join(dir, "ref.cpp"), GGML_REF_C);
    refBinary = path.join(dir, "ggml-ref");
    execFileSync("g++", ["-O1", "-o", refBinary, path.join(dir, "ref.cpp"), "-ldl"]);
  }
  return execFileSync(refBinary, [path.join(llamaCppBins(), "libggml-base.so"), ...args], { encoding: "utf8" });
}

/** Deterministic test values: several magnitudes, signs, an all-zero row and outliers, as weights have. */
function testValues(rows: number, perRow: number, seed: number): Float32Array {
  const x = new Float32Array(rows * perRow);
  let s = seed >>> 0;
  const rand = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  for (let r = 0; r < rows; r++) {
    const scale = r === 1 ? 0 : 10 ** (r % 5 - 3);
    for (let i = 0; i < perRow; i++) {
      const g = Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand());
      x[r * perRow + i] = (r % 3 === 2 ? Math.abs(g) : g) * scale * (rand() < 0.01 ? 20 : 1);
    }
  }
  return x;
}

const QUANT_TYPES: GgmlType[] = ["Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"];

test("dequant: block shapes agree with ggml's type traits", () => {
  for (const type of [...QUANT_TYPES, "F16", "BF16", "F32"] as GgmlType[]) {
    const { id, blockSize, blockBytes } = GGML_TYPES[type];
    assert.equal(ggmlRef("info", String(id)).trim().toUpperCase(), `${type} ${blockSize} ${blockBytes}`);
  }
});

test("dequant: bit-exact with llama.cpp's to_float on data quantized by llama.cpp", () => {
  const dir = tempDir("weft-dequant-");
  const perRow = 512, rows = 12;
  for (const [k, type] of QUANT_TYPES.entries()) {
    const x = testValues(rows, perRow, 17 + k);
    const src = path.join(dir, `${type}.f32`), q = path.join(dir, `${type}.q`), ref = path.join(dir, `${type}.ref`);
    fs.writeFileSync(src, x);
    const id = String(GGML_TYPES[type].id);
    ggmlRef("quantize", id, String(perRow), src, q);
    const bytes = fs.readFileSync(q);
    assert.equal(bytes.length, (x.length / GGML_TYPES[type].blockSize) * GGML_TYPES[type].blockBytes, type);
    ggmlRef("dequant", id, String(x.length), q, ref);
    const want = new Uint32Array(new Uint8Array(fs.readFileSync(ref)).buffer);
    const got = new Uint32Array(dequantize(type, bytes, x.length).buffer);
    const bad = got.findIndex((v, i) => v !== want[i]);
    assert.equal(bad, -1, `${type}: element ${bad} differs`);
    // The data is a real quantization: close to the input, not trivially zero.
    const y = new Float32Array(got.buffer);
    const err = x.reduce((m, v, i) => Math.max(m, Math.abs(v - y[i]!)), 0), peak = x.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    assert.ok(err > 0 && err < 0.1 * peak, `${type}: max error ${err} of ${peak}`);
  }
});

test("dequant: F16 and BF16 widen exactly as ggml does (every bit pattern)", () => {
  const dir = tempDir("weft-dequant-");
  const all = new Uint16Array(65536).map((_, i) => i);
  for (const type of ["F16", "BF16"] as GgmlType[]) {
    const src = path.join(dir, `${type}.bin`), ref = path.join(dir, `${type}.ref`);
    fs.writeFileSync(src, all);
    ggmlRef("dequant", String(GGML_TYPES[type].id), "65536", src, ref);
    const want = new Uint32Array(new Uint8Array(fs.readFileSync(ref)).buffer);
    const got = new Uint32Array(dequantize(type, new Uint8Array(all.buffer), 65536).buffer);
    // ggml may quiet a NaN differently; every other pattern must match to the bit.
    const bad = got.findIndex((v, i) => v !== want[i] && !(Number.isNaN(new Float32Array(got.buffer)[i]) && Number.isNaN(new Float32Array(want.buffer)[i])));
    assert.equal(bad, -1, `${type}: pattern ${bad}`);
  }
});

// ---- the reader ----

function exportedQwen(): string {
  const out = path.join(tempDir("weft-gguf-"), "tiny-qwen3.gguf");
  exportGguf(completeFixtureModel("tiny-qwen3"), out, "bf16");
  return out;
}

test("reader: an exported checkpoint's header, metadata and tensor table", () => {
  const file = exportedQwen();
  const g = readGguf(file);
  assert.equal(g.version, 3);
  assert.equal(g.alignment, ALIGN);
  assert.equal(g.dataOffset % ALIGN, 0);
  assert.equal(g.metadata.get("general.architecture"), "qwen3");
  assert.equal(g.metadata.get("qwen3.block_count"), 2);
  assert.equal((g.metadata.get("tokenizer.ggml.tokens") as string[]).length, 151936);
  const embd = g.tensors.get("token_embd.weight")!;
  assert.deepEqual([embd.type, embd.shape, embd.byteLength], ["BF16", [151936, 48], 151936 * 48 * 2]);
  const norm = g.tensors.get("output_norm.weight")!;
  assert.deepEqual([norm.type, norm.shape], ["F32", [48]]);
  assert.equal(g.tensors.size, 2 + 2 * 11);
  // The data really is where the table says: the norm is the checkpoint's, widened to f32.
  const fd = fs.openSync(file, "r");
  const buf = Buffer.alloc(norm.byteLength);
  fs.readSync(fd, buf, 0, buf.length, norm.offset);
  fs.closeSync(fd);
  const values = new Float32Array(new Uint8Array(buf).buffer);
  assert.ok(values.every((v) => Number.isFinite(v)) && values.some((v) => v !== 0));
});

test("reader: every metadata value type, nested arrays and quantized tensor shapes", () => {
  const file = path.join(tempDir("weft-gguf-"), "types.gguf");
  const meta: Meta[] = [
    ["general.alignment", "u32", ALIGN], ["a.u8", "u8", 255], ["a.i8", "i8", -128], ["a.u16", "u16", 65535], ["a.i16", "i16", -32768],
    ["a.i32", "i32", -5], ["a.f32", "f32", 0.5], ["a.bool", "bool", true], ["a.str", "str", "héllo ✓"], ["a.u64", "u64", 2 ** 40],
    ["a.i64", "i64", -(2 ** 40)], ["a.f64", "f64", Math.PI], ["a.f32s", "f32s", [1.5, -2]], ["a.bools", "bools", [true, false]],
  ];
  const tensors = QUANT_TYPES.map((type, i) => ({
    name: `t${i}`, type, shape: [3, 256],
    data: () => new Uint8Array((3 * 256 / GGML_TYPES[type].blockSize) * GGML_TYPES[type].blockBytes),
  }));
  writeGguf(file, meta, tensors);
  const g = readGguf(file);
  assert.deepEqual([...g.metadata.entries()].map(([k, v]) => [k, v]),
    meta.map(([k, , v]) => [k, k === "a.f32s" ? [1.5, -2] : v]));
  for (const [i, type] of QUANT_TYPES.entries()) {
    const t = g.tensors.get(`t${i}`)!;
    assert.deepEqual([t.type, t.shape, t.byteLength], [type, [3, 256], (768 / GGML_TYPES[type].blockSize) * GGML_TYPES[type].blockBytes]);
  }
});

/** The byte offset of tensor `name`'s table entry fields (after its name) in a GGUF buffer. */
function entryAt(buf: Buffer, name: string): number {
  const key = Buffer.concat([Buffer.from(new BigUint64Array([BigInt(name.length)]).buffer), Buffer.from(name)]);
  const at = buf.indexOf(key);
  assert.ok(at > 0, `no table entry for ${name}`);
  return at + key.length;
}

function corrupt(file: string, edit: (buf: Buffer) => Buffer): string {
  const out = file.replace(/\.gguf$/, `-${Math.random().toString(36).slice(2)}.gguf`);
  fs.writeFileSync(out, edit(fs.readFileSync(file)));
  return out;
}

function assertRejects(file: string, pattern: RegExp): void {
  assert.throws(() => readGguf(file), (e: unknown) => e instanceof CheckpointError && pattern.test(e.message) ? true : assert.fail(String(e)));
}

test("reader: truncated, inconsistent and unsupported files are refused with the tensor named", () => {
  const file = exportedQwen();
  const size = fs.statSync(file).size;
  const g = readGguf(file);
  const cut = [...g.tensors.values()].sort((a, b) => a.offset - b.offset).find((t) => t.offset + t.byteLength > size - 100)!;
  assertRejects(corrupt(file, (b) => b.subarray(0, size - 100)), new RegExp(`\\(tensor ${cut.name.replaceAll(".", "\\.")}\\): truncated: data .* runs past the end of the file`));
  assertRejects(corrupt(file, (b) => b.subarray(0, 200)), /truncated: .* runs past the end of the file/);
  assertRejects(corrupt(file, (b) => Buffer.concat([Buffer.from("GGML"), b.subarray(4)])), /not a GGUF file/);
  assertRejects(corrupt(file, (b) => { b.writeUInt32LE(1, 4); return b; }), /GGUF version 1 is not supported/);
  // blk.0.attn_q.weight: dims [48, 48] (ggml order), then type, then offset.
  const q = "blk.0.attn_q.weight";
  assertRejects(corrupt(file, (b) => { b.writeUInt32LE(10, entryAt(b, q) + 4 + 16); return b; }), /\(tensor blk\.0\.attn_q\.weight\): tensor type Q2_K is not supported/);
  assertRejects(corrupt(file, (b) => { b.writeUInt32LE(99, entryAt(b, q) + 4 + 16); return b; }), /\(tensor blk\.0\.attn_q\.weight\): tensor type unknown type id 99/);
  assertRejects(corrupt(file, (b) => { b.writeBigUInt64LE(96n, entryAt(b, q) + 4 + 8); return b; }), /\(tensor blk\.0\.attn_q\.weight\): data overlaps|\(tensor .*\): data overlaps tensor blk\.0\.attn_q\.weight/);
  assertRejects(corrupt(file, (b) => { b.writeUInt32LE(12, entryAt(b, q) + 4 + 16); return b; }), /\(tensor blk\.0\.attn_q\.weight\): row length 48 is not a multiple of the Q4_K block size 256/);
  assertRejects(corrupt(file, (b) => { b.writeBigUInt64LE(BigInt(size * 4), entryAt(b, q) + 4 + 16 + 4); return b; }), /\(tensor blk\.0\.attn_q\.weight\): .*alignment|\(tensor blk\.0\.attn_q\.weight\): truncated/);
  assertRejects(corrupt(file, (b) => { b.writeUInt32LE(7, entryAt(b, q)); return b; }), /\(tensor blk\.0\.attn_q\.weight\): 7 dimensions/);
});

// ---- GGUF → model ----

async function allLogits(ck: Checkpoint, ids: number[]): Promise<Float32Array> {
  const runner = await ModelRunner.create(ck, { numBlocks: 8, blockSize: 16 });
  try {
    const out = await runner.execute([{ tokenIds: ids, startPosition: 0, blockTable: [5, 2], sample: null, allLogits: true }]);
    return out.logits![0]!;
  } finally {
    await runner.dispose();
  }
}

for (const model of ["tiny-qwen3", "tiny-llama"] as const) {
  test(`model: ${model} exported to a BF16 GGUF loads with the same config and bit-identical logits`, async () => {
    const dir = completeFixtureModel(model);
    const file = path.join(tempDir("weft-gguf-"), `${model}.gguf`);
    exportGguf(dir, file, "bf16");
    const fromDir = loadCheckpoint(dir), fromGguf = loadCheckpoint(file);
    assert.equal(fromGguf.dir, file);
    // GGUF holds rms epsilon as f32 (which the kernels use anyway) and one eos id.
    assert.deepEqual({ ...fromGguf.config, eosTokenIds: [] }, { ...fromDir.config, rmsEps: Math.fround(fromDir.config.rmsEps), eosTokenIds: [] });
    assert.deepEqual(fromGguf.config.eosTokenIds, fromDir.config.eosTokenIds.slice(0, 1));
    // llama's q/k rows are stored permuted; the loader serves them from a side file in HF order.
    if (model === "tiny-llama") assert.equal(path.basename(fromGguf.weights.layers[0]!.wq.file).endsWith(`-${process.pid}.bin`), true, "the side file is this process's");
    const ids = readReference(model)[0]!.input_ids.slice(0, 24);
    const [a, b] = [await allLogits(fromDir, ids), await allLogits(fromGguf, ids)];
    assert.equal(a.length, ids.length * fromDir.config.vocab);
    assert.ok(a.every((v, i) => Object.is(v, b[i])), "logits differ");
  });
}

test("model: llama's q/k side file goes when its process exits; one left by a killed process is swept by the next", () => {
  const file = path.join(tempDir("weft-gguf-"), "tiny-llama.gguf");
  exportGguf(completeFixtureModel("tiny-llama"), file, "bf16");
  const load = (): string => execFileSync(process.execPath, ["--input-type=module", "-e",
    `const m = await import(${JSON.stringify(path.join(ROOT, "dist", "src", "model", "gguf-model.js"))}); console.log(m.loadGgufCheckpoint(process.argv[1]).weights.layers[0].wq.file);`, file]).toString().trim();
  const side = load();
  assert.match(path.basename(side), /^weft-gguf-qk-[0-9a-f]{16}-\d+\.bin$/);
  assert.equal(fs.existsSync(side), false, "removed at exit");
  // A side file whose process is gone (the one just run), and one without a process id (an older Weft's).
  const dead = side;
  const legacy = side.replace(/-\d+\.bin$/, ".bin");
  for (const f of [dead, legacy]) fs.writeFileSync(f, "stale");
  load();
  assert.equal(fs.existsSync(dead), false, "a dead process's side file is swept");
  assert.equal(fs.existsSync(legacy), false, "an older Weft's side file is swept");
});

test("model: Llama 3 rope scaling is recovered from rope_freqs.weight", () => {
  const headDim = 128, theta = 500000;
  const want: RopeScaling = { type: "llama3", factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: 8192 };
  // llama.cpp's converter: one divisor per frequency.
  const factors = new Float32Array(headDim / 2).map((_, i) => {
    const wavelen = (2 * Math.PI) / Math.pow(theta, -(2 * i) / headDim);
    if (wavelen < 8192 / 4) return 1;
    if (wavelen > 8192) return 8;
    const s = (8192 / wavelen - 1) / 3;
    return 1 / ((1 - s) / 8 + s);
  });
  const file = path.join(tempDir("weft-gguf-"), "rope.gguf");
  const meta: Meta[] = [["general.alignment", "u32", ALIGN], ["general.architecture", "str", "llama"], ["llama.embedding_length", "u32", 4096],
    ["llama.attention.head_count", "u32", 32], ["llama.attention.head_count_kv", "u32", 8], ["llama.feed_forward_length", "u32", 14336],
    ["llama.block_count", "u32", 32], ["llama.context_length", "u32", 131072], ["llama.rope.freq_base", "f32", theta],
    ["llama.attention.layer_norm_rms_epsilon", "f32", 1e-5], ["tokenizer.ggml.eos_token_id", "u32", 128001], ["tokenizer.ggml.eot_token_id", "u32", 128009]];
  writeGguf(file, meta, [
    { name: "token_embd.weight", type: "Q4_K", shape: [16, 4096], data: () => new Uint8Array(16 * 16 * 144) },
    { name: "rope_freqs.weight", type: "F32", shape: [64], data: () => new Uint8Array(factors.buffer) },
  ]);
  const c = ggufModelConfig(readGguf(file));
  assert.equal(c.ropeScaling.type, "llama3");
  const got = ropeInvFreq(headDim, theta, c.ropeScaling), ref = ropeInvFreq(headDim, theta, want);
  got.forEach((v, i) => assert.ok(Math.abs(v - ref[i]!) <= 1e-6 * ref[i]!, `inv freq ${i}: ${v} vs ${ref[i]}`));
  assert.deepEqual([c.headDim, c.kvHeads, c.vocab, c.maxPositions, c.eosTokenIds], [128, 8, 16, 131072, [128001, 128009]]);
  // Divisors that are not Llama 3's are refused rather than misread.
  factors[1] = 3;
  writeGguf(file, meta, [
    { name: "token_embd.weight", type: "Q4_K", shape: [16, 4096], data: () => new Uint8Array(16 * 16 * 144) },
    { name: "rope_freqs.weight", type: "F32", shape: [64], data: () => new Uint8Array(factors.buffer) },
  ]);
  assert.throws(() => ggufModelConfig(readGguf(file)), /rope_freqs\.weight does not hold Llama 3 rope scaling/);
});

test("model: a quantized tensor loads as its type; an unknown architecture is refused with a clear error", () => {
  const file = path.join(tempDir("weft-gguf-"), "llama.gguf");
  exportGguf(completeFixtureModel("tiny-llama"), file, "f16");
  // blk.1.ffn_up.weight [128, 64] as Q8_0: fewer bytes than its F16 data, so the file stays consistent.
  const q8 = corrupt(file, (b) => { b.writeUInt32LE(GGML_TYPES.Q8_0.id, entryAt(b, "blk.1.ffn_up.weight") + 4 + 16); return b; });
  assert.equal(readGguf(q8).tensors.get("blk.1.ffn_up.weight")!.type, "Q8_0");
  assert.equal(loadCheckpoint(q8).weights.layers[1]!.up.dtype, "q8_0", "a quantized tensor loads as its type (unsupported types: see the reader test)");
  const other = corrupt(file, (b) => {
    const at = b.indexOf(Buffer.from("general.architecture")) + "general.architecture".length + 4 + 8;
    b.write("gemma", at, "latin1");
    return b;
  });
  assert.throws(() => loadCheckpoint(other), /unsupported architecture "gemma" \(supported: llama, qwen2, qwen3\)/);
});

test("serve: a GGUF file is served as a model (its own tokenizer and chat template) with the safetensors checkpoint's greedy text", async () => {
  const { startServer } = await import("./support/server.js");
  const dir = completeFixtureModel("tiny-qwen3");
  const gguf = path.join(tempDir(), "tiny-bf16.gguf");
  exportGguf(dir, gguf, "bf16");
  const s = await startServer({ modelDir: dir, models: { gguf } });
  try {
    const ask = async (model: string, route: string, body: Record<string, unknown>): Promise<string> => {
      const res = await fetch(`${s.url}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model, max_tokens: 12, temperature: 0, ...body }) });
      assert.equal(res.status, 200);
      const j = (await res.json()) as { choices: { text?: string; message?: { content: string } }[] };
      return j.choices[0]!.text ?? j.choices[0]!.message!.content;
    };
    for (const [route, body] of [["/v1/completions", { prompt: "The history of" }], ["/v1/chat/completions", { messages: [{ role: "user", content: "Hello" }] }]] as const) {
      assert.equal(await ask("gguf", route, body), await ask("tiny", route, body), `${route}: same text from the GGUF as from safetensors`);
    }
  } finally {
    await s.close();
  }
});
