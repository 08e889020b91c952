/**
 * `weft quantize`: a checkpoint (a Hugging Face directory in bf16/f16/f32, or a
 * float GGUF) written as a quantized GGUF that llama.cpp loads. The blocks come
 * from the addon's quantizer (native/quantize.cpp); which tensor gets which type
 * follows llama.cpp's recipes (`tensorTypeFor`); the file is written by the one
 * GGUF writer (gguf-export.ts).
 */
import fs from "node:fs";
import path from "node:path";
import { CheckpointError } from "./errors.js";
import { GGML_TYPES, readGguf, type GgmlType, type GgufTensor, type GgufValue } from "./gguf.js";
import { dequantize } from "./gguf-dequant.js";
import { ALIGN, checkpointGgufPlan, encodeFloats, permuteRows, writeGguf, type GgufTensorOut, type Meta } from "./gguf-export.js";
import { loadNative, type QuantizeType } from "../runtime/native.js";

/** The file types `weft quantize --type` writes (llama.cpp's names for them). */
export const QUANT_RECIPES = ["q8_0", "q4_0", "q4_k_m", "q5_k_m", "q6_k"] as const;
export type QuantRecipe = (typeof QUANT_RECIPES)[number];

/** llama.cpp's llama_ftype of each recipe, written as general.file_type. */
const FILE_TYPE: Record<QuantRecipe, number> = { q8_0: 7, q4_0: 2, q4_k_m: 15, q5_k_m: 17, q6_k: 18 };

/** The type most matrices get. */
const BASE_TYPE: Record<QuantRecipe, GgmlType> = { q8_0: "Q8_0", q4_0: "Q4_0", q4_k_m: "Q4_K", q5_k_m: "Q5_K", q6_k: "Q6_K" };

/** ggml's QUANT_VERSION, which llama.cpp writes with quantized files. */
const QUANTIZATION_VERSION = 2;

/** llama.cpp's use_more_bits: the first and last eighth of the layers (integer eighths), and every third one between. */
function moreBits(layer: number, layers: number): boolean {
  const eighth = Math.floor(layers / 8);
  return layer < eighth || layer >= Math.floor((7 * layers) / 8) || (layer - eighth) % 3 === 2;
}

/**
 * The type of one tensor, as llama.cpp's quantizer picks it (llama_tensor_get_type, simplified to
 * these recipes): vectors stay F32; the output matrix (the token embedding when it is tied) is Q6_K
 * except in Q8_0 files; _M recipes give Q6_K to attn_v and ffn_down of the layers `moreBits` picks.
 * A row that is not whole K-quant blocks (256) falls back to Q8_0 (llama.cpp: Q5_0/Q5_1/Q8_0, which
 * Weft does not all read), and one that is not whole 32-blocks to F16.
 */
export function tensorTypeFor(recipe: QuantRecipe, name: string, shape: number[], layers: number, hasOutput: boolean): GgmlType {
  if (shape.length < 2) return "F32";
  let type = BASE_TYPE[recipe];
  const layer = Number(/^blk\.(\d+)\./.exec(name)?.[1] ?? -1);
  if (name === "output.weight" || (!hasOutput && name === "token_embd.weight")) type = recipe === "q8_0" ? "Q8_0" : "Q6_K";
  else if ((recipe === "q4_k_m" || recipe === "q5_k_m") && /\.(attn_v|ffn_down)\.weight$/.test(name) && moreBits(layer, layers)) type = "Q6_K";
  const cols = shape[shape.length - 1]!;
  if (cols % GGML_TYPES[type].blockSize !== 0) type = cols % 32 === 0 ? "Q8_0" : "F16";
  return type;
}

/** A float tensor to quantize: where its values are and how they are stored. */
interface Source {
  name: string;
  shape: number[];
  file: string;
  offset: number;
  type: "F32" | "F16" | "BF16";
  permuteHeads: number | null;
}

const NATIVE_FLOAT: Record<string, Source["type"]> = { f32: "F32", f16: "F16", bf16: "BF16" };

/** Scratch for one chunk, reused: fresh buffers of many MB per chunk would leave the work to the GC. */
let scratchBytes = new Uint8Array(0);
let scratchValues = new Float32Array(0);

/**
 * Rows [r0, r1) of the tensor as float32 (the whole tensor when its rows are permuted), in scratch
 * memory that the next call reuses.
 */
function readRows(fd: number, s: Source, r0: number, r1: number): Float32Array {
  const cols = s.shape[s.shape.length - 1]!, n = (r1 - r0) * cols;
  const elem = GGML_TYPES[s.type].blockBytes;
  if (scratchBytes.length < n * 4) scratchBytes = new Uint8Array(n * 4);
  const bytes = scratchBytes.subarray(0, n * elem);
  fs.readSync(fd, bytes, 0, bytes.length, s.offset + r0 * cols * elem);
  let values: Float32Array;
  if (s.type === "F32") values = new Float32Array(bytes.buffer, 0, n);
  else if (s.type === "F16") values = dequantize("F16", bytes, n);
  else {
    // bf16 is the top half of a float32.
    if (scratchValues.length < n) scratchValues = new Float32Array(n);
    values = scratchValues.subarray(0, n);
    const half = new Uint16Array(bytes.buffer, 0, n), bits = new Uint32Array(values.buffer, 0, n);
    for (let i = 0; i < n; i++) bits[i] = half[i]! << 16;
  }
  if (!s.permuteHeads) return values;
  const p = permuteRows(Buffer.from(values.buffer, values.byteOffset, values.byteLength), s.shape[0]!, cols, s.permuteHeads, 4);
  return new Float32Array(p.buffer, p.byteOffset, values.length);
}

