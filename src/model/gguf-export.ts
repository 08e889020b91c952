/**
 * `weft export-gguf`: a checkpoint as a GGUF v3 file for llama.cpp, so the
 * peer benchmark runs the very same weights. Qwen2/Qwen3 and Llama-3-style
 * (byte-level BPE) models; matrices in F16 or BF16, vectors in F32.
 */
import fs from "node:fs";
import path from "node:path";
import { loadCheckpoint } from "./checkpoint.js";
import { CheckpointError } from "./errors.js";
import { readTensorBytes } from "./safetensors.js";
import type { NativeTensor } from "../runtime/native.js";
import { GGML_TYPES, type GgmlType } from "./gguf.js";

export type GgufDType = "f16" | "bf16";

/** The alignment this writer uses; `general.alignment` must say so. */
export const ALIGN = 32;

/** GGUF metadata value types. */
const T = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9, u64: 10, i64: 11, f64: 12 } as const;

type Scalar = Exclude<keyof typeof T, "arr">;

class Writer {
  private readonly parts: Buffer[] = [];
  size = 0;
  push(b: Buffer): void {
    this.parts.push(b);
    this.size += b.length;
  }
  u32(v: number): void { const b = Buffer.alloc(4); b.writeUInt32LE(v); this.push(b); }
  u64(v: number): void { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); this.push(b); }
  str(s: string): void { const b = Buffer.from(s, "utf8"); this.u64(b.length); this.push(b); }
  scalar(type: Scalar, v: number | string | boolean): void {
    if (type === "str") return this.str(v as string);
    const n = v as number, b = Buffer.alloc(type === "u64" || type === "i64" || type === "f64" ? 8 : type.endsWith("16") ? 2 : type.endsWith("8") || type === "bool" ? 1 : 4);
    switch (type) {
      case "u8": b.writeUInt8(n); break;
      case "i8": b.writeInt8(n); break;
      case "u16": b.writeUInt16LE(n); break;
      case "i16": b.writeInt16LE(n); break;
      case "u32": b.writeUInt32LE(n); break;
      case "i32": b.writeInt32LE(n); break;
      case "f32": b.writeFloatLE(n); break;
      case "bool": b.writeUInt8(v ? 1 : 0); break;
      case "u64": b.writeBigUInt64LE(BigInt(n)); break;
      case "i64": b.writeBigInt64LE(BigInt(n)); break;
      case "f64": b.writeDoubleLE(n); break;
    }
    this.push(b);
  }
  buffer(): Buffer { return Buffer.concat(this.parts); }
}

/** One metadata entry: a scalar (`"u32"`, `"str"`, ...) or an array of one (`"u32s"`, `"strs"`, ...). */
export type Meta = [string, Scalar, number | string | boolean] | [string, `${Scalar}s`, (number | string | boolean)[]];

function writeMeta(w: Writer, [key, type, value]: Meta): void {
  w.str(key);
  if (Array.isArray(value)) {
    const item = type.slice(0, -1) as Scalar;
    w.u32(T.arr);
    w.u32(T[item]);
    w.u64(value.length);
    for (const v of value) w.scalar(item, v);
  } else {
    w.u32(T[type as Scalar]);
    w.scalar(type as Scalar, value);
  }
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function f32ToF16(f: number): number {
  f32[0] = f;
  const x = u32[0]!;
  const sign = (x >>> 16) & 0x8000, exp = ((x >>> 23) & 0xff) - 112;
  const mant = (x & 0x7fffff) + 0x1000; // round to nearest
  if (exp <= 0) return sign; // flush subnormals
  if (mant & 0x800000) return exp + 1 >= 31 ? sign | 0x7c00 : sign | ((exp + 1) << 10);
  if (exp >= 31) return sign | 0x7c00;
  return sign | (exp << 10) | (mant >> 13);
}

function f16ToF32(h: number): number {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  return e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
}

/** The tensor's values re-encoded as `to` (vectors go to f32). */
function convert(t: NativeTensor, to: "f32" | GgufDType): Buffer {
  const raw = readTensorBytes(t);
  if (to === t.dtype) return Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength);
  const n = t.byteLength / (t.dtype === "f32" ? 4 : 2);
  const values = new Float32Array(n);
  if (t.dtype === "f32") values.set(new Float32Array(raw.buffer, raw.byteOffset, n));
  else {
    const h = new Uint16Array(raw.buffer, raw.byteOffset, n);
    if (t.dtype === "bf16") { const bits = new Uint32Array(values.buffer); for (let i = 0; i < n; i++) bits[i] = h[i]! << 16; }
    else for (let i = 0; i < n; i++) values[i] = f16ToF32(h[i]!);
  }
  return encodeFloats(values, to);
}

