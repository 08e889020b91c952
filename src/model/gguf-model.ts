/**
 * A GGUF file as a Checkpoint: the model's shape from its metadata
 * (architectures llama, qwen2, qwen3), its tensors by llama.cpp's names mapped
 * to the addon's weights. Tensors are served from the file as they are, in
 * their stored type (F32/F16/BF16, Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K). llama.cpp stores the `llama` architecture's q/k rows permuted for
 * its interleaved rope; Weft's rope is rotate-half, so those rows are put back
 * in Hugging Face order, into a side file the addon maps instead.
 */
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { CheckpointError } from "./errors.js";
import { GgufMetadata, readGguf, type Gguf, type GgufTensor } from "./gguf.js";
import { dequantize } from "./gguf-dequant.js";
import type { Architecture, ModelConfig, RopeScaling } from "./config.js";
import type { Checkpoint } from "./checkpoint.js";
import type { NativeDType, NativeLayerWeights, NativeTensor, NativeWeights } from "../runtime/native.js";

const ARCHITECTURES: Record<string, Architecture> = { llama: "LlamaForCausalLM", qwen2: "Qwen2ForCausalLM", qwen3: "Qwen3ForCausalLM" };

/** Every type the reader accepts is served: quantized types stay quantized in memory (the addon's integer kernels). */
const NATIVE_DTYPES: Record<GgufTensor["type"], NativeDType> = {
  F32: "f32", F16: "f16", BF16: "bf16", Q8_0: "q8_0", Q4_0: "q4_0", Q4_1: "q4_1", Q4_K: "q4_k", Q5_K: "q5_k", Q6_K: "q6_k",
};

/** The file's eos, end-of-turn and end-of-message tokens: generation stops at any of them. */
function stopTokens(m: GgufMetadata): number[] {
  const keys = ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"];
  return [...new Set(keys.filter((k) => m.has(k)).map((k) => m.num(k)))];
}

/**
 * llama.cpp keeps Llama 3's rope scaling as per-frequency divisors (`rope_freqs.weight`, computed
 * by its converter from the llama3 parameters). Recovers those parameters, with low_freq_factor
 * taken as 1 (only the ratios to original_max_position_embeddings matter), and checks that they
 * give back every divisor.
 */
function llama3Scaling(file: string, factors: Float32Array, headDim: number, theta: number): RopeScaling {
  const freq = (i: number): number => Math.pow(theta, -(2 * i) / headDim);
  const factor = factors[factors.length - 1]!;
  // In the blend, 1/divisor = (1 - s)/factor + s with s = a/wavelen - b, linear in 1/wavelen.
  const blend = [...factors.keys()].filter((i) => factors[i]! > 1 + 1e-6 && factors[i]! < factor - 1e-6);
  const bad = new CheckpointError(file, "rope_freqs.weight does not hold Llama 3 rope scaling (the only per-frequency scaling supported)", "rope_freqs.weight");
  if (factor <= 1 || blend.length < 2) throw bad;
  const point = (i: number): [number, number] => [freq(i) / (2 * Math.PI), (1 / factors[i]! - 1 / factor) / (1 - 1 / factor)];
  const [x0, y0] = point(blend[0]!), [x1, y1] = point(blend[blend.length - 1]!);
  const a = (y1 - y0) / (x1 - x0), b = a * x0 - y0;
  const scaling: RopeScaling = { type: "llama3", factor, lowFreqFactor: 1, highFreqFactor: 1 + 1 / b, originalMaxPositions: a / b };
  const lowWavelen = scaling.originalMaxPositions, highWavelen = scaling.originalMaxPositions / scaling.highFreqFactor;
  factors.forEach((got, i) => {
    const wavelen = (2 * Math.PI) / freq(i);
    const s = (scaling.originalMaxPositions / wavelen - 1) / (scaling.highFreqFactor - 1);
    const want = wavelen < highWavelen ? 1 : wavelen > lowWavelen ? factor : 1 / ((1 - s) / factor + s);
    if (Math.abs(want - got) > 1e-4 * want) throw bad;
  });
  return scaling;
}

function ropeScaling(g: Gguf, m: GgufMetadata, arch: string, headDim: number, theta: number): RopeScaling {
  const type = m.str(`${arch}.rope.scaling.type`, "none");
  if (type !== "none") throw new CheckpointError(g.file, `rope scaling type "${type}" is not supported (supported: none, Llama 3's rope_freqs)`);
  const t = g.tensors.get("rope_freqs.weight");
  if (!t) return { type: "default" };
  if (t.type !== "F32" || t.shape.length !== 1 || t.shape[0] !== headDim / 2) {
    throw new CheckpointError(g.file, `expected F32 [${headDim / 2}], got ${t.type} [${t.shape.join(", ")}]`, t.name);
  }
  return llama3Scaling(g.file, dequantize("F32", readBytes(g.file, t.offset, t.byteLength), headDim / 2), headDim, theta);
}

