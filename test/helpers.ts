/** Shared test fixtures: paths, reference data, a scratch model directory. */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import assert from "node:assert/strict";
import { tokenizerPackageDir } from "../src/model/tokenizer-packages.js";
import type { Engine } from "../src/engine/engine.js";

export const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "..");
export const FIXTURES = process.env.WEFT_FIXTURES ?? path.resolve(ROOT, "..", "shared", "fixtures");

export interface ReferencePrompt {
  input_ids: number[];
  greedy_continuation: number[];
  min_top2_margin: number;
}

export function readReference(model: string): ReferencePrompt[] {
  const ref = JSON.parse(fs.readFileSync(path.join(FIXTURES, model, "reference.json"), "utf8")) as { prompts: ReferencePrompt[] };
  return ref.prompts;
}

/** `logits_i` (F32) and `positions_i` (I64) from reference_logits.safetensors. */
export function readReferenceLogits(model: string): Map<string, { shape: number[]; data: Float32Array | BigInt64Array }> {
  const buf = fs.readFileSync(path.join(FIXTURES, model, "reference_logits.safetensors"));
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString("utf8")) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const out = new Map<string, { shape: number[]; data: Float32Array | BigInt64Array }>();
  for (const [name, t] of Object.entries(header)) {
    if (name === "__metadata__") continue;
    const bytes = buf.subarray(8 + n + t.data_offsets[0], 8 + n + t.data_offsets[1]);
    const copy = new Uint8Array(bytes).buffer;
    out.set(name, { shape: t.shape, data: t.dtype === "F32" ? new Float32Array(copy) : new BigInt64Array(copy) });
  }
  return out;
}

export { tokenizerPackageDir };

/** A temp copy of a fixture checkpoint plus its family's tokenizer: a complete model directory. */
export function completeFixtureModel(model: "tiny-qwen3" | "tiny-llama"): string {
  const dir = tempDir(`weft-${model}-`);
  for (const f of ["config.json", "generation_config.json"]) fs.copyFileSync(path.join(FIXTURES, model, f), path.join(dir, f));
  fs.symlinkSync(path.join(FIXTURES, model, "model.safetensors"), path.join(dir, "model.safetensors"));
  const tokDir = tokenizerPackageDir(model === "tiny-qwen3" ? "qwen3" : "llama2");
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(tokDir, f), path.join(dir, f));
  return dir;
}

/** Each test file runs in its own process; its temp dirs (models, databases, GGUF files) go when it exits. */
const tempDirs = new Set<string>();
function removeTempDirs(): void {
  for (const dir of tempDirs) fs.rmSync(dir, { recursive: true, force: true });
}

/** A fresh directory under the OS temp dir, removed when the test process exits. */
export function tempDir(prefix = "weft-test-"): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  if (tempDirs.size === 0) process.on("exit", removeTempDirs);
  tempDirs.add(dir);
  return dir;
}

/** An idle engine holds nothing: no requests, every block free (or cached) with no references. */
export function assertEngineIdle(engine: Engine): void {
  const s = engine.stats();
  assert.equal(s.running + s.waiting, 0, "requests left behind");
  assert.equal(s.blocksUsed, 0, "leaked KV blocks");
  assert.equal(s.blocksFree, s.blocksTotal);
  for (const b of engine.kv.pool.blocks) assert.equal(b.refCount, 0);
}
