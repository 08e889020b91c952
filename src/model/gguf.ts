/**
 * A GGUF (v2/v3) reader: header, metadata, tensor table. Tensor data stays
 * in the file; every tensor is checked against the file before it is
 * returned (known type, whole blocks, inside the file, no overlap), and every
 * error names the file and, where there is one, the tensor.
 */
import fs from "node:fs";
import { CheckpointError } from "./errors.js";

/** The ggml tensor types Weft reads, with their block shape (elements per block, bytes per block). */
export const GGML_TYPES = {
  F32: { id: 0, blockSize: 1, blockBytes: 4 },
  F16: { id: 1, blockSize: 1, blockBytes: 2 },
  Q4_0: { id: 2, blockSize: 32, blockBytes: 18 },
  Q4_1: { id: 3, blockSize: 32, blockBytes: 20 },
  Q8_0: { id: 8, blockSize: 32, blockBytes: 34 },
  Q4_K: { id: 12, blockSize: 256, blockBytes: 144 },
  Q5_K: { id: 13, blockSize: 256, blockBytes: 176 },
  Q6_K: { id: 14, blockSize: 256, blockBytes: 210 },
  BF16: { id: 30, blockSize: 1, blockBytes: 2 },
} as const;

export type GgmlType = keyof typeof GGML_TYPES;

/** ggml's names for the types Weft does not read, so errors can name them. */
const OTHER_TYPE_NAMES: Record<number, string> = {
  6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
  19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64",
  28: "F64", 29: "IQ1_M", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
};

const TYPE_BY_ID = new Map<number, GgmlType>(Object.entries(GGML_TYPES).map(([name, t]) => [t.id, name as GgmlType]));

export type GgufValue = number | bigint | boolean | string | GgufValue[];

export interface GgufTensor {
  name: string;
  type: GgmlType;
  /** Row-major shape, outermost first ([rows, cols] for a matrix), as safetensors and NativeTensor give it. */
  shape: number[];
  /** Absolute byte offset of the data in the file. */
  offset: number;
  byteLength: number;
}

export interface Gguf {
  file: string;
  version: number;
  alignment: number;
  /** Absolute offset of the tensor data section. */
  dataOffset: number;
  metadata: Map<string, GgufValue>;
  /** Each metadata key's value type, so the metadata can be written again as it was. */
  metadataTypes: Map<string, GgufValueType>;
  tensors: Map<string, GgufTensor>;
}

/** Metadata value type ids. */
const V = { u8: 0, i8: 1, u16: 2, i16: 3, u32: 4, i32: 5, f32: 6, bool: 7, str: 8, arr: 9, u64: 10, i64: 11, f64: 12 } as const;

/** ggml's GGML_MAX_DIMS. */
const MAX_DIMS = 4;

/** A forward-only reader over the file, refilling a window as the header is parsed (vocabularies run to megabytes). */
class HeaderReader {
  private buf = Buffer.alloc(0);
  private start = 0; // file offset of buf[0]
  private pos = 0; // file offset of the next byte
  constructor(
    private readonly fd: number,
    readonly fileSize: number,
    private readonly file: string,
  ) {}

  get offset(): number {
    return this.pos;
  }

  /** `n` bytes at the cursor, which then moves past them. */
  take(n: number, what: string): Buffer {
    if (this.pos + n > this.fileSize) throw new CheckpointError(this.file, `truncated: ${what} runs past the end of the file (${this.fileSize} bytes)`);
    if (this.pos + n > this.start + this.buf.length) {
      const size = Math.max(n, 1 << 20);
      const next = Buffer.alloc(Math.min(size, this.fileSize - this.pos));
      fs.readSync(this.fd, next, 0, next.length, this.pos);
      this.buf = next;
      this.start = this.pos;
    }
    const at = this.pos - this.start;
    this.pos += n;
    return this.buf.subarray(at, at + n);
  }

  u32(what: string): number { return this.take(4, what).readUInt32LE(0); }

  /** A u64 that must fit a JS number (counts, lengths, offsets, dimensions). */
  size(what: string): number {
    const v = this.take(8, what).readBigUInt64LE(0);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new CheckpointError(this.file, `${what} is too large (${v})`);
    return Number(v);
  }

  str(what: string): string {
    const n = this.size(`${what} length`);
    return this.take(n, what).toString("utf8");
  }
}