/** The model's shape from the metadata; the vocabulary size from the embedding. */
export function ggufModelConfig(g: Gguf): ModelConfig {
  const m = new GgufMetadata(g.file, g.metadata);
  const arch = m.str("general.architecture");
  const architecture = ARCHITECTURES[arch];
  if (!architecture) throw new CheckpointError(g.file, `unsupported architecture "${arch}" (supported: ${Object.keys(ARCHITECTURES).join(", ")})`);
  const hidden = m.num(`${arch}.embedding_length`);
  const heads = m.num(`${arch}.attention.head_count`);
  const kvHeads = m.num(`${arch}.attention.head_count_kv`, heads);
  if (heads % kvHeads !== 0) throw new CheckpointError(g.file, `head_count ${heads} is not a multiple of head_count_kv ${kvHeads}`);
  const headDim = m.num(`${arch}.attention.key_length`, hidden / heads);
  if (m.num(`${arch}.attention.value_length`, headDim) !== headDim) throw new CheckpointError(g.file, "attention.value_length differs from key_length");
  if (!Number.isInteger(headDim) || headDim % 2 !== 0) throw new CheckpointError(g.file, `head dimension ${headDim} must be an even integer`);
  if (m.num(`${arch}.rope.dimension_count`, headDim) !== headDim) throw new CheckpointError(g.file, "partial rope (rope.dimension_count below the head dimension) is not supported");
  const embd = g.tensors.get("token_embd.weight");
  if (!embd) throw new CheckpointError(g.file, "missing tensor", "token_embd.weight");
  const theta = m.num(`${arch}.rope.freq_base`, 10000);
  const bos = m.has("tokenizer.ggml.bos_token_id") ? m.num("tokenizer.ggml.bos_token_id") : null;
  return {
    architecture,
    hidden,
    intermediate: m.num(`${arch}.feed_forward_length`),
    layers: m.num(`${arch}.block_count`),
    heads,
    kvHeads,
    headDim,
    vocab: embd.shape[0]!,
    rmsEps: m.num(`${arch}.attention.layer_norm_rms_epsilon`),
    ropeTheta: theta,
    ropeScaling: ropeScaling(g, m, arch, headDim, theta),
    maxPositions: m.num(`${arch}.context_length`),
    tieEmbeddings: !g.tensors.has("output.weight"),
    qkvBias: g.tensors.has("blk.0.attn_q.bias"),
    qkNorm: g.tensors.has("blk.0.attn_q_norm.weight"),
    bosTokenId: bos,
    eosTokenIds: stopTokens(m),
  };
}

function readBytes(file: string, offset: number, length: number): Uint8Array {
  const fd = fs.openSync(file, "r");
  try {
    const buf = new Uint8Array(length);
    fs.readSync(fd, buf, 0, length, offset);
    return buf;
  } finally {
    fs.closeSync(fd);
  }
}

/** A GGUF tensor as the addon's view of it, after checking its shape. */
function nativeTensor(g: Gguf, name: string, shape: number[]): NativeTensor {
  const t = g.tensors.get(name);
  if (!t) throw new CheckpointError(g.file, "missing tensor", name);
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new CheckpointError(g.file, `wrong shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`, name);
  }
  return { file: g.file, offset: t.offset, byteLength: t.byteLength, dtype: NATIVE_DTYPES[t.type], shape: t.shape };
}

function layerWeights(g: Gguf, c: ModelConfig, i: number): NativeLayerWeights {
  const b = `blk.${i}.`, q = c.heads * c.headDim, kv = c.kvHeads * c.headDim;
  const w: NativeLayerWeights = {
    attnNorm: nativeTensor(g, `${b}attn_norm.weight`, [c.hidden]),
    wq: nativeTensor(g, `${b}attn_q.weight`, [q, c.hidden]),
    wk: nativeTensor(g, `${b}attn_k.weight`, [kv, c.hidden]),
    wv: nativeTensor(g, `${b}attn_v.weight`, [kv, c.hidden]),
    wo: nativeTensor(g, `${b}attn_output.weight`, [c.hidden, q]),
    mlpNorm: nativeTensor(g, `${b}ffn_norm.weight`, [c.hidden]),
    gate: nativeTensor(g, `${b}ffn_gate.weight`, [c.intermediate, c.hidden]),
    up: nativeTensor(g, `${b}ffn_up.weight`, [c.intermediate, c.hidden]),
    down: nativeTensor(g, `${b}ffn_down.weight`, [c.hidden, c.intermediate]),
  };
  if (c.qkvBias) {
    w.bq = nativeTensor(g, `${b}attn_q.bias`, [q]);
    w.bk = nativeTensor(g, `${b}attn_k.bias`, [kv]);
    w.bv = nativeTensor(g, `${b}attn_v.bias`, [kv]);
  }
  if (c.qkNorm) {
    w.qNorm = nativeTensor(g, `${b}attn_q_norm.weight`, [c.headDim]);
    w.kNorm = nativeTensor(g, `${b}attn_k_norm.weight`, [c.headDim]);
  }
  return w;
}

