/**
 * Reference dequantization of GGUF tensor data to float32, bit-exact with
 * llama.cpp's `dequantize_row_*` (ggml-quants.c): every float operation is
 * rounded to float32 in the same order as the C code (Math.fround after each
 * step; a product of two float32 values is exact in a double, so rounding it
 * once gives the float32 product). Block layouts are ggml's, little-endian.
 */
import { GGML_TYPES, type GgmlType } from "./gguf.js";

const fr = Math.fround;

const f16Table = new Float32Array(65536);
for (let h = 0; h < 65536; h++) {
  const s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  f16Table[h] = e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
}

function f16(b: Uint8Array, at: number): number {
  return f16Table[b[at]! | (b[at + 1]! << 8)]!;
}

/** The 6-bit scale and min of sub-block `j` of a Q4_K / Q5_K block (ggml's get_scale_min_k4). */
function scaleMin(j: number, q: Uint8Array, at: number): [number, number] {
  if (j < 4) return [q[at + j]! & 63, q[at + j + 4]! & 63];
  return [(q[at + j + 4]! & 0xf) | ((q[at + j - 4]! >> 6) << 4), (q[at + j + 4]! >> 4) | ((q[at + j]! >> 6) << 4)];
}

function q8_0(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at);
  for (let j = 0; j < 32; j++) y[o + j] = d * ((b[at + 2 + j]! << 24) >> 24);
}

function q4_0(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at);
  for (let j = 0; j < 16; j++) {
    const q = b[at + 2 + j]!;
    y[o + j] = ((q & 0xf) - 8) * d;
    y[o + j + 16] = ((q >> 4) - 8) * d;
  }
}

function q4_1(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at), m = f16(b, at + 2);
  for (let j = 0; j < 16; j++) {
    const q = b[at + 4 + j]!;
    y[o + j] = fr((q & 0xf) * d) + m;
    y[o + j + 16] = fr((q >> 4) * d) + m;
  }
}

/** Q4_K: d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit quants; 8 sub-blocks of 32. */
function q4_k(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at), min = f16(b, at + 2), sc = at + 4;
  let q = at + 16;
  for (let j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
    const [s1, m1i] = scaleMin(is, b, sc), [s2, m2i] = scaleMin(is + 1, b, sc);
    const d1 = fr(d * s1), m1 = fr(min * m1i), d2 = fr(d * s2), m2 = fr(min * m2i);
    for (let l = 0; l < 32; l++) y[o + j + l] = fr(d1 * (b[q + l]! & 0xf)) - m1;
    for (let l = 0; l < 32; l++) y[o + j + 32 + l] = fr(d2 * (b[q + l]! >> 4)) - m2;
  }
}

/** Q5_K: as Q4_K plus 32 bytes of high bits (qh) before the low nibbles. */
function q5_k(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at), min = f16(b, at + 2), sc = at + 4, qh = at + 16;
  let ql = at + 48, u1 = 1, u2 = 2;
  for (let j = 0, is = 0; j < 256; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
    const [s1, m1i] = scaleMin(is, b, sc), [s2, m2i] = scaleMin(is + 1, b, sc);
    const d1 = fr(d * s1), m1 = fr(min * m1i), d2 = fr(d * s2), m2 = fr(min * m2i);
    for (let l = 0; l < 32; l++) y[o + j + l] = fr(d1 * ((b[ql + l]! & 0xf) + (b[qh + l]! & u1 ? 16 : 0))) - m1;
    for (let l = 0; l < 32; l++) y[o + j + 32 + l] = fr(d2 * ((b[ql + l]! >> 4) + (b[qh + l]! & u2 ? 16 : 0))) - m2;
  }
}

/** Q6_K: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 int8 scales, then d (f16); 16 sub-blocks of 16. */
function q6_k(b: Uint8Array, at: number, y: Float32Array, o: number): void {
  const d = f16(b, at + 208);
  for (let n = 0; n < 2; n++) {
    const ql = at + n * 64, qh = at + 128 + n * 32, sc = at + 192 + n * 8, out = o + n * 128;
    for (let l = 0; l < 32; l++) {
      const is = l >> 4, h = b[qh + l]!;
      const q1 = ((b[ql + l]! & 0xf) | ((h & 3) << 4)) - 32;
      const q2 = ((b[ql + l + 32]! & 0xf) | (((h >> 2) & 3) << 4)) - 32;
      const q3 = ((b[ql + l]! >> 4) | (((h >> 4) & 3) << 4)) - 32;
      const q4 = ((b[ql + l + 32]! >> 4) | (((h >> 6) & 3) << 4)) - 32;
      y[out + l] = fr(d * ((b[sc + is]! << 24) >> 24)) * q1;
      y[out + l + 32] = fr(d * ((b[sc + is + 2]! << 24) >> 24)) * q2;
      y[out + l + 64] = fr(d * ((b[sc + is + 4]! << 24) >> 24)) * q3;
      y[out + l + 96] = fr(d * ((b[sc + is + 6]! << 24) >> 24)) * q4;
    }
  }
}

type BlockFn = (b: Uint8Array, at: number, y: Float32Array, o: number) => void;

const BLOCK_FNS: Record<Exclude<GgmlType, "F32" | "BF16">, BlockFn> = {
  F16: (b, at, y, o) => { y[o] = f16(b, at); },
  Q8_0: q8_0,
  Q4_0: q4_0,
  Q4_1: q4_1,
  Q4_K: q4_k,
  Q5_K: q5_k,
  Q6_K: q6_k,
};

/** `count` values of `type` from `data` (whole blocks) as float32. */
export function dequantize(type: GgmlType, data: Uint8Array, count: number): Float32Array {
  const { blockSize, blockBytes } = GGML_TYPES[type];
  if (count % blockSize !== 0) throw new Error(`${count} values is not a whole number of ${type} blocks of ${blockSize}`);
  const blocks = count / blockSize;
  if (data.length < blocks * blockBytes) throw new Error(`${type}: ${count} values need ${blocks * blockBytes} bytes, got ${data.length}`);
  if (type === "F32") return new Float32Array(data.slice(0, count * 4).buffer);
  const y = new Float32Array(count);
  if (type === "BF16") {
    const bits = new Uint32Array(y.buffer);
    for (let i = 0; i < count; i++) bits[i] = (data[2 * i]! | (data[2 * i + 1]! << 8)) << 16;
    return y;
  }
  const fn = BLOCK_FNS[type];
  for (let i = 0; i < blocks; i++) fn(data, i * blockBytes, y, i * blockSize);
  return y;
}
