/**
 * Turns one scheduled batch into the addon's flat arrays, runs the step off
 * the event loop, and hands back what each sequence sampled. The ground floor:
 * it takes plain data and imports nothing from engine/ or model/.
 */
import { loadNative, type ComputeDtype, type Device, type KvCacheDtype, type NativeModel, type NativeModelInfo, type NativeModelSpec, type NativeStepInput, type NativeStepOutput, type NativeWeights } from "./native.js";
import { ropeInvFreq, type RopeScaling } from "./rope.js";

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
 * `auto` is bfloat16 on CUDA, and on a CPU whose kernels have bf16 hardware (AMX or
 * AVX512_BF16), else float32: the fast path by default, the exact one on request.
 * CUDA computes in bfloat16 only: float32 there throws.
 */
export function resolveDtype(dtype: ComputeDtype | "auto", device: Device = "cpu"): ComputeDtype {
  if (device === "cuda") {
    if (dtype === "float32") throw new Error("--dtype float32 is not available on CUDA (it computes in bfloat16); use --device cpu for the exact path");
    return "bfloat16";
  }
  if (dtype !== "auto") return dtype;
  return loadNative().bf16Hardware() ? "bfloat16" : "float32";
}

/** `auto` follows the compute mode: float32 compute keeps an exact float32 cache, bfloat16 a bfloat16 one. */
export function resolveKvCacheDtype(kv: KvCacheDtype | "auto", compute: ComputeDtype): KvCacheDtype {
  return kv === "auto" ? compute : kv;
}

/** Bytes per cached K or V element. */
export function kvElementBytes(kv: KvCacheDtype): 2 | 4 {
  return kv === "float32" ? 4 : 2;
}

const GREEDY: RunnerSampling = {
  temperature: 0, topP: 1, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0, seed: 0, logprobs: 0,
};

