/**
 * safetensors headers: read, and checked against the file before any byte of
 * tensor data is trusted. The data itself is memory-mapped by the addon.
 */
import fs from "node:fs";
import { CheckpointError } from "./errors.js";
import type { NativeDType, NativeTensor } from "../runtime/native.js";

const DTYPES: Record<string, { dtype: NativeDType; bytes: number }> = {
  F32: { dtype: "f32", bytes: 4 },
  F16: { dtype: "f16", bytes: 2 },
  BF16: { dtype: "bf16", bytes: 2 },
  U32: { dtype: "u32", bytes: 4 },  // MLX's packed quantized words
};

/** A header larger than this is not a real checkpoint (the format caps it at 100 MB). */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

interface RawEntry {
  dtype?: unknown;
  shape?: unknown;
  data_offsets?: unknown;
}

function readHeader(file: string): { header: Record<string, unknown>; dataStart: number; fileSize: number } {
  const fd = fs.openSync(file, "r");
  try {
    const fileSize = fs.fstatSync(fd).size;
    if (fileSize < 8) throw new CheckpointError(file, `truncated file: ${fileSize} bytes, too short for a safetensors header`);
    const lenBuf = Buffer.alloc(8);
    fs.readSync(fd, lenBuf, 0, 8, 0);
    const headerLen = Number(lenBuf.readBigUInt64LE(0));
    if (headerLen > MAX_HEADER_BYTES) throw new CheckpointError(file, `header length ${headerLen} is not plausible`);
    if (8 + headerLen > fileSize) {
      throw new CheckpointError(file, `truncated file: header needs ${8 + headerLen} bytes, file has ${fileSize}`);
    }
    const buf = Buffer.alloc(headerLen);
    fs.readSync(fd, buf, 0, headerLen, 8);
    let header: unknown;
    try {
      header = JSON.parse(buf.toString("utf8"));
    } catch {
      throw new CheckpointError(file, "header is not valid JSON");
    }
    if (typeof header !== "object" || header === null || Array.isArray(header)) {
      throw new CheckpointError(file, "header is not a JSON object");
    }
    return { header: header as Record<string, unknown>, dataStart: 8 + headerLen, fileSize };
  } finally {
    fs.closeSync(fd);
  }
}

function parseEntry(file: string, name: string, raw: RawEntry, dataStart: number): NativeTensor & { begin: number; end: number } {
  const info = typeof raw.dtype === "string" ? DTYPES[raw.dtype] : undefined;
  if (!info) throw new CheckpointError(file, `unsupported dtype ${String(raw.dtype)} (supported: F32, F16, BF16, and U32 for MLX-quantized weights)`, name);
  const shape = raw.shape;
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) {
    throw new CheckpointError(file, "shape is not a list of non-negative integers", name);
  }
  const offs = raw.data_offsets;
  if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0)) {
    throw new CheckpointError(file, "data_offsets must be two non-negative integers", name);
  }
  const [begin, end] = offs as [number, number];
  if (end < begin) throw new CheckpointError(file, `data_offsets [${begin}, ${end}] end before they begin`, name);
  const byteLength = (shape as number[]).reduce((a, b) => a * b, 1) * info.bytes;
  if (end - begin !== byteLength) {
    throw new CheckpointError(file, `data_offsets span ${end - begin} bytes but shape [${shape.join(", ")}] ${raw.dtype as string} needs ${byteLength}`, name);
  }
  return { file, offset: dataStart + begin, byteLength, dtype: info.dtype, shape: shape as number[], begin, end };
}

/** Every tensor of one safetensors file, validated: offsets inside the file, no overlaps. */
export function readSafetensors(file: string): Map<string, NativeTensor> {
  const { header, dataStart, fileSize } = readHeader(file);
  const dataSize = fileSize - dataStart;
  const entries = Object.entries(header)
    .filter(([name]) => name !== "__metadata__")
    .map(([name, raw]) => ({ name, ...parseEntry(file, name, (raw ?? {}) as RawEntry, dataStart) }))
    .sort((a, b) => a.begin - b.begin || a.end - b.end);
  const last = entries.at(-1);
  for (const e of entries) {
    if (e.end <= dataSize) continue;
    // The last tensor running past the end means the file was cut short; any other tensor pointing past it is a bad header.
    if (e === last && e.begin <= dataSize) {
      throw new CheckpointError(file, `truncated file: data ends at byte ${dataSize} but the tensor needs bytes up to ${e.end}`, e.name);
    }
    throw new CheckpointError(file, `header offsets [${e.begin}, ${e.end}] lie outside the file's ${dataSize} data bytes`, e.name);
  }
  for (let i = 1; i < entries.length; i++) {
    const prev = entries[i - 1]!, cur = entries[i]!;
    if (cur.begin < prev.end && cur.byteLength > 0 && prev.byteLength > 0) {
      throw new CheckpointError(file, `header offsets overlap tensor ${prev.name} ([${prev.begin}, ${prev.end}] and [${cur.begin}, ${cur.end}])`, cur.name);
    }
  }
  return new Map(entries.map((e) => [e.name, { file: e.file, offset: e.offset, byteLength: e.byteLength, dtype: e.dtype, shape: e.shape }]));
}

export interface TensorToWrite {
  name: string;
  dtype: "F32" | "F16" | "BF16" | "U32";
  shape: number[];
  /** The bytes, or a function producing them when written (keeps one tensor in memory at a time). */
  data: Uint8Array | (() => Uint8Array);
}

/** Writes tensors as one safetensors file, data 8-byte aligned. */
export function writeSafetensors(file: string, tensors: TensorToWrite[]): void {
  let offset = 0;
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  for (const t of tensors) {
    const bytes = t.shape.reduce((a, b) => a * b, 1) * DTYPES[t.dtype]!.bytes;
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - ((Buffer.byteLength(json) + 8) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  const fd = fs.openSync(file, "w");
  try {
    fs.writeSync(fd, len);
    fs.writeSync(fd, json);
    for (const t of tensors) {
      const data = typeof t.data === "function" ? t.data() : t.data;
      fs.writeSync(fd, data);
    }
  } finally {
    fs.closeSync(fd);
  }
}

/** The raw bytes of a tensor returned by readSafetensors. */
export function readTensorBytes(t: NativeTensor): Uint8Array {
  const fd = fs.openSync(t.file, "r");
  try {
    const buf = new Uint8Array(t.byteLength);
    fs.readSync(fd, buf, 0, t.byteLength, t.offset);
    return buf;
  } finally {
    fs.closeSync(fd);
  }
}
