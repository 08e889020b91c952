/**
 * One scheduled batch as the addon's flat step arrays (NativeStepInput). Two passes: the first
 * counts every array's length, the second writes each value into its place, so a step allocates
 * its typed arrays once and no per-row lists (at 512 sequences the lists and their copies took
 * about 1 ms a step, a tenth of a CUDA decode step).
 */
import type { NativeStepInput } from "./native.js";
import type { MaskSource, RunnerSampling, RunnerSequence } from "./model-runner.js";

/** The sampling of rows that return logits but sample nothing of their own (allLogits rows before the last). */
const GREEDY: RunnerSampling = {
  temperature: 0, topP: 1, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0, seed: 0, logprobs: 0,
};

/** Whether any penalty needs the request's token history. */
function usesPenalties(p: RunnerSampling): boolean {
  return p.repetitionPenalty !== 1 || p.presencePenalty !== 0 || p.frequencyPenalty !== 0;
}

/** A step's input, the rows each sequence returns, and the masks still to be made (see ModelRunner.stepWhileMasking). */
export type StepInput = NativeStepInput & { rowsPerSeq: number[]; sources: { at: number; make: MaskSource }[] };

/** The rows of sequence s that return a sample or logits: [first, tokenIds.length). */
function firstReturnedRow(s: RunnerSequence): number {
  if (s.allLogits) return 0;
  return s.sample ? s.tokenIds.length - 1 : s.tokenIds.length;
}

/** Lengths of the step's arrays. */
interface Counts {
  T: number;
  S: number;
  maxBlocks: number;
  bias: number;
  prompt: number;
  output: number;
  scores: number;
  masks: number;
}

/** Blocks of sequence s's table a step reads: through its last position, or its last decode step's (decodeSteps > 1). */
function tableBlocks(s: RunnerSequence, blockSize: number, decodeSteps: number): number {
  return Math.ceil((s.startPosition + s.tokenIds.length + decodeSteps - 1) / blockSize);
}

function count(seqs: readonly RunnerSequence[], blockSize: number, decodeSteps: number): Counts {
  const c: Counts = { T: 0, S: 0, maxBlocks: 1, bias: 0, prompt: 0, output: 0, scores: 0, masks: 0 };
  for (const s of seqs) {
    const n = s.tokenIds.length;
    c.T += n;
    c.maxBlocks = Math.max(c.maxBlocks, tableBlocks(s, blockSize, decodeSteps));
    c.S += n - firstReturnedRow(s);
    c.scores += s.score?.targets.length ?? 0;
    const req = s.sample;
    if (!req) continue;
    c.bias += (req.params.logitBias?.length ?? 0) + (req.banned?.length ?? 0);
    if (req.mask) c.masks++;
    if (usesPenalties(req.params)) {
      c.prompt += req.promptIds.length;
      c.output += req.outputIds.length;
    }
  }
  return c;
}

/**
 * The step's arrays for `seqs`, with KV blocks of `blockSize` tokens and masks of ceil(vocab / 32) words;
 * `decodeSteps` > 1: that many decode steps in one call (NativeStepInput.decodeSteps).
 */
export function buildStepInput(seqs: readonly RunnerSequence[], blockSize: number, vocab: number, decodeSteps = 1): StepInput {
  const c = count(seqs, blockSize, decodeSteps);
  const maskWords = Math.ceil(vocab / 32);
  const x: StepInput = {
    tokens: new Int32Array(c.T), positions: new Int32Array(c.T), seqStarts: new Int32Array(seqs.length + 1),
    slotMapping: new Int32Array(c.T), blockTables: new Int32Array(seqs.length * c.maxBlocks).fill(-1),
    contextLens: new Int32Array(seqs.length), maxBlocks: c.maxBlocks,
    sampleRows: new Int32Array(c.S), temperature: new Float32Array(c.S), topP: new Float32Array(c.S), topK: new Int32Array(c.S),
    minP: new Float32Array(c.S), repetitionPenalty: new Float32Array(c.S), presencePenalty: new Float32Array(c.S),
    frequencyPenalty: new Float32Array(c.S), seeds: new BigUint64Array(c.S), counters: new Int32Array(c.S), numLogprobs: new Int32Array(c.S),
    biasOffsets: new Int32Array(c.S + 1), biasIds: new Int32Array(c.bias), biasValues: new Float32Array(c.bias),
    maskOffsets: new Int32Array(c.S).fill(-1), masks: new Int32Array(c.masks * maskWords), maskWords,
    promptOffsets: new Int32Array(c.S + 1), promptTokens: new Int32Array(c.prompt),
    outputOffsets: new Int32Array(c.S + 1), outputTokens: new Int32Array(c.output),
    scoreRows: new Int32Array(c.scores), scoreTargets: new Int32Array(c.scores), scoreTopN: new Int32Array(c.scores),
    returnLogits: false, decodeSteps, rowsPerSeq: [], sources: [],
  };
  const at = { row: 0, sample: 0, bias: 0, prompt: 0, output: 0, score: 0, mask: 0 };
  seqs.forEach((s, b) => {
    writeRows(x, s, b, at.row, blockSize, decodeSteps);
    const first = firstReturnedRow(s);
    x.rowsPerSeq.push(s.tokenIds.length - first);
    for (let i = first; i < s.tokenIds.length; i++) writeSampleRow(x, at.row + i, i === s.tokenIds.length - 1 ? s.sample : null, at);
    s.score?.targets.forEach((target, i) => {
      x.scoreRows[at.score] = at.row + s.score!.firstRow + i;
      x.scoreTargets[at.score] = target;
      x.scoreTopN[at.score++] = s.score!.topN;
    });
    x.returnLogits ||= s.allLogits === true;
    at.row += s.tokenIds.length;
  });
  x.seqStarts[seqs.length] = at.row;
  if (x.sources.length > 0) x.masksPending = true;
  return x;
}

