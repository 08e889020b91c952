/**
 * MLX's affine quantizer in TypeScript (as mlx.core.quantize computes it, operation by operation
 * in float32), its dequantization, and checkpoint writers built on them: an MLX-quantized copy
 * of a float checkpoint and a float32 copy of its dequantized weights, for the tests.
 */
import fs from "node:fs";
import path from "node:path";
import { readSafetensors, readTensorBytes, writeSafetensors, type TensorToWrite } from "../../src/model/safetensors.js";
import type { NativeTensor } from "../../src/runtime/native.js";

const fr = Math.fround;
const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);

export function bf16ToF32(h: number): number {
  u32[0] = h << 16;
  return f32[0]!;
}

/** Nearest-even to bf16, as MLX's astype. */
export function f32ToBf16(x: number): number {
  f32[0] = x;
  const v = u32[0]!;
  return ((v + 0x7fff + ((v >>> 16) & 1)) >>> 16) & 0xffff;
}

/** Round half to even (MLX's round). */
function rint(x: number): number {
  const r = Math.round(x);
  return r - x === 0.5 && r % 2 !== 0 ? r - 1 : r;
}

export interface MlxQuantized {
  words: Uint32Array;
  scales: Uint16Array; // bf16
  biases: Uint16Array; // bf16
}

/**
 * `w` (rows × cols) quantized per group as MLX does: per group the min and max; the edge of larger
 * magnitude is kept exact by choosing the scale's sign, scale = ±max((max − min)/(2^bits − 1), 1e-7),
 * q0 = round(edge / scale), scale = edge / q0 (unless q0 = 0), bias = edge (0 when q0 = 0);
 * q = clip(round((w − bias) / scale), 0, 2^bits − 1) with the float32 scale and bias, which are then
 * rounded to bf16. Element j of a word holds q at bits [bits·j, bits·(j+1)).
 */
export function mlxQuantize(w: Float32Array, rows: number, cols: number, bits: number, group: number): MlxQuantized {
  const nBins = (1 << bits) - 1, perWord = 32 / bits, groups = (rows * cols) / group;
  const words = new Uint32Array((rows * cols) / perWord), scales = new Uint16Array(groups), biases = new Uint16Array(groups);
  for (let g = 0; g < groups; g++) {
    let max = -Infinity, min = Infinity;
    for (let i = g * group; i < (g + 1) * group; i++) { max = Math.max(max, w[i]!); min = Math.min(min, w[i]!); }
    const mask = Math.abs(min) > Math.abs(max);
    let scale = Math.max(fr(fr(max - min) / nBins), fr(1e-7));
    if (!mask) scale = -scale;
    const edge = mask ? min : max;
    const q0 = rint(fr(edge / scale));
    if (q0 !== 0) scale = fr(edge / q0);
    const bias = q0 === 0 ? 0 : edge;
    for (let i = g * group; i < (g + 1) * group; i++) {
      const q = Math.min(nBins, Math.max(0, rint(fr(fr(w[i]! - bias) / scale))));
      words[Math.floor(i / perWord)] = (words[Math.floor(i / perWord)]! | (q << (bits * (i % perWord)))) >>> 0;
    }
    scales[g] = f32ToBf16(scale);
    biases[g] = f32ToBf16(bias);
  }
  return { words, scales, biases };
}

/** The weights scale·q + bias in float32 (scale·q is exact: a bf16 times an integer below 2^8). */
export function mlxDequantize(q: MlxQuantized, rows: number, cols: number, bits: number, group: number): Float32Array {
  const perWord = 32 / bits, mask = (1 << bits) - 1, out = new Float32Array(rows * cols);
  for (let i = 0; i < rows * cols; i++) {
    const v = (q.words[Math.floor(i / perWord)]! >>> (bits * (i % perWord))) & mask;
    const g = Math.floor(i / group);
    out[i] = fr(bf16ToF32(q.scales[g]!) * v + bf16ToF32(q.biases[g]!));
  }
  return out;
}

