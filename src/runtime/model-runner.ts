/**
 * Turns one scheduled batch into the addon's flat arrays, runs the step off
 * the event loop, and hands back what each sequence sampled. The ground floor:
 * it takes plain data and imports nothing from engine/ or model/.
 */
import { loadNative, type ComputeDtype, type Device, type KvCacheDtype, type NativeModel, type NativeModelInfo, type NativeModelSpec, type NativeStepOutput, type NativeWeights } from "./native.js";
import { ropeInvFreq, type RopeScaling } from "./rope.js";
import { buildStepInput, type StepInput } from "./step-input.js";

/** The sampling settings the kernel reads (an engine's request params carry more). */
export interface RunnerSampling {
  /** 0 = greedy. */
  temperature: number;
  topP: number;
  /** 0 = off. */
  topK: number;
  minP: number;
  repetitionPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  /** The seeded RNG stream: 64 bits as a bigint, or a non-negative integer number below 2^53. */
  seed: number | bigint;
  /** Top-N log-probs to return (0 = none). */
  logprobs: number;
  /** (token id, value) pairs added to the logits before sampling (OpenAI's logit_bias). */
  logitBias?: readonly (readonly [number, number])[];
}

/** A model's shape, as the runner needs it: the native spec's dimensions, and rope as the config states it. */
export interface RunnerModelConfig extends Pick<NativeModelSpec, "hidden" | "intermediate" | "layers" | "heads" | "kvHeads" | "headDim" | "vocab" | "rmsEps"> {
  ropeTheta: number;
  ropeScaling: RopeScaling;
}

/** What the addon loads: a shape and validated tensor locations (a model/ Checkpoint is one). */
export interface RunnerModel {
  config: RunnerModelConfig;
  weights: NativeWeights;
}

export interface SampleRequest {
  params: RunnerSampling;
  /** Index of the token being sampled within its request (the seeded RNG's position). */
  counter: number;
  promptIds: readonly number[];
  outputIds: readonly number[];
  /** Token ids that cannot be sampled at this step (EOS and stop tokens before min_tokens). */
  banned?: readonly number[];
  /**
   * Grammar mask (structured outputs): ceil(vocab / 32) words, bit t set = token t may be sampled.
   * A function is called once the step has started and its mask is written while the forward
   * pass runs (sampling waits for it); undefined from it = no mask.
   */
  mask?: Int32Array | MaskSource;
}

/** A mask made on demand (see SampleRequest.mask). */
export type MaskSource = () => Promise<Int32Array | undefined>;

/** One sequence's share of a step. */
export interface RunnerSequence {
  /** Tokens computed in this step (a prefill chunk, or one decode token). */
  tokenIds: readonly number[];
  /** Position of tokenIds[0]; tokens before it are already in the cache. */
  startPosition: number;
  /** Physical block ids covering positions 0 .. startPosition + tokenIds.length - 1. */
  blockTable: readonly number[];
  /** Sample from the last row's logits. */
  sample: SampleRequest | null;
  /**
   * Prompt log-probs: rows firstRow .. firstRow + targets.length - 1 of this step's
   * tokens each score targets[i] (the token that follows it) and give their top `topN`.
   */
  score?: { firstRow: number; targets: readonly number[]; topN: number };
  /** Fidelity checks: return logits for every row of this sequence (greedy-sampled, results ignored). */
  allLogits?: boolean;
}

export interface TokenLogprob {
  tokenId: number;
  logprob: number;
}

export interface SampleResult extends TokenLogprob {
  top: TokenLogprob[];
}

/** A prompt token's log-prob under the previous position's logits, its rank (1 = most likely) and that position's top-N. */
export interface PromptScore extends SampleResult {
  rank: number;
}

export interface StepResult {
  /** Per sequence: what it sampled, or null (not sampled this step, or failed: see errors). */
  samples: (SampleResult | null)[];
  /** Per sequence: why its sample failed (bad sampling parameters), else null. Other sequences are unaffected. */
  errors: (string | null)[];
  /** Per sequence, when asked: (rows × vocab) logits. */
  logits?: (Float32Array | null)[];
  /** Per sequence: its scored rows' results, in order (empty when it asked for none). */
  scores?: PromptScore[][];
  /** execute() with decodeSteps > 1: the samples and errors of the steps after this one, in order. */
  following?: Pick<StepResult, "samples" | "errors">[];
}