function readScalar(r: HeaderReader, type: number, what: string): GgufValue {
  switch (type) {
    case V.u8: return r.take(1, what).readUInt8(0);
    case V.i8: return r.take(1, what).readInt8(0);
    case V.u16: return r.take(2, what).readUInt16LE(0);
    case V.i16: return r.take(2, what).readInt16LE(0);
    case V.u32: return r.take(4, what).readUInt32LE(0);
    case V.i32: return r.take(4, what).readInt32LE(0);
    case V.f32: return r.take(4, what).readFloatLE(0);
    case V.f64: return r.take(8, what).readDoubleLE(0);
    case V.bool: return r.take(1, what).readUInt8(0) !== 0;
    case V.str: return r.str(what);
    case V.u64: return safeOrBig(r.take(8, what).readBigUInt64LE(0));
    case V.i64: return safeOrBig(r.take(8, what).readBigInt64LE(0));
    default: throw new Error(`unknown metadata value type ${type}`);
  }
}

function safeOrBig(v: bigint): number | bigint {
  return v <= BigInt(Number.MAX_SAFE_INTEGER) && v >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(v) : v;
}

/** A metadata value's GGUF type: a scalar's name (`u32`, `str`, ...), or an array's item type plus "s" (`strs`, `arrs`). */
export type GgufValueType = keyof typeof V | `${keyof typeof V}s`;

const V_NAMES = Object.keys(V) as (keyof typeof V)[];

function readValue(r: HeaderReader, type: number, what: string, file: string, onItemType?: (t: number) => void): GgufValue {
  if (type !== V.arr) {
    if (type > V.f64) throw new CheckpointError(file, `metadata ${what} has unknown value type ${type}`);
    return readScalar(r, type, what);
  }
  const itemType = r.u32(`${what} item type`);
  if (itemType > V.f64) throw new CheckpointError(file, `metadata ${what} is an array of unknown value type ${itemType}`);
  onItemType?.(itemType);
  const n = r.size(`${what} array length`);
  if (n > r.fileSize) throw new CheckpointError(file, `metadata ${what} claims ${n} items, more than the file's bytes`);
  const out: GgufValue[] = new Array<GgufValue>(n);
  for (let i = 0; i < n; i++) out[i] = readValue(r, itemType, what, file);
  return out;
}

/** The name ggml gives a type id, for messages. */
export function ggmlTypeName(id: number): string {
  return TYPE_BY_ID.get(id) ?? OTHER_TYPE_NAMES[id] ?? `unknown type id ${id}`;
}

function readTensorInfo(r: HeaderReader, file: string): { name: string; dims: number[]; typeId: number; rel: number } {
  const name = r.str("tensor name");
  const nDims = r.u32(`tensor ${name} dimension count`);
  if (nDims < 1 || nDims > MAX_DIMS) throw new CheckpointError(file, `${nDims} dimensions (1 to ${MAX_DIMS} allowed)`, name);
  const dims = Array.from({ length: nDims }, () => r.size(`tensor ${name} dimension`));
  const typeId = r.u32(`tensor ${name} type`);
  return { name, dims, typeId, rel: r.size(`tensor ${name} offset`) };
}

/** Validates one tensor entry against its type and the file; returns it with absolute offsets. */
function checkTensor(file: string, fileSize: number, dataOffset: number, alignment: number,
  e: { name: string; dims: number[]; typeId: number; rel: number }): GgufTensor {
  const type = TYPE_BY_ID.get(e.typeId);
  if (!type) throw new CheckpointError(file, `tensor type ${ggmlTypeName(e.typeId)} is not supported (supported: ${Object.keys(GGML_TYPES).join(", ")})`, e.name);
  const { blockSize, blockBytes } = GGML_TYPES[type];
  const count = e.dims.reduce((a, b) => a * b, 1);
  if (e.dims.some((d) => d === 0) || !Number.isSafeInteger(count)) throw new CheckpointError(file, `bad dimensions [${e.dims.join(", ")}]`, e.name);
  if (e.dims[0]! % blockSize !== 0) {
    throw new CheckpointError(file, `row length ${e.dims[0]} is not a multiple of the ${type} block size ${blockSize}`, e.name);
  }
  if (e.rel % alignment !== 0) throw new CheckpointError(file, `data offset ${e.rel} is not a multiple of the alignment ${alignment}`, e.name);
  const byteLength = (count / blockSize) * blockBytes;
  const offset = dataOffset + e.rel;
  if (offset + byteLength > fileSize) {
    throw new CheckpointError(file, `truncated: data [${offset}, ${offset + byteLength}) runs past the end of the file (${fileSize} bytes)`, e.name);
  }
  return { name: e.name, type, shape: [...e.dims].reverse(), offset, byteLength };
}

