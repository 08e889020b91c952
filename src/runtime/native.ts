/**
 * The native addon's whole surface, typed. Everything that crosses into C++
 * goes through the types in this file; `native/addon.cpp` implements them.
 */
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";
import path from "node:path";

/**
 * Float types, GGUF's block-quantized types, and MLX's affine 4- and 8-bit matrices (all kept
 * quantized in memory; see docs/QUANTIZATION.md). `u32` is a safetensors file's raw words: the
 * loader only ever passes them on inside an MLX matrix.
 */
export type NativeDType = "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "q4_k" | "q5_k" | "q6_k" | "mlx4" | "mlx8" | "u32";

/**
 * How the forward pass computes. float32: activations in fp32, weights widened
 * exactly (the reference path). bfloat16: each linear layer's input rounded to
 * bf16 and its weights held in bf16, products accumulated in fp32.
 */
export type ComputeDtype = "float32" | "bfloat16";

/**
 * The KV cache's element (vLLM's --kv-cache-dtype): float32 is exact; bfloat16
 * and float16 round each K/V value once, to nearest even, and hold twice the tokens.
 */
export type KvCacheDtype = "float32" | "bfloat16" | "float16";

/** Where a model runs: the CPU kernels, or the CUDA backend (an addon built with nvcc; see docs/GPU.md). */
export type Device = "cpu" | "cuda";

/** Kernel sets, best first: AMX-BF16 tiles, AVX512_BF16, AVX-512, AVX2, portable. */
export type KernelSet = "amx" | "avx512bf16" | "avx512" | "avx2" | "scalar";

/** A tensor inside a safetensors or GGUF file, already validated by the loader. */
export interface NativeTensor {
  file: string;
  /** Absolute byte offset of the tensor data in `file`. */
  offset: number;
  byteLength: number;
  dtype: NativeDType;
  /** [rows, cols] for matrices, [n] for vectors (an MLX matrix: its logical shape, not the words'). */
  shape: number[];
  /** MLX matrices (dtype mlx4 / mlx8) only: the group size and each group's scale and bias ([rows, cols / groupSize], bf16, f16 or f32). */
  mlx?: NativeMlxParams;
}

export interface NativeMlxParams {
  groupSize: number;
  scales: NativeTensor;
  biases: NativeTensor;
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
  dtype: ComputeDtype;
  kvCacheDtype: KvCacheDtype;
  /** cpu when left out. cuda uploads the weights as bf16 to GPU 0 and needs dtype bfloat16. */
  device?: Device;
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
  seeds: BigUint64Array; // (S)
  counters: Int32Array; // (S) index of the token being sampled within its request
  numLogprobs: Int32Array; // (S)
  biasOffsets: Int32Array; // (S+1) into biasIds / biasValues
  biasIds: Int32Array; // token ids whose logit is biased before sampling
  biasValues: Float32Array; // added to those logits (-Infinity bans the token)
  maskOffsets: Int32Array; // (S) start of the row's grammar mask in masks, -1 = none
  masks: Int32Array; // maskWords words per mask: bit t of word t/32 set = token t may be sampled; read in place
  maskWords: number; // ceil(vocab / 32)
  /**
   * The masks are written while the step runs: its forward pass starts at once and
   * sampling waits for NativeModel.provideMasks(). Absent: the masks are ready now.
   */
  masksPending?: boolean;
  promptOffsets: Int32Array; // (S+1) into promptTokens (repetition penalty)
  promptTokens: Int32Array;
  outputOffsets: Int32Array; // (S+1) into outputTokens (all penalties)
  outputTokens: Int32Array;
  /**
   * Prompt log-probs: row scoreRows[i]'s logits score token scoreTargets[i] (the
   * prompt's next token) and give their top scoreTopN[i] (0..1000). Reduced in
   * the step a few rows at a time; no (R × vocab) array is made. Empty = none.
   */
  scoreRows: Int32Array; // (R)
  scoreTargets: Int32Array; // (R)
  scoreTopN: Int32Array; // (R)
  /** Return the (S × vocab) logits too: the forward pass's raw output, for fidelity checks. */
  returnLogits?: boolean;
  /**
   * Decode steps run back to back in this one call (vLLM's multi-step scheduling; 1 when left
   * out): every sequence is one sampled row, and each later step's token is the one
   * the step before sampled, at the next position (the block tables must hold them all), with
   * the seed's counter and the penalties' output tokens advanced. The output's per-row arrays
   * are then decodeSteps times as long, step after step. No masks, logits or prompt scores.
   */
  decodeSteps?: number;
}

