/**
 * Quantized GGUF files that do not fit their model: refused with the file, the
 * tensor and both shapes named (the reader's own checks, on truncated files,
 * overlapping or misaligned data, unsupported types and architectures, are in
 * gguf.test.ts).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { exportGguf } from "../src/model/gguf-export.js";
import { quantizeModel } from "../src/model/gguf-quantize.js";
import { readGguf } from "../src/model/gguf.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { CheckpointError } from "../src/model/errors.js";
import { completeFixtureModel, tempDir } from "./helpers.js";

/** A Q8_0 file of the tiny-llama fixture (hidden 64: every matrix whole 32-blocks). */
function q8File(): string {
  const dir = tempDir("weft-gguf-errors-");
  exportGguf(completeFixtureModel("tiny-llama"), path.join(dir, "f16.gguf"), "f16");
  quantizeModel(path.join(dir, "f16.gguf"), path.join(dir, "q8_0.gguf"), "q8_0");
  return path.join(dir, "q8_0.gguf");
}

/** A copy of `file` with the header bytes of one tensor's entry edited: `at` is where its dimension count starts. */
function edited(file: string, tensor: string, edit: (b: Buffer, at: number) => void): string {
  const b = fs.readFileSync(file);
  const name = Buffer.from(tensor);
  const at = b.indexOf(Buffer.concat([Buffer.from([name.length, 0, 0, 0, 0, 0, 0, 0]), name])) + 8 + name.length;
  edit(b, at);
  const out = file.replace(/\.gguf$/, `-${tensor}.gguf`);
  fs.writeFileSync(out, b);
  return out;
}

test("a quantized tensor whose shape disagrees with the metadata, or a missing one, is refused naming the tensor", () => {
  const file = q8File();
  assert.equal(loadCheckpoint(file).weights.layers[1]!.wk.dtype, "q8_0");
  // blk.1.attn_k.weight: [64, 32] in ggml order (row length, rows); 16 rows instead of 32 still fit the file.
  const short = edited(file, "blk.1.attn_k.weight", (b, at) => b.writeBigUInt64LE(16n, at + 4 + 8));
  assert.deepEqual(readGguf(short).tensors.get("blk.1.attn_k.weight")!.shape, [16, 64]);
  assert.throws(() => loadCheckpoint(short), (e: unknown) => e instanceof CheckpointError &&
    e.message === `${short} (tensor blk.1.attn_k.weight): wrong shape [16, 64], expected [32, 64]`);
  // The same name spelled differently: the tensor is missing.
  const renamed = edited(file, "blk.1.ffn_up.weight", (b, at) => void b.write("x", at - 7, "latin1"));
  assert.throws(() => loadCheckpoint(renamed), /\(tensor blk\.1\.ffn_up\.weight\): missing tensor/);
});