export interface KvLayout {
  numBlocks: number;
  blockSize: number;
  /** The pool's element; float32 (exact) when left out. */
  dtype?: KvCacheDtype;
}

/**
 * `auto` is CUDA when this build has the CUDA backend and a GPU is visible, else the CPU.
 * `cuda` where there is none throws, saying why.
 */
export function resolveDevice(device: Device | "auto"): Device {
  if (device === "cpu") return "cpu";
  const native = loadNative();
  gpusVisible ??= native.cudaBuilt() && native.cudaDevices().length > 0;  // asked once: /v1/models resolves it per call
  if (device === "auto") return gpusVisible ? "cuda" : "cpu";
  if (!native.cudaBuilt()) throw new Error("--device cuda: this build of the addon has no CUDA backend (rebuild with nvcc and cuBLAS present; see docs/GPU.md)");
  if (!gpusVisible) throw new Error("--device cuda: no CUDA GPU is visible to this process");
  return "cuda";
}

let gpusVisible: boolean | undefined;

/**
 * `auto` is bfloat16 on CUDA, and on a CPU with bf16 instructions (AMX or AVX512_BF16) when the
 * kernel set in use is the one chosen for them, else float32: the fast path by default, the exact
 * one on request.
 * CUDA computes in bfloat16 only: float32 there throws.
 */
export function resolveDtype(dtype: ComputeDtype | "auto", device: Device = "cpu"): ComputeDtype {
  if (device === "cuda") {
    if (dtype === "float32") throw new Error("--dtype float32 is not available on CUDA (it computes in bfloat16); use --device cpu for the exact path");
    return "bfloat16";
  }
  if (dtype !== "auto") return dtype;
  return loadNative().bf16ByDefault() ? "bfloat16" : "float32";
}

/** `auto` follows the compute mode: float32 compute keeps an exact float32 cache, bfloat16 a bfloat16 one. */
export function resolveKvCacheDtype(kv: KvCacheDtype | "auto", compute: ComputeDtype): KvCacheDtype {
  return kv === "auto" ? compute : kv;
}

/** Bytes per cached K or V element. */
export function kvElementBytes(kv: KvCacheDtype): 2 | 4 {
  return kv === "float32" ? 4 : 2;
}

export class ModelRunner {
  private constructor(
    readonly native: NativeModel,
    readonly vocab: number,
    readonly kv: KvLayout,
  ) {}

  /**
   * Loads the weights and reserves the KV pool on a worker thread: the event loop keeps running.
   * `dtype` defaults to float32, the reference path; `device` to the CPU.
   */
  static async create(model: RunnerModel, kv: KvLayout, dtype: ComputeDtype = "float32", device: Device = "cpu"): Promise<ModelRunner> {
    const c = model.config;
    const native = await loadNative().loadModel({
      hidden: c.hidden, intermediate: c.intermediate, layers: c.layers, heads: c.heads, kvHeads: c.kvHeads,
      headDim: c.headDim, vocab: c.vocab, rmsEps: c.rmsEps, attentionScaling: 1,
      invFreq: ropeInvFreq(c.headDim, c.ropeTheta, c.ropeScaling),
      numBlocks: kv.numBlocks, blockSize: kv.blockSize, dtype, kvCacheDtype: kv.dtype ?? "float32", device, weights: model.weights,
    });
    const runner = new ModelRunner(native, c.vocab, kv);
    if (device === "cuda") await runner.warmUp();
    return runner;
  }

  /**
   * CUDA loads each kernel (ours, and cuBLAS's for each GEMM shape) on its first launch: a first
   * prompt of 128 tokens took 28-32 ms against 3.3 for the next on the H200 host (session 41). One
   * prefill of up to 128 tokens into the pool's first blocks, which no sequence owns yet (a block's
   * slots are written before they are read), pays that at load instead.
   */
  private async warmUp(): Promise<void> {
    const n = Math.min(128, this.kv.numBlocks * this.kv.blockSize);
    const blockTable = Array.from({ length: Math.ceil(n / this.kv.blockSize) }, (_, i) => i);
    await this.execute([{ tokenIds: new Array<number>(n).fill(0), startPosition: 0, blockTable, sample: null }]);
  }

  /** The KV pool's element. */
  get kvCacheDtype(): KvCacheDtype {
    return this.kv.dtype ?? "float32";
  }

