/**
 * The native addon's whole surface, typed. Everything that crosses into C++
 * goes through the types in this file; `native/addon.cpp` implements them.
 */
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import path from "node:path";

export type NativeDType = "f32" | "f16" | "bf16";

/** A tensor inside a safetensors file, already validated by the loader. */
export interface NativeTensor {
  file: string;
  /** Absolute byte offset of the tensor data in `file`. */
  offset: number;
  byteLength: number;
  dtype: NativeDType;
  /** [rows, cols] for matrices, [n] for vectors. */
  shape: number[];
}

export interface NativeLayerWeights {
  attnNorm: NativeTensor;
  wq: NativeTensor;
  wk: NativeTensor;
  wv: NativeTensor;
  wo: NativeTensor;
  bq?: NativeTensor;
  bk?: NativeTensor;
  bv?: NativeTensor;
  qNorm?: NativeTensor;
  kNorm?: NativeTensor;
  mlpNorm: NativeTensor;
  gate: NativeTensor;
  up: NativeTensor;
  down: NativeTensor;
}

export interface NativeWeights {
  embed: NativeTensor;
  finalNorm: NativeTensor;
  /** The embedding again when embeddings are tied. */
  lmHead: NativeTensor;
  layers: NativeLayerWeights[];
}

export interface NativeModelSpec {
  hidden: number;
  intermediate: number;
  layers: number;
  heads: number;
  kvHeads: number;
  headDim: number;
  vocab: number;
  rmsEps: number;
  attentionScaling: number;
  /** (headDim / 2) rope inverse frequencies with any scaling applied. */
  invFreq: Float32Array;
  /** KV pool: numBlocks × blockSize token slots per layer. */
  numBlocks: number;
  blockSize: number;
  weights: NativeWeights;
}

/**
 * One flat, variable-length batch: T token rows from B sequences, S sampled rows.
 * Rows of sequence b are seqStarts[b] .. seqStarts[b+1]-1.
 */
export interface NativeStepInput {
  tokens: Int32Array; // (T)
  positions: Int32Array; // (T)
  seqStarts: Int32Array; // (B+1)
  slotMapping: Int32Array; // (T) block * blockSize + offset
  blockTables: Int32Array; // (B * maxBlocks), -1 padded
  contextLens: Int32Array; // (B) cached tokens after this step
  maxBlocks: number;
  sampleRows: Int32Array; // (S)
  temperature: Float32Array; // (S) 0 = greedy
  topP: Float32Array; // (S)
  topK: Int32Array; // (S) 0 = off
  minP: Float32Array; // (S)
  repetitionPenalty: Float32Array; // (S)
  presencePenalty: Float32Array; // (S)
  frequencyPenalty: Float32Array; // (S)
  seeds: Float64Array; // (S) integers below 2^53
  counters: Int32Array; // (S) index of the token being sampled within its request
  numLogprobs: Int32Array; // (S)
  promptOffsets: Int32Array; // (S+1) into promptTokens (repetition penalty)
  promptTokens: Int32Array;
  outputOffsets: Int32Array; // (S+1) into outputTokens (all penalties)
  outputTokens: Int32Array;
  /** Return the (S × vocab) logits too: the forward pass's raw output, for fidelity checks. */
  returnLogits?: boolean;
}

export interface NativeStepOutput {
  tokens: Int32Array; // (S), -1 where the row failed
  /**
   * (S) why a row could not be sampled (a parameter out of range once in
   * float32, logits made non-finite by its penalties), else null. Such a row
   * fails alone: the other rows are sampled as if it were not in the batch.
   */
  rowErrors: (string | null)[];
  logprobs: Float32Array; // (S) under the raw logits
  topN: number;
  topIds: Int32Array; // (S * topN), -1 where a row asked fewer
  topLogprobs: Float32Array; // (S * topN)
  logits?: Float32Array; // (S * vocab)
}

export interface NativeModelInfo {
  isa: "avx512" | "avx2" | "scalar";
  threads: number;
  kvCacheBytes: number;
}

/** Seconds per kind of work since the previous read, and the steps and token rows they covered. */
export interface NativeProfile {
  matmul: number;
  attention: number;
  lmHead: number;
  sampling: number;
  other: number;
  steps: number;
  tokens: number;
}

/** After dispose(), step() rejects and info() / takeProfile() throw, with "model disposed". */
export interface NativeModel {
  /**
   * Runs off the event loop; rejects on bad input (a malformed batch), native
   * failure, a step already in flight or a disposed model. Bad sampling
   * parameters fail only their row (NativeStepOutput.rowErrors).
   */
  step(input: NativeStepInput): Promise<NativeStepOutput>;
  info(): NativeModelInfo;
  /** Blocks while a step is in flight; resets the counters. */
  takeProfile(): NativeProfile;
  /**
   * Unmaps the packed weights, the checkpoint files and the KV pools, off the
   * event loop. A step in flight finishes (its promise resolves as usual)
   * before the memory goes; the returned promise resolves once it has gone.
   * Later calls resolve when the first one does.
   */
  dispose(): Promise<void>;
}

export interface NativeAddon {
  /**
   * Maps the checkpoint files, then reads and repacks every matrix and
   * reserves the KV pools on a worker thread. Rejects on a bad spec or an
   * unreadable file.
   */
  loadModel(spec: NativeModelSpec): Promise<NativeModel>;
  /** The kernel set in use (WEFT_ISA=avx2|scalar forces one). */
  isa(): NativeModelInfo["isa"];
}

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, "..", "..", "..");

let addon: NativeAddon | undefined;

/** Loads build/Release/weft_native.node once. */
export function loadNative(): NativeAddon {
  if (!addon) {
    const require = createRequire(import.meta.url);
    addon = require(path.join(root, "build", "Release", "weft_native.node")) as NativeAddon;
  }
  return addon;
}
