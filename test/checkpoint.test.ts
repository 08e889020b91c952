/** Checkpoint loading: both config forms, sharded files, dtypes, and one specific error per defect. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { FIXTURES, tempDir } from "./helpers.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { readModelConfig } from "../src/model/config.js";
import { readSafetensors, readTensorBytes, writeSafetensors, type TensorToWrite } from "../src/model/safetensors.js";
import { ModelRunner } from "../src/runtime/model-runner.js";

type Json = Record<string, unknown>;
const SRC = path.join(FIXTURES, "tiny-llama");

/** The fixture's tensors as writable entries. */
function fixtureTensors(): TensorToWrite[] {
  return [...readSafetensors(path.join(SRC, "model.safetensors"))].map(([name, t]) => ({
    name, dtype: t.dtype.toUpperCase() as "BF16", shape: t.shape, data: readTensorBytes(t),
  }));
}

function modelDir(edit: (cfg: Json, tensors: TensorToWrite[]) => void = () => {}): string {
  const dir = tempDir();
  const cfg = JSON.parse(fs.readFileSync(path.join(SRC, "config.json"), "utf8")) as Json;
  const tensors = fixtureTensors();
  edit(cfg, tensors);
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(cfg));
  writeSafetensors(path.join(dir, "model.safetensors"), tensors);
  return dir;
}

/** Rewrites the JSON header of `file`, leaving the data section's bytes alone. */
function patchHeader(file: string, edit: (h: Record<string, Json>) => void): void {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString()) as Record<string, Json>;
  edit(header);
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  fs.writeFileSync(file, Buffer.concat([len, json, buf.subarray(8 + n)]));
}

async function lastLogits(dir: string): Promise<Float32Array> {
  const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 4, blockSize: 32 });
  const out = await runner.execute([{ tokenIds: [1, 500, 900, 31000], startPosition: 0, blockTable: [2], sample: null, allLogits: true }]);
  return out.logits![0]!;
}

test("the older config form (top-level rope_theta, rope_scaling) loads like the transformers-5 form", () => {
  const dir = modelDir((cfg) => {
    delete cfg.rope_parameters;
    cfg.rope_theta = 10000;
    cfg.rope_scaling = null;
    delete cfg.head_dim; // derived: hidden / heads = 16
  });
  const a = readModelConfig(dir), b = readModelConfig(SRC);
  assert.deepEqual(a, b);
});

test("llama3 rope scaling is parsed from either form", () => {
  const scaling = { rope_type: "llama3", factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 };
  const older = modelDir((cfg) => { delete cfg.rope_parameters; cfg.rope_theta = 500000; cfg.rope_scaling = scaling; });
  const newer = modelDir((cfg) => { cfg.rope_parameters = { ...scaling, rope_theta: 500000 }; });
  for (const dir of [older, newer]) {
    assert.deepEqual(readModelConfig(dir).ropeScaling, { type: "llama3", factor: 32, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositions: 8192 });
  }
});