/** float32 values as `to` (bf16 and f16 rounded to nearest, f16 subnormals flushed to zero). */
export function encodeFloats(values: Float32Array, to: "f32" | GgufDType): Buffer {
  if (to === "f32") return Buffer.from(values.buffer, values.byteOffset, values.byteLength);
  const n = values.length, out = new Uint16Array(n);
  if (to === "bf16") { const bits = new Uint32Array(values.buffer, values.byteOffset, n); for (let i = 0; i < n; i++) out[i] = (bits[i]! + 0x8000) >>> 16; }
  else for (let i = 0; i < n; i++) out[i] = f32ToF16(values[i]!);
  return Buffer.from(out.buffer);
}

/** Llama-arch GGUFs use interleaved rope: permute q/k rows from HF's rotate-half order (as llama.cpp's converter does). */
export function permuteRows(data: Buffer, rows: number, cols: number, heads: number, elem: number): Buffer {
  const out = Buffer.alloc(data.length);
  const hd = rows / heads, half = hd / 2, rowBytes = cols * elem;
  for (let h = 0; h < heads; h++)
    for (let i = 0; i < half; i++)
      for (let j = 0; j < 2; j++) {
        const src = h * hd + j * half + i, dst = h * hd + i * 2 + j;
        data.copy(out, dst * rowBytes, src * rowBytes, (src + 1) * rowBytes);
      }
  return out;
}

interface TokenizerJson {
  model: { type: string; vocab: Record<string, number>; merges: (string | [string, string])[]; byte_fallback?: boolean; unk_token?: string | null };
  added_tokens: { id: number; content: string; special: boolean }[];
}

/**
 * A SentencePiece BPE vocabulary (Llama 2, Mistral: byte fallback, "▁" for spaces) as llama.cpp's
 * `llama` tokenizer: scores that rank pieces in merge order (llama.cpp merges the highest-scoring
 * piece first), byte pieces typed BYTE, the unknown piece UNKNOWN.
 */
function sentencePieceMeta(tok: TokenizerJson, tokens: string[], types: number[]): Meta[] {
  const scores = tokens.map(() => 0);
  const seen = new Set<string>();
  tok.model.merges.forEach((m, rank) => {
    const piece = Array.isArray(m) ? m.join("") : m.replace(" ", "");
    const id = tok.model.vocab[piece];
    if (id !== undefined && id < tokens.length && !seen.has(piece)) { seen.add(piece); scores[id] = -rank; }
  });
  tokens.forEach((t, id) => {
    if (types[id] === 1 && /^<0x[0-9A-F]{2}>$/.test(t)) types[id] = 6;
    if (t === tok.model.unk_token) types[id] = 2;
  });
  return [
    ["tokenizer.ggml.model", "str", "llama"],
    ["tokenizer.ggml.tokens", "strs", tokens],
    ["tokenizer.ggml.scores", "f32s", scores],
    ["tokenizer.ggml.token_type", "i32s", types],
    ["tokenizer.ggml.add_space_prefix", "bool", true],
  ];
}