  /** Throws "model disposed" after dispose(). */
  info(): NativeModelInfo {
    return this.native.info();
  }

  /**
   * One step; or `decodeSteps` decode steps in one native call, each sequence one sampled row
   * fed its own last sample (NativeStepInput.decodeSteps; its block table must hold them all):
   * the first step's result, with the rest in `following`.
   */
  async execute(seqs: readonly RunnerSequence[], decodeSteps = 1): Promise<StepResult> {
    const input = buildStepInput(seqs, this.kv.blockSize, this.vocab, decodeSteps);
    const out = input.sources.length > 0 ? await this.stepWhileMasking(input) : await this.native.step(input);
    const result = this.unpack(seqs, out, input);
    if (decodeSteps === 1) return result;
    const following = Array.from({ length: decodeSteps - 1 }, (_, j) => this.unpackSamples(seqs, out, input, (j + 1) * seqs.length));
    return { ...result, following };
  }

  /**
   * Starts the step, then makes the deferred masks while its forward pass runs on the
   * worker thread, writing each into its place; the step samples once they are all in
   * (provideMasks). A mask that cannot be made fails the step after it ends.
   */
  private async stepWhileMasking(input: StepInput): Promise<NativeStepOutput> {
    const step = this.native.step(input);
    step.catch(() => undefined); // awaited below, after the masks
    let failure: unknown = null;
    try {
      for (const { at, make } of input.sources) {
        const m = await make();
        if (m && m.length !== input.maskWords) throw new Error(`a token mask has ${m.length} words; the vocabulary needs ${input.maskWords}`);
        input.masks.set(m ?? new Int32Array(input.maskWords).fill(-1), at); // none: every token allowed
      }
    } catch (e) {
      failure = e;
    } finally {
      this.native.provideMasks(failure === null);
    }
    const out = await step;
    if (failure !== null) throw failure;
    return out;
  }

  /** Frees the weights and KV pool now (after a step in flight); later calls to execute() reject with "model disposed". */
  dispose(): Promise<void> {
    return this.native.dispose();
  }

  /** Each sequence's sample and error, read at row offset `at` + its last row (a later decode step's from at = j · S). */
  private unpackSamples(seqs: readonly RunnerSequence[], out: NativeStepOutput, input: { rowsPerSeq: number[] }, at = 0): Pick<StepResult, "samples" | "errors"> {
    const samples: (SampleResult | null)[] = [];
    const errors: (string | null)[] = [];
    let r = at;
    seqs.forEach((s, b) => {
      const last = r + input.rowsPerSeq[b]! - 1;
      r += input.rowsPerSeq[b]!;
      const error = s.sample ? out.rowErrors[last] ?? null : null;
      errors.push(error);
      if (!s.sample || error !== null) return void samples.push(null);
      const top: TokenLogprob[] = [];
      for (let i = 0; i < s.sample.params.logprobs; i++) {
        top.push({ tokenId: out.topIds[last * out.topN + i]!, logprob: out.topLogprobs[last * out.topN + i]! });
      }
      samples.push({ tokenId: out.tokens[last]!, logprob: out.logprobs[last]!, top });
    });
    return { samples, errors };
  }

  private unpack(seqs: readonly RunnerSequence[], out: NativeStepOutput, input: { rowsPerSeq: number[] }): StepResult {
    const { samples, errors } = this.unpackSamples(seqs, out, input);
    const logits: (Float32Array | null)[] = [];
    const scores: PromptScore[][] = [];
    let r = 0, scored = 0;
    seqs.forEach((s, b) => {
      const rows = input.rowsPerSeq[b]!;
      if (out.logits && s.allLogits) logits.push(out.logits.slice(r * this.vocab, (r + rows) * this.vocab));
      else logits.push(null);
      r += rows;
      const mine: PromptScore[] = [];
      for (const tokenId of s.score?.targets ?? []) {
        const top: TokenLogprob[] = [];
        for (let i = 0; i < s.score!.topN; i++) {
          top.push({ tokenId: out.scoreTopIds[scored * out.scoreTopN + i]!, logprob: out.scoreTopLogprobs[scored * out.scoreTopN + i]! });
        }
        mine.push({ tokenId, logprob: out.scoreLogprobs[scored]!, rank: out.scoreRanks[scored]!, top });
        scored++;
      }
      scores.push(mine);
    });
    return out.logits ? { samples, errors, logits, scores } : { samples, errors, scores };
  }
}