/** Sequence b's token rows from `row`: tokens, positions, KV slots, its block table and context length. */
function writeRows(x: StepInput, s: RunnerSequence, b: number, row: number, blockSize: number, decodeSteps: number): void {
  x.seqStarts[b] = row;
  const ctx = s.startPosition + s.tokenIds.length;
  x.contextLens[b] = ctx;
  const blocks = tableBlocks(s, blockSize, decodeSteps);
  for (let i = 0; i < blocks; i++) x.blockTables[b * x.maxBlocks + i] = s.blockTable[i] ?? -1;
  for (let i = 0; i < s.tokenIds.length; i++) {
    const pos = s.startPosition + i;
    x.tokens[row + i] = s.tokenIds[i]!;
    x.positions[row + i] = pos;
    x.slotMapping[row + i] = (s.blockTable[Math.floor(pos / blockSize)] ?? -1) * blockSize + (pos % blockSize);
  }
}

/** One returned row: sampled by `req`, or greedily (its results ignored) when null. */
function writeSampleRow(x: StepInput, row: number, req: RunnerSequence["sample"], at: { sample: number; bias: number; prompt: number; output: number; mask: number }): void {
  const i = at.sample++;
  const p = req ? req.params : GREEDY;
  x.sampleRows[i] = row;
  x.temperature[i] = p.temperature;
  x.topP[i] = p.topP;
  x.topK[i] = p.topK;
  x.minP[i] = p.minP;
  x.repetitionPenalty[i] = p.repetitionPenalty;
  x.presencePenalty[i] = p.presencePenalty;
  x.frequencyPenalty[i] = p.frequencyPenalty;
  x.seeds[i] = BigInt.asUintN(64, BigInt(p.seed));
  x.counters[i] = req ? req.counter : 0;
  x.numLogprobs[i] = p.logprobs;
  for (const [id, value] of req?.params.logitBias ?? []) writeBias(x, at, id, value);
  for (const id of req?.banned ?? []) writeBias(x, at, id, -Infinity);
  x.biasOffsets[i + 1] = at.bias;
  if (req && usesPenalties(p)) {
    x.promptTokens.set(req.promptIds, at.prompt);
    x.outputTokens.set(req.outputIds, at.output);
    at.prompt += req.promptIds.length;
    at.output += req.outputIds.length;
  }
  x.promptOffsets[i + 1] = at.prompt;
  x.outputOffsets[i + 1] = at.output;
  if (req?.mask) writeMask(x, req.mask, i, at);
}

function writeBias(x: StepInput, at: { bias: number }, id: number, value: number): void {
  x.biasIds[at.bias] = id;
  x.biasValues[at.bias++] = value;
}

/** Row i's grammar mask at its place in `masks`; one still to be made is written there by stepWhileMasking. */
function writeMask(x: StepInput, mask: Int32Array | MaskSource, i: number, at: { mask: number }): void {
  if (typeof mask === "function") x.sources.push({ at: at.mask, make: mask });
  else if (mask.length !== x.maskWords) throw new Error(`a token mask has ${mask.length} words; the vocabulary needs ${x.maskWords}`);
  else x.masks.set(mask, at.mask);
  x.maskOffsets[i] = at.mask;
  at.mask += x.maskWords;
}