/** The `tokenizer.*` metadata for the tokenizer in `dir`, padded (or cut) to `vocabSize` ids. */
export function tokenizerMeta(dir: string, vocabSize: number, arch: string): Meta[] {
  const tok = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")) as TokenizerJson;
  if (tok.model.type !== "BPE" || !tok.model.merges) throw new Error("export-gguf supports BPE tokenizers (byte-level: Qwen, Llama 3; SentencePiece: Llama 2, Mistral)");
  const tokens: string[] = Array.from({ length: vocabSize }, (_, i) => `[PAD${i}]`);
  const types: number[] = Array.from({ length: vocabSize }, () => 5); // unused
  for (const [t, id] of Object.entries(tok.model.vocab)) if (id < vocabSize) { tokens[id] = t; types[id] = 1; }
  for (const a of tok.added_tokens) if (a.id < vocabSize) { tokens[a.id] = a.content; types[a.id] = a.special ? 3 : 4; }
  const cfgFile = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgFile) ? (JSON.parse(fs.readFileSync(cfgFile, "utf8")) as { chat_template?: string; add_bos_token?: boolean }) : {};
  const meta: Meta[] = tok.model.byte_fallback ? sentencePieceMeta(tok, tokens, types) : [
    ["tokenizer.ggml.model", "str", "gpt2"],
    ["tokenizer.ggml.pre", "str", arch === "llama" ? "llama-bpe" : "qwen2"],
    ["tokenizer.ggml.tokens", "strs", tokens],
    ["tokenizer.ggml.token_type", "i32s", types],
    ["tokenizer.ggml.merges", "strs", tok.model.merges.map((m) => (Array.isArray(m) ? m.join(" ") : m))],
  ];
  if (typeof cfg.chat_template === "string") meta.push(["tokenizer.chat_template", "str", cfg.chat_template]);
  meta.push(["tokenizer.ggml.add_bos_token", "bool", cfg.add_bos_token === true]);
  return meta;
}

/** A checkpoint tensor under its GGUF name; `permuteHeads`: the llama q/k rows to permute, in that many heads. */
export interface CheckpointGgufTensor {
  name: string;
  tensor: NativeTensor;
  permuteHeads: number | null;
}

/** A checkpoint as GGUF sees it: the metadata (model and tokenizer, no general.file_type) and the tensors by llama.cpp's names. */
export function checkpointGgufPlan(modelDir: string): { arch: string; layers: number; meta: Meta[]; tensors: CheckpointGgufTensor[] } {
  const ck = loadCheckpoint(modelDir);
  if (ck.quantization) throw new CheckpointError(modelDir, `export-gguf reads float checkpoints; this one is quantized (${ck.quantization})`);
  const c = ck.config;
  const arch = c.architecture === "Qwen3ForCausalLM" ? "qwen3" : c.architecture === "Qwen2ForCausalLM" ? "qwen2" : "llama";
  const meta: Meta[] = [
    ["general.architecture", "str", arch],
    ["general.name", "str", path.basename(path.resolve(modelDir))],
    ["general.alignment", "u32", ALIGN],
    [`${arch}.context_length`, "u32", c.maxPositions],
    [`${arch}.embedding_length`, "u32", c.hidden],
    [`${arch}.block_count`, "u32", c.layers],
    [`${arch}.feed_forward_length`, "u32", c.intermediate],
    [`${arch}.attention.head_count`, "u32", c.heads],
    [`${arch}.attention.head_count_kv`, "u32", c.kvHeads],
    [`${arch}.attention.key_length`, "u32", c.headDim],
    [`${arch}.attention.value_length`, "u32", c.headDim],
    [`${arch}.rope.freq_base`, "f32", c.ropeTheta],
    [`${arch}.attention.layer_norm_rms_epsilon`, "f32", c.rmsEps],
    ...tokenizerMeta(modelDir, c.vocab, arch),
  ];
  if (arch === "llama") meta.push([`llama.rope.dimension_count`, "u32", c.headDim], ["llama.vocab_size", "u32", c.vocab]);
  if (c.bosTokenId !== null) meta.push(["tokenizer.ggml.bos_token_id", "u32", c.bosTokenId]);
  if (c.eosTokenIds[0] !== undefined) meta.push(["tokenizer.ggml.eos_token_id", "u32", c.eosTokenIds[0]]);

  const w = ck.weights;
  const list: [string, NativeTensor, number | null][] = [["token_embd.weight", w.embed, null], ["output_norm.weight", w.finalNorm, null]];
  if (w.lmHead !== w.embed) list.push(["output.weight", w.lmHead, null]);
  const [qHeads, kHeads] = arch === "llama" ? [c.heads, c.kvHeads] : [null, null];
  w.layers.forEach((l, i) => {
    const b = `blk.${i}.`;
    list.push([`${b}attn_norm.weight`, l.attnNorm, null], [`${b}attn_q.weight`, l.wq, qHeads], [`${b}attn_k.weight`, l.wk, kHeads],
      [`${b}attn_v.weight`, l.wv, null], [`${b}attn_output.weight`, l.wo, null], [`${b}ffn_norm.weight`, l.mlpNorm, null],
      [`${b}ffn_gate.weight`, l.gate, null], [`${b}ffn_up.weight`, l.up, null], [`${b}ffn_down.weight`, l.down, null]);
    if (l.bq && l.bk && l.bv) list.push([`${b}attn_q.bias`, l.bq, null], [`${b}attn_k.bias`, l.bk, null], [`${b}attn_v.bias`, l.bv, null]);
    if (l.qNorm && l.kNorm) list.push([`${b}attn_q_norm.weight`, l.qNorm, null], [`${b}attn_k_norm.weight`, l.kNorm, null]);
  });
  return { arch, layers: c.layers, meta, tensors: list.map(([name, tensor, permuteHeads]) => ({ name, tensor, permuteHeads })) };
}

