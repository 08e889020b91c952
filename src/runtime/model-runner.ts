/**
 * Turns one scheduled batch into the addon's flat arrays, runs the step off
 * the event loop, and hands back what each sequence sampled.
 */
import { loadNative, type NativeModel, type NativeModelInfo, type NativeStepInput } from "./native.js";
import { ropeInvFreq } from "../model/config.js";
import { usesPenalties, type SamplingParams } from "../engine/sampling-params.js";
import type { Checkpoint } from "../model/checkpoint.js";

export interface SampleRequest {
  params: SamplingParams;
  /** Index of the token being sampled within its request (the seeded RNG's position). */
  counter: number;
  promptIds: readonly number[];
  outputIds: readonly number[];
}

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
  /** Tests: return logits for every row of this sequence (greedy-sampled, results ignored). */
  allLogits?: boolean;
}

export interface TokenLogprob {
  tokenId: number;
  logprob: number;
}

export interface SampleResult extends TokenLogprob {
  top: TokenLogprob[];
}

export interface StepResult {
  /** Per sequence: what it sampled, or null. */
  samples: (SampleResult | null)[];
  /** Per sequence, when asked: (rows × vocab) logits. */
  logits?: (Float32Array | null)[];
}

export interface KvLayout {
  numBlocks: number;
  blockSize: number;
}

const GREEDY: SamplingParams = {
  temperature: 0, topP: 1, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0,
  seed: 0, logprobs: 0, maxTokens: 1, stop: [], stopTokenIds: [], ignoreEos: true,
};

export class ModelRunner {
  readonly native: NativeModel;
  readonly vocab: number;

  constructor(
    readonly checkpoint: Checkpoint,
    readonly kv: KvLayout,
  ) {
    const c = checkpoint.config;
    this.vocab = c.vocab;
    const Model = loadNative().Model;
    this.native = new Model({
      hidden: c.hidden, intermediate: c.intermediate, layers: c.layers, heads: c.heads, kvHeads: c.kvHeads,
      headDim: c.headDim, vocab: c.vocab, rmsEps: c.rmsEps, attentionScaling: 1, invFreq: ropeInvFreq(c),
      numBlocks: kv.numBlocks, blockSize: kv.blockSize, weights: checkpoint.weights,
    });
  }

  info(): NativeModelInfo {
    return this.native.info();
  }

  async execute(seqs: readonly RunnerSequence[], injectFailure = false): Promise<StepResult> {
    const input = this.buildInput(seqs);
    input.injectFailure = injectFailure;
    const out = await this.native.step(input);
    return this.unpack(seqs, out, input);
  }

  private buildInput(seqs: readonly RunnerSequence[]): NativeStepInput & { rowsPerSeq: number[] } {
    const bs = this.kv.blockSize;
    const T = seqs.reduce((n, s) => n + s.tokenIds.length, 0);
    const maxBlocks = Math.max(1, ...seqs.map((s) => Math.ceil((s.startPosition + s.tokenIds.length) / bs)));
    const tokens = new Int32Array(T), positions = new Int32Array(T), slotMapping = new Int32Array(T);
    const seqStarts = new Int32Array(seqs.length + 1), contextLens = new Int32Array(seqs.length);
    const blockTables = new Int32Array(seqs.length * maxBlocks).fill(-1);
    const sampleRows: number[] = [], params: SamplingParams[] = [], counters: number[] = [], rowsPerSeq: number[] = [];
    const prompt: number[][] = [], output: number[][] = [];
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
        const penal = req && usesPenalties(req.params);
        prompt.push(penal ? [...req.promptIds] : []);
        output.push(penal ? [...req.outputIds] : []);
      }
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
      seeds: Float64Array.from(params, (p) => p.seed),
      counters: Int32Array.from(counters),
      numLogprobs: Int32Array.from(params, (p) => p.logprobs),
      promptOffsets, promptTokens, outputOffsets, outputTokens,
      returnLogits: seqs.some((s) => s.allLogits),
      rowsPerSeq,
    };
  }

  private unpack(seqs: readonly RunnerSequence[], out: Awaited<ReturnType<NativeModel["step"]>>, input: { rowsPerSeq: number[] }): StepResult {
    const samples: (SampleResult | null)[] = [];
    const logits: (Float32Array | null)[] = [];
    let r = 0;
    seqs.forEach((s, b) => {
      const rows = input.rowsPerSeq[b]!;
      if (out.logits && s.allLogits) logits.push(out.logits.slice(r * this.vocab, (r + rows) * this.vocab));
      else logits.push(null);
      const last = r + rows - 1;
      if (s.sample) {
        const top: TokenLogprob[] = [];
        for (let i = 0; i < s.sample.params.logprobs; i++) {
          top.push({ tokenId: out.topIds[last * out.topN + i]!, logprob: out.topLogprobs[last * out.topN + i]! });
        }
        samples.push({ tokenId: out.tokens[last]!, logprob: out.logprobs[last]!, top });
      } else {
        samples.push(null);
      }
      r += rows;
    });
    return out.logits ? { samples, logits } : { samples };
  }
}