/** Values read per chunk: the quantizer works on this many at a time (rows stay whole). */
const CHUNK = 1 << 23;

/** The tensor's data in `type`. */
function encode(s: Source, type: GgmlType): Uint8Array {
  const cols = s.shape[s.shape.length - 1]!, rows = s.shape.reduce((a, b) => a * b, 1) / cols;
  const step = s.permuteHeads ? rows : Math.max(1, Math.floor(CHUNK / cols));
  const parts: Uint8Array[] = [];
  const fd = fs.openSync(s.file, "r");
  try {
    for (let r0 = 0; r0 < rows; r0 += step) {
      const values = readRows(fd, s, r0, Math.min(rows, r0 + step));
      if (type === "F32" || type === "F16" || type === "BF16") parts.push(Buffer.from(encodeFloats(values, type === "F32" ? "f32" : type === "F16" ? "f16" : "bf16")));
      else {
        try {
          parts.push(loadNative().quantizeWeights(type.toLowerCase() as QuantizeType, values, cols));
        } catch (e) {
          // The addon counts rows within this chunk.
          const msg = (e as Error).message.replace(/of row (\d+)/, (_, r: string) => `of row ${Number(r) + r0}`);
          throw new CheckpointError(s.file, `cannot quantize to ${type}: ${msg}`, s.name);
        }
      }
    }
  } finally {
    fs.closeSync(fd);
  }
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
}

/** A float GGUF's metadata (without what this writer sets) and tensors. */
function ggufSources(file: string): { meta: Meta[]; sources: Source[]; layers: number } {
  const g = readGguf(file);
  const meta: Meta[] = [];
  for (const [key, value] of g.metadata) {
    if (key === "general.alignment" || key === "general.file_type" || key === "general.quantization_version") continue;
    meta.push(metaEntry(file, key, g.metadataTypes.get(key)!, value));
  }
  const arch = g.metadata.get("general.architecture");
  const layers = g.metadata.get(`${String(arch)}.block_count`);
  if (typeof layers !== "number") throw new CheckpointError(file, `missing metadata ${String(arch)}.block_count`);
  const sources = [...g.tensors.values()].map((t: GgufTensor): Source => {
    if (t.type !== "F32" && t.type !== "F16" && t.type !== "BF16") {
      throw new CheckpointError(file, `is already ${t.type}: weft quantize takes float (F32, F16, BF16) tensors, so that nothing is quantized twice`, t.name);
    }
    return { name: t.name, shape: t.shape, file, offset: t.offset, type: t.type, permuteHeads: null };
  });
  return { meta, sources, layers };
}

function metaEntry(file: string, key: string, type: string, value: GgufValue): Meta {
  const plain = (v: GgufValue): number | string | boolean => {
    if (typeof v === "bigint" || Array.isArray(v)) throw new CheckpointError(file, `metadata ${key} (${type}) cannot be copied: 64-bit values beyond 2^53 and nested arrays are not written`);
    return v;
  };
  return (Array.isArray(value) ? [key, type, value.map(plain)] : [key, type, plain(value)]) as Meta;
}

export interface QuantizeResult {
  tensors: number;
  bytes: number;
  /** How many tensors got each type. */
  types: Partial<Record<GgmlType, number>>;
  seconds: number;
}

/** Writes `src` (a model directory or a float GGUF file) to `out` as a GGUF of `recipe`'s types. */
export function quantizeModel(src: string, out: string, recipe: QuantRecipe, log?: (msg: string) => void): QuantizeResult {
  const start = performance.now();
  let meta: Meta[], sources: Source[], layers: number;
  if (src.endsWith(".gguf") && fs.statSync(src, { throwIfNoEntry: false })?.isFile()) ({ meta, sources, layers } = ggufSources(src));
  else {
    const plan = checkpointGgufPlan(src);
    meta = plan.meta.filter(([k]) => k !== "general.alignment");
    layers = plan.layers;
    sources = plan.tensors.map(({ name, tensor, permuteHeads }) => {
      const type = NATIVE_FLOAT[tensor.dtype];
      if (!type) throw new CheckpointError(tensor.file, `is ${tensor.dtype}: weft quantize takes float (f32, f16, bf16) weights`, name);
      return { name, shape: tensor.shape, file: tensor.file, offset: tensor.offset, type, permuteHeads };
    });
  }
  meta.push(["general.alignment", "u32", ALIGN], ["general.file_type", "u32", FILE_TYPE[recipe]], ["general.quantization_version", "u32", QUANTIZATION_VERSION]);
  const hasOutput = sources.some((s) => s.name === "output.weight");
  const types: Partial<Record<GgmlType, number>> = {};
  let done = 0;
  const tensors = sources.map((s): GgufTensorOut => {
    const type = tensorTypeFor(recipe, s.name, s.shape, layers, hasOutput);
    types[type] = (types[type] ?? 0) + 1;
    return {
      name: s.name, type, shape: s.shape,
      data: () => {
        const data = encode(s, type);
        done++;
        if (s.shape.length > 1) log?.(`[${done}/${sources.length}] ${s.name} ${s.shape.join("×")} → ${type}`);
        return data;
      },
    };
  });
  fs.mkdirSync(path.dirname(path.resolve(out)), { recursive: true });
  writeGguf(out, meta, tensors);
  return { tensors: tensors.length, bytes: fs.statSync(out).size, types, seconds: (performance.now() - start) / 1000 };
}