export function exportGguf(modelDir: string, out: string, dtype: GgufDType = "f16"): { tensors: number; bytes: number } {
  const plan = checkpointGgufPlan(modelDir);
  const tensors = plan.tensors.map(({ name, tensor: t, permuteHeads }): GgufTensorOut => {
    const type = t.shape.length === 1 ? "F32" : dtype === "f16" ? "F16" : "BF16";
    return {
      name, type, shape: t.shape,
      data: () => {
        const data = convert(t, type === "F32" ? "f32" : dtype);
        return permuteHeads ? permuteRows(data, t.shape[0]!, t.shape[1]!, permuteHeads, 2) : data;
      },
    };
  });
  writeGguf(out, plan.meta, tensors);
  return { tensors: tensors.length, bytes: fs.statSync(out).size };
}

/** One tensor to write: its row-major shape, and its data in `type`'s encoding, produced when it is written. */
export interface GgufTensorOut {
  name: string;
  type: GgmlType;
  shape: number[];
  data: () => Uint8Array;
}

/** Writes a GGUF v3 file: the metadata, then each tensor's data, aligned to ALIGN (which `meta` should state). */
export function writeGguf(out: string, meta: Meta[], tensors: GgufTensorOut[]): void {
  const header = new Writer();
  header.push(Buffer.from("GGUF", "ascii"));
  header.u32(3);
  header.u64(tensors.length);
  header.u64(meta.length);
  for (const m of meta) writeMeta(header, m);
  let offset = 0;
  const plan = tensors.map((t) => {
    const { blockSize, blockBytes } = GGML_TYPES[t.type];
    const bytes = (t.shape.reduce((a, b) => a * b, 1) / blockSize) * blockBytes;
    header.str(t.name);
    header.u32(t.shape.length);
    for (const d of [...t.shape].reverse()) header.u64(d); // ggml lists dimensions innermost first
    header.u32(GGML_TYPES[t.type].id);
    header.u64(offset);
    const entry = { t, at: offset, bytes };
    offset += Math.ceil(bytes / ALIGN) * ALIGN;
    return entry;
  });
  const fd = fs.openSync(out, "w");
  try {
    const head = header.buffer();
    fs.writeSync(fd, head);
    fs.writeSync(fd, Buffer.alloc((ALIGN - (head.length % ALIGN)) % ALIGN));
    let written = 0;
    for (const p of plan) {
      const data = p.t.data();
      if (data.length !== p.bytes) throw new Error(`${p.t.name}: ${data.length} bytes of data, its shape and type need ${p.bytes}`);
      fs.writeSync(fd, Buffer.alloc(p.at - written));
      fs.writeSync(fd, data);
      written = p.at + data.length;
    }
    fs.writeSync(fd, Buffer.alloc(offset - written));
  } finally {
    fs.closeSync(fd);
  }
}