/**
 * Rows of `data` (each `rowBytes` long) from llama.cpp's interleaved order back to Hugging Face's
 * rotate-half order, head by head: the inverse of the converter's permute (and of gguf-export.ts's).
 */
export function unpermuteRows(data: Uint8Array, heads: number, rowBytes: number): Uint8Array {
  const out = new Uint8Array(data.length);
  const hd = data.length / rowBytes / heads, half = hd / 2;
  for (let h = 0; h < heads; h++)
    for (let i = 0; i < half; i++)
      for (let j = 0; j < 2; j++) {
        const hf = h * hd + j * half + i, gg = h * hd + i * 2 + j;
        out.set(data.subarray(gg * rowBytes, (gg + 1) * rowBytes), hf * rowBytes);
      }
  return out;
}

const SIDE_FILE = /^weft-gguf-qk-[0-9a-f]{16}(?:-(\d+))?\.bin(?:\.tmp)?$/;
/** The side files this process wrote: removed when it exits (the temp directory may be RAM). */
const sideFiles = new Set<string>();

function keepUntilExit(file: string): void {
  if (sideFiles.size === 0) process.once("exit", () => sideFiles.forEach((f) => fs.rmSync(f, { force: true })));
  sideFiles.add(file);
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Removes side files left by processes that are gone (killed before their exit handler ran, or an older Weft's). */
function sweepSideFiles(): void {
  for (const name of fs.readdirSync(os.tmpdir())) {
    const m = SIDE_FILE.exec(name);
    if (m && (m[1] === undefined || !processAlive(Number(m[1])))) fs.rmSync(path.join(os.tmpdir(), name), { force: true });
  }
}

/**
 * Writes the llama architecture's q/k weights (and biases) in Hugging Face row order to a side file
 * in the temp directory and points those tensors at it. The file is this process's: named by the
 * GGUF's path, size and mtime and the process id, reused by its later loads of that GGUF, and
 * removed when it exits.
 */
function unpermuteQk(g: Gguf, c: ModelConfig, layers: NativeLayerWeights[]): void {
  const st = fs.statSync(g.file);
  const key = crypto.createHash("sha256").update(`${path.resolve(g.file)}\0${st.size}\0${st.mtimeMs}`).digest("hex").slice(0, 16);
  const side = path.join(os.tmpdir(), `weft-gguf-qk-${key}-${process.pid}.bin`);
  const jobs = layers.flatMap((l) => [[l, "wq", c.heads], [l, "wk", c.kvHeads], [l, "bq", c.heads], [l, "bk", c.kvHeads]] as const)
    .filter(([l, k]) => l[k] !== undefined);
  const total = jobs.reduce((s, [l, k]) => s + l[k]!.byteLength, 0);
  const fresh = !fs.existsSync(side) || fs.statSync(side).size !== total;
  if (fresh) sweepSideFiles();
  const tmp = `${side}.tmp`;
  const fd = fresh ? fs.openSync(tmp, "w") : -1;
  try {
    let at = 0;
    for (const [l, k, heads] of jobs) {
      const t = l[k]!;
      if (fresh) fs.writeSync(fd, unpermuteRows(readBytes(t.file, t.offset, t.byteLength), heads, t.byteLength / t.shape[0]!));
      l[k] = { ...t, file: side, offset: at };
      at += t.byteLength;
    }
  } finally {
    if (fresh) fs.closeSync(fd);
  }
  if (fresh) fs.renameSync(tmp, side);
  keepUntilExit(side);
}

/** Loads and validates a GGUF model file; tensor data stays in the file (the addon maps it). */
export function loadGgufCheckpoint(file: string): Checkpoint {
  const g = readGguf(file);
  const config = ggufModelConfig(g);
  const embed = nativeTensor(g, "token_embd.weight", [config.vocab, config.hidden]);
  const layers = Array.from({ length: config.layers }, (_, i) => layerWeights(g, config, i));
  if (config.architecture === "LlamaForCausalLM") unpermuteQk(g, config, layers);
  const weights: NativeWeights = {
    embed,
    finalNorm: nativeTensor(g, "output_norm.weight", [config.hidden]),
    lmHead: config.tieEmbeddings ? embed : nativeTensor(g, "output.weight", [config.vocab, config.hidden]),
    layers,
  };
  const weightBytes = [...new Set([weights.lmHead, ...weights.layers.flatMap((l) => Object.values(l) as NativeTensor[])])]
    .reduce((sum, t) => sum + t.byteLength, 0);
  return { dir: file, config, weights, weightBytes };
}