/** Whether any penalty needs the request's token history. */
function usesPenalties(p: RunnerSampling): boolean {
  return p.repetitionPenalty !== 1 || p.presencePenalty !== 0 || p.frequencyPenalty !== 0;
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
    return new ModelRunner(native, c.vocab, kv);
  }

  /** The KV pool's element. */
  get kvCacheDtype(): KvCacheDtype {
    return this.kv.dtype ?? "float32";
  }

  /** Throws "model disposed" after dispose(). */
  info(): NativeModelInfo {
    return this.native.info();
  }

  async execute(seqs: readonly RunnerSequence[]): Promise<StepResult> {
    const input = this.buildInput(seqs);
    const out = input.sources.length > 0 ? await this.stepWhileMasking(input) : await this.native.step(input);
    return this.unpack(seqs, out, input);
  }

  /**
   * Starts the step, then makes the deferred masks while its forward pass runs on the
   * worker thread, writing each into its place; the step samples once they are all in
   * (provideMasks). A mask that cannot be made fails the step after it ends.
   */
  private async stepWhileMasking(input: NativeStepInput & { sources: { at: number; make: MaskSource }[] }): Promise<NativeStepOutput> {
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

  private buildInput(seqs: readonly RunnerSequence[]): NativeStepInput & { rowsPerSeq: number[]; sources: { at: number; make: MaskSource }[] } {
    const bs = this.kv.blockSize;
    const T = seqs.reduce((n, s) => n + s.tokenIds.length, 0);
    const maxBlocks = Math.max(1, ...seqs.map((s) => Math.ceil((s.startPosition + s.tokenIds.length) / bs)));
    const tokens = new Int32Array(T), positions = new Int32Array(T), slotMapping = new Int32Array(T);
    const seqStarts = new Int32Array(seqs.length + 1), contextLens = new Int32Array(seqs.length);
    const blockTables = new Int32Array(seqs.length * maxBlocks).fill(-1);
    const sampleRows: number[] = [], params: RunnerSampling[] = [], counters: number[] = [], rowsPerSeq: number[] = [];
    const prompt: number[][] = [], output: number[][] = [], bias: (readonly [number, number])[][] = [];
    const masks: (Int32Array | MaskSource | undefined)[] = [];
    const scoreRows: number[] = [], scoreTargets: number[] = [], scoreTopN: number[] = [];
    let row = 0;
    seqs.forEach((s, b) => {
      seqStarts[b] = row;
      const ctx = s.startPosition + s.tokenIds.length;
      contextLens[b] = ctx;
      for (let i = 0; i < Math.ceil(ctx / bs); i++) blockTables[b * maxBlocks + i] = s.blockTable[i] ?? -1;
      s.tokenIds.forEach((id, i) => {
        const pos = s.startPosition + i;
        tokens[row + i] = id;
        positions[row + i] = pos;
        slotMapping[row + i] = (s.blockTable[Math.floor(pos / bs)] ?? -1) * bs + (pos % bs);
      });
      const first = s.allLogits ? 0 : s.tokenIds.length - 1;
      const rows = s.allLogits || s.sample ? s.tokenIds.length - first : 0;
      rowsPerSeq.push(rows);
      for (let i = first; rows > 0 && i < s.tokenIds.length; i++) {
        sampleRows.push(row + i);
        const req = s.sample && i === s.tokenIds.length - 1 ? s.sample : null;
        params.push(req ? req.params : GREEDY);
        counters.push(req ? req.counter : 0);
        bias.push(req ? [...(req.params.logitBias ?? []), ...(req.banned ?? []).map((id) => [id, -Infinity] as const)] : []);
        masks.push(req?.mask);
        const penal = req && usesPenalties(req.params);
        prompt.push(penal ? [...req.promptIds] : []);
        output.push(penal ? [...req.outputIds] : []);
      }
      s.score?.targets.forEach((target, i) => {
        scoreRows.push(row + s.score!.firstRow + i);
        scoreTargets.push(target);
        scoreTopN.push(s.score!.topN);
      });
      row += s.tokenIds.length;
    });
    seqStarts[seqs.length] = row;
    const flat = (lists: number[][]): [Int32Array, Int32Array] => {
      const offsets = new Int32Array(lists.length + 1);
      lists.forEach((l, i) => (offsets[i + 1] = offsets[i]! + l.length));
      return [offsets, Int32Array.from(lists.flat())];
    };
    const [promptOffsets, promptTokens] = flat(prompt);
    const [outputOffsets, outputTokens] = flat(output);
    const [biasOffsets, biasIds] = flat(bias.map((b) => b.map(([id]) => id)));
    return {
      tokens, positions, seqStarts, slotMapping, blockTables, contextLens, maxBlocks,
      sampleRows: Int32Array.from(sampleRows),
      temperature: Float32Array.from(params, (p) => p.temperature),
      topP: Float32Array.from(params, (p) => p.topP),
      topK: Int32Array.from(params, (p) => p.topK),
      minP: Float32Array.from(params, (p) => p.minP),
      repetitionPenalty: Float32Array.from(params, (p) => p.repetitionPenalty),
      presencePenalty: Float32Array.from(params, (p) => p.presencePenalty),
      frequencyPenalty: Float32Array.from(params, (p) => p.frequencyPenalty),
      seeds: BigUint64Array.from(params, (p) => BigInt.asUintN(64, BigInt(p.seed))),
      counters: Int32Array.from(counters),
      numLogprobs: Int32Array.from(params, (p) => p.logprobs),
      biasOffsets, biasIds, biasValues: Float32Array.from(bias.flat(), ([, v]) => v),
      ...this.flatMasks(masks),
      promptOffsets, promptTokens, outputOffsets, outputTokens,
      scoreRows: Int32Array.from(scoreRows), scoreTargets: Int32Array.from(scoreTargets), scoreTopN: Int32Array.from(scoreTopN),
      returnLogits: seqs.some((s) => s.allLogits),
      rowsPerSeq,
    };
  }

  /**
   * Each row's grammar mask, end to end; -1 offsets for rows without one. Masks still to be
   * made get their place, filled by stepWhileMasking.
   */
  private flatMasks(rows: readonly (Int32Array | MaskSource | undefined)[]): Pick<NativeStepInput, "maskOffsets" | "masks" | "maskWords" | "masksPending"> & { sources: { at: number; make: MaskSource }[] } {
    const maskWords = Math.ceil(this.vocab / 32);
    const sources: { at: number; make: MaskSource }[] = [];
    const masks = new Int32Array(rows.filter((m) => m !== undefined).length * maskWords);
    const maskOffsets = new Int32Array(rows.length).fill(-1);
    let at = 0;
    rows.forEach((m, i) => {
      if (!m) return;
      if (typeof m === "function") sources.push({ at, make: m });
      else if (m.length !== maskWords) throw new Error(`a token mask has ${m.length} words; the vocabulary needs ${maskWords}`);
      else masks.set(m, at);
      maskOffsets[i] = at;
      at += maskWords;
    });
    return { maskOffsets, masks, maskWords, sources, ...(sources.length > 0 ? { masksPending: true } : {}) };
  }

  private unpack(seqs: readonly RunnerSequence[], out: NativeStepOutput, input: { rowsPerSeq: number[] }): StepResult {
    const samples: (SampleResult | null)[] = [];
    const errors: (string | null)[] = [];
    const logits: (Float32Array | null)[] = [];
    const scores: PromptScore[][] = [];
    let r = 0, scored = 0;
    seqs.forEach((s, b) => {
      const rows = input.rowsPerSeq[b]!;
      if (out.logits && s.allLogits) logits.push(out.logits.slice(r * this.vocab, (r + rows) * this.vocab));
      else logits.push(null);
      const last = r + rows - 1;
      const error = s.sample ? out.rowErrors[last] ?? null : null;
      errors.push(error);
      if (s.sample && error === null) {
        const top: TokenLogprob[] = [];
        for (let i = 0; i < s.sample.params.logprobs; i++) {
          top.push({ tokenId: out.topIds[last * out.topN + i]!, logprob: out.topLogprobs[last * out.topN + i]! });
        }
        samples.push({ tokenId: out.tokens[last]!, logprob: out.logprobs[last]!, top });
      } else {
        samples.push(null);
      }
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