/** A float tensor of a checkpoint as float32 values. */
export function readFloats(t: NativeTensor): Float32Array {
  const raw = readTensorBytes(t);
  if (t.dtype === "f32") return new Float32Array(raw.buffer, raw.byteOffset, raw.byteLength / 4);
  if (t.dtype !== "bf16") throw new Error(`readFloats: ${t.dtype}`);
  const h = new Uint16Array(raw.buffer, raw.byteOffset, raw.byteLength / 2);
  const out = new Float32Array(h.length), bits = new Uint32Array(out.buffer);
  for (let i = 0; i < h.length; i++) bits[i] = h[i]! << 16;
  return out;
}

const bytes = (a: ArrayBufferView): Uint8Array => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

export interface MlxCopyOptions {
  bits: 4 | 8;
  groupSize: number;
  /** Per-layer entries of `quantization`, as mlx-lm writes them. */
  overrides?: Record<string, { bits: 4 | 8; group_size: number } | false>;
}

/**
 * `src` (a float checkpoint dir) as an MLX-quantized checkpoint in `mlxDir` and, when `f32Dir` is
 * given, its dequantized weights as a float32 checkpoint there. As mlx-lm does, every 2-D weight
 * whose input dimension divides by its group size is quantized; the rest stay float (written as
 * F32). Tensors are made as they are written: one module in memory at a time.
 */
export function writeMlxCopy(src: string, mlxDir: string, f32Dir: string | null, o: MlxCopyOptions): void {
  const tensors = readSafetensors(path.join(src, "model.safetensors"));
  const mlx: TensorToWrite[] = [], plain: TensorToWrite[] = [];
  let memo: { name: string; q: MlxQuantized } | null = null;
  for (const [name, t] of tensors) {
    const module = name.replace(/\.weight$/, "");
    const override = o.overrides?.[module];
    const p = override === undefined ? { bits: o.bits, group_size: o.groupSize } : override;
    const [rows, cols] = t.shape as [number, number];
    if (t.shape.length === 2 && name.endsWith(".weight") && p && cols % p.group_size === 0) {
      const quantized = (): MlxQuantized => {
        if (memo?.name !== name) memo = { name, q: mlxQuantize(readFloats(t), rows, cols, p.bits, p.group_size) };
        return memo.q;
      };
      const params = [rows, cols / p.group_size];
      mlx.push({ name, dtype: "U32", shape: [rows, (cols * p.bits) / 32], data: () => bytes(quantized().words) },
        { name: `${module}.scales`, dtype: "BF16", shape: params, data: () => bytes(quantized().scales) },
        { name: `${module}.biases`, dtype: "BF16", shape: params, data: () => bytes(quantized().biases) });
      plain.push({ name, dtype: "F32", shape: t.shape, data: () => bytes(mlxDequantize(quantized(), rows, cols, p.bits, p.group_size)) });
    } else {
      mlx.push({ name, dtype: "F32", shape: t.shape, data: () => bytes(readFloats(t)) });
      plain.push({ name, dtype: "F32", shape: t.shape, data: () => bytes(readFloats(t)) });
    }
  }
  const config = JSON.parse(fs.readFileSync(path.join(src, "config.json"), "utf8")) as Record<string, unknown>;
  const quantization = { group_size: o.groupSize, bits: o.bits, ...o.overrides };
  const outputs = [[mlxDir, mlx, { ...config, quantization, quantization_config: quantization }]] as [string, TensorToWrite[], Record<string, unknown>][];
  if (f32Dir) outputs.push([f32Dir, plain, config]);
  for (const [dir, list, cfg] of outputs) {
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify(cfg));
    for (const f of ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]) {
      if (fs.existsSync(path.join(src, f))) fs.copyFileSync(path.join(src, f), path.join(dir, f));
    }
    writeSafetensors(path.join(dir, "model.safetensors"), list);
  }
}