function checkNoOverlap(file: string, tensors: GgufTensor[]): void {
  const sorted = [...tensors].sort((a, b) => a.offset - b.offset);
  for (let i = 1; i < sorted.length; i++) {
    const prev = sorted[i - 1]!, t = sorted[i]!;
    if (prev.offset + prev.byteLength > t.offset) {
      throw new CheckpointError(file, `data overlaps tensor ${prev.name}'s: its shape and type do not fit the offsets`, t.name);
    }
  }
}

function alignmentOf(file: string, metadata: Map<string, GgufValue>): number {
  const a = metadata.get("general.alignment") ?? 32;
  if (typeof a !== "number" || a <= 0 || (a & (a - 1)) !== 0) throw new CheckpointError(file, `general.alignment ${String(a)} is not a power of two`);
  return a;
}

/** Reads and validates the header and tensor table of a GGUF file. */
export function readGguf(file: string): Gguf {
  const fd = fs.openSync(file, "r");
  try {
    const r = new HeaderReader(fd, fs.fstatSync(fd).size, file);
    if (r.take(4, "magic").toString("latin1") !== "GGUF") throw new CheckpointError(file, "not a GGUF file (bad magic)");
    const version = r.u32("version");
    if (version !== 2 && version !== 3) throw new CheckpointError(file, `GGUF version ${version} is not supported (2 and 3 are; a huge number means a big-endian file)`);
    const nTensors = r.size("tensor count");
    const nKv = r.size("metadata count");
    const metadata = new Map<string, GgufValue>();
    const metadataTypes = new Map<string, GgufValueType>();
    for (let i = 0; i < nKv; i++) {
      const key = r.str("metadata key");
      if (metadata.has(key)) throw new CheckpointError(file, `metadata key ${key} appears twice`);
      const type = r.u32(`metadata ${key} type`);
      let item = -1;
      metadata.set(key, readValue(r, type, key, file, (t) => (item = t)));
      metadataTypes.set(key, item >= 0 ? `${V_NAMES[item]!}s` : V_NAMES[type]!);
    }
    const entries = Array.from({ length: nTensors }, () => readTensorInfo(r, file));
    const alignment = alignmentOf(file, metadata);
    const dataOffset = Math.ceil(r.offset / alignment) * alignment;
    const tensors = new Map<string, GgufTensor>();
    for (const e of entries) {
      if (tensors.has(e.name)) throw new CheckpointError(file, "tensor appears twice", e.name);
      tensors.set(e.name, checkTensor(file, r.fileSize, dataOffset, alignment, e));
    }
    checkNoOverlap(file, [...tensors.values()]);
    return { file, version, alignment, dataOffset, metadata, metadataTypes, tensors };
  } finally {
    fs.closeSync(fd);
  }
}

/** Typed metadata access: each throws a CheckpointError naming the key when it is missing or of the wrong type. */
export class GgufMetadata {
  constructor(
    private readonly file: string,
    private readonly kv: Map<string, GgufValue>,
  ) {}

  has(key: string): boolean {
    return this.kv.has(key);
  }

  private get(key: string, fallback: GgufValue | undefined): GgufValue {
    const v = this.kv.get(key) ?? fallback;
    if (v === undefined) throw new CheckpointError(this.file, `missing metadata ${key}`);
    return v;
  }

  num(key: string, fallback?: number): number {
    const v = this.get(key, fallback);
    if (typeof v !== "number") throw new CheckpointError(this.file, `metadata ${key} must be a number`);
    return v;
  }

  str(key: string, fallback?: string): string {
    const v = this.get(key, fallback);
    if (typeof v !== "string") throw new CheckpointError(this.file, `metadata ${key} must be a string`);
    return v;
  }

  bool(key: string, fallback?: boolean): boolean {
    const v = this.get(key, fallback);
    if (typeof v !== "boolean") throw new CheckpointError(this.file, `metadata ${key} must be a boolean`);
    return v;
  }

  strs(key: string, fallback?: string[]): string[] {
    const v = this.get(key, fallback);
    if (!Array.isArray(v) || v.some((x) => typeof x !== "string")) throw new CheckpointError(this.file, `metadata ${key} must be an array of strings`);
    return v as string[];
  }

  nums(key: string, fallback?: number[]): number[] {
    const v = this.get(key, fallback);
    if (!Array.isArray(v) || v.some((x) => typeof x !== "number")) throw new CheckpointError(this.file, `metadata ${key} must be an array of numbers`);
    return v as number[];
  }
}