/** Per-row arrays are (S), or (decodeSteps × S) for a multi-step input. */
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
  scoreLogprobs: Float32Array; // (R) log-prob of each scored target under its row's raw logits
  scoreRanks: Int32Array; // (R) 1 + the number of tokens whose logit is above the target's
  scoreTopN: number;
  scoreTopIds: Int32Array; // (R * scoreTopN), -1 where a row asked fewer
  scoreTopLogprobs: Float32Array; // (R * scoreTopN)
}

export interface NativeModelInfo {
  device: Device;
  /** The GPU's name on cuda; the kernel set on cpu. */
  deviceName: string;
  /** The CPU kernels in use (on cuda: the sampler's, for rows not sampled on the GPU). */
  isa: KernelSet;
  threads: number;
  kvCacheBytes: number;
  /** Bytes of the weight matrices as held (packed for the kernel set, or bf16 on cuda): what one decode step reads. */
  weightBytes: number;
  dtype: ComputeDtype;
  kvCacheDtype: KvCacheDtype;
}

/** What the CPU offers (CPUID; for AMX, also Linux's grant of the tile state). */
export interface NativeCpuFeatures {
  avx2: boolean;
  avx512: boolean;
  avx512vnni: boolean;
  avx512bf16: boolean;
  amx: boolean;
  /** vdpbf16ps at half the FMA rate (Intel's cores): without AMX, bfloat16 mode runs on the avx512 set's FMAs. */
  bf16DotHalfRate: boolean;
}

/** A GPU the CUDA backend can use. */
export interface NativeCudaDevice {
  name: string;
  totalBytes: number;
  freeBytes: number;
  /** e.g. "9.0" */
  computeCapability: string;
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
   * Runs off the event loop, on the addon's one compute thread (the steps of
   * several models take turns); rejects on bad input (a malformed batch), native
   * failure, a step already in flight or a disposed model. Bad sampling
   * parameters fail only their row (NativeStepOutput.rowErrors).
   */
  step(input: NativeStepInput): Promise<NativeStepOutput>;
  info(): NativeModelInfo;
  /**
   * For the step in flight, started with masksPending: its masks are written
   * (`made`), or could not be made (its masked rows fail). Its sampling waits
   * for this call (60 s at most).
   */
  provideMasks(made: boolean): void;
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

/** The machine's limits, measured on every thread at once; 0 where the CPU lacks the unit. */
export interface NativeRooflines {
  readBytesPerSecond: number;
  fp32Flops: number;
  /** vdpbf16ps (AVX512_BF16). */
  bf16DotFlops: number;
  /** TDPBF16PS (AMX-BF16), operands in tile registers. */
  amxFlops: number;
}

export interface NativeAddon {
  /**
   * Maps the checkpoint files, then reads and repacks every matrix and
   * reserves the KV pools on the addon's compute thread. Rejects on a bad spec or an
   * unreadable file.
   */
  loadModel(spec: NativeModelSpec): Promise<NativeModel>;
  /** The kernel set in use (WEFT_ISA=amx|avx512bf16|avx512|avx2|scalar forces one; throws if this CPU lacks it). */
  isa(): KernelSet;
  /** Whether `--dtype auto` means bfloat16 with the kernel set in use: the set chosen for the CPU's bf16 instructions. */
  bf16ByDefault(): boolean;
  cpuFeatures(): NativeCpuFeatures;
  /** Takes a few seconds, off the event loop. */
  measureRooflines(): Promise<NativeRooflines>;
  /**
   * The rows of `values` (`cols` each, a multiple of the type's block) as ggml blocks of `type`,
   * the bytes llama.cpp reads (`weft quantize`). Synchronous: the caller waits while the compute
   * thread runs it on every core (after any step in flight); throws on a non-finite value, naming
   * its row and column.
   */
  quantizeWeights(type: QuantizeType, values: Float32Array, cols: number): Uint8Array;
  /** Whether this build has the CUDA backend (nvcc and cuBLAS were found when it was built). */
  cudaBuilt(): boolean;
  /** The GPUs the CUDA backend can use: none in a CPU-only build or without a visible GPU. */
  cudaDevices(): NativeCudaDevice[];
}

/** The block types `quantizeWeights` writes. */
export type QuantizeType = "q8_0" | "q4_0" | "q4_k" | "q5_k" | "q6_k";

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