test("sharded f32 and f16 checkpoints give the bf16 checkpoint's logits within tolerance", async () => {
  const reference = await lastLogits(SRC);
  const widen = (bf16: Uint8Array): Uint8Array => {
    const src = new Uint16Array(bf16.buffer, bf16.byteOffset, bf16.byteLength / 2);
    const out = new Uint32Array(src.length);
    src.forEach((h, i) => (out[i] = h << 16));
    return new Uint8Array(out.buffer);
  };
  const toF16 = (bf16: Uint8Array): Uint8Array => {
    const f32 = new Float32Array(widen(bf16).buffer);
    const out = new Uint16Array(f32.length);
    const dv = new DataView(new ArrayBuffer(4));
    f32.forEach((f, i) => { dv.setFloat32(0, f); out[i] = f32ToF16Bits(dv.getUint32(0)); });
    return new Uint8Array(out.buffer);
  };
  for (const [dtype, convert] of [["F32", widen], ["F16", toF16]] as const) {
    const dir = tempDir();
    fs.copyFileSync(path.join(SRC, "config.json"), path.join(dir, "config.json"));
    const tensors = fixtureTensors().map((t) => ({ ...t, dtype, data: convert(t.data as Uint8Array) }));
    const half = Math.floor(tensors.length / 2);
    writeSafetensors(path.join(dir, "model-00001-of-00002.safetensors"), tensors.slice(0, half));
    writeSafetensors(path.join(dir, "model-00002-of-00002.safetensors"), tensors.slice(half));
    const weightMap = Object.fromEntries(tensors.map((t, i) => [t.name, `model-0000${i < half ? 1 : 2}-of-00002.safetensors`]));
    fs.writeFileSync(path.join(dir, "model.safetensors.index.json"), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    const got = await lastLogits(dir);
    const maxDiff = got.reduce((m, v, i) => Math.max(m, Math.abs(v - reference[i]!)), 0);
    // f32 holds the bf16 values exactly: only the kernels' summation order differs (bf16 chunks are
    // split into even and odd lanes). f16 rounds some small weights.
    const scale = reference.reduce((m, v) => Math.max(m, Math.abs(v)), 0);
    if (dtype === "F32") assert.ok(maxDiff / scale < 1e-5, `f32 max diff ${maxDiff}`);
    else assert.ok(maxDiff < 1e-2, `f16 max diff ${maxDiff}`);
  }
});

function f32ToF16Bits(x: number): number {
  const sign = (x >>> 16) & 0x8000, exp = ((x >>> 23) & 0xff) - 127 + 15, mant = x & 0x7fffff;
  if (exp <= 0) return sign | ((mant | 0x800000) >> (14 - exp));
  if (exp >= 31) return sign | 0x7c00;
  return sign | (exp << 10) | (mant >> 13);
}

test("an untied Llama without lm_head.weight: missing tensor, named", () => {
  const dir = modelDir((_c, t) => t.splice(t.findIndex((x) => x.name === "lm_head.weight"), 1));
  assert.throws(() => loadCheckpoint(dir), /tensor lm_head\.weight\).*missing tensor/);
});

test("wrong shape names the tensor and both shapes", () => {
  const dir = modelDir((cfg) => (cfg.intermediate_size = 96));
  assert.throws(() => loadCheckpoint(dir), /model\.layers\.0\.mlp\.gate_proj\.weight\): wrong shape \[128, 64\], expected \[96, 64\]/);
});

test("unsupported architecture", () => {
  const dir = modelDir((cfg) => (cfg.architectures = ["GPT2LMHeadModel"]));
  assert.throws(() => loadCheckpoint(dir), /config\.json: unsupported architecture \["GPT2LMHeadModel"\]/);
});

test("unsupported dtype names the tensor", () => {
  const dir = modelDir();
  patchHeader(path.join(dir, "model.safetensors"), (h) => (h["model.norm.weight"]!.dtype = "I16"));
  assert.throws(() => loadCheckpoint(dir), /model\.safetensors \(tensor model\.norm\.weight\): unsupported dtype I16/);
});

test("unsupported rope type", () => {
  const dir = modelDir((cfg) => (cfg.rope_parameters = { rope_type: "yarn", rope_theta: 10000, factor: 4 }));
  assert.throws(() => loadCheckpoint(dir), /config\.json: unsupported rope type "yarn"/);
});

test("truncated file", () => {
  const dir = modelDir();
  const file = path.join(dir, "model.safetensors");
  fs.truncateSync(file, fs.statSync(file).size - 100);
  assert.throws(() => loadCheckpoint(dir), /model\.safetensors \(tensor [\w.]+\): truncated file/);
  fs.truncateSync(file, 5);
  assert.throws(() => loadCheckpoint(dir), /model\.safetensors: truncated file: 5 bytes/);
});

test("header offsets outside the file", () => {
  const dir = modelDir();
  patchHeader(path.join(dir, "model.safetensors"), (h) => {
    const t = h["model.norm.weight"]!, [a, b] = t.data_offsets as [number, number];
    t.data_offsets = [a + 1e9, b + 1e9];
  });
  assert.throws(() => loadCheckpoint(dir), /\(tensor model\.norm\.weight\): header offsets \[\d+, \d+\] lie outside the file/);
});

test("overlapping header offsets", () => {
  const dir = modelDir();
  patchHeader(path.join(dir, "model.safetensors"), (h) => {
    h["model.layers.0.post_attention_layernorm.weight"]!.data_offsets = h["model.layers.0.input_layernorm.weight"]!.data_offsets;
  });
  assert.throws(() => loadCheckpoint(dir), /header offsets overlap tensor/);
});
