/**
 * One engine per loaded model, one step in flight. The loop is:
 * schedule → launch (native, off the event loop) → emit the step before's
 * outputs while this one computes → update.
 */
import { randomUUID } from "node:crypto";
import { KvCacheManager } from "../kv/kv-cache-manager.js";
import { IncrementalDetokenizer } from "../model/detokenizer.js";
import type { TextTokenizer } from "../model/tokenizer.js";
import type { MaskSource, RunnerSequence, StepResult } from "../runtime/model-runner.js";
import { AdmissionPolicy, refusalError } from "./admission.js";
import type { EngineConfig, ModelLimits } from "./engine-config.js";
import { EngineError } from "./errors.js";
import type { Grammar } from "./grammar.js";
import { OutputStream, type RequestOutput } from "./output-stream.js";
import { Priority, Request, RequestStatus, finishReason, isFinished, type RequestInput, type StopReason } from "./request.js";
import { Scheduler, type ScheduledRequest } from "./scheduler.js";
import { StopStringMatcher } from "./stop-strings.js";

export interface Runner {
  /** One step, or `decodeSteps` decode steps in one call (ModelRunner.execute): their results after the first in `following`. */
  execute(seqs: readonly RunnerSequence[], decodeSteps?: number): Promise<StepResult>;
}

/** Latency samples, in seconds, for the server's histograms. */
export interface EngineObserver {
  timeToFirstToken?(s: number): void;
  interTokenLatency?(s: number): void;
  e2eLatency?(s: number): void;
  queueTime?(s: number): void;
  /** A step's duration and its rows: decode rows (one new token of a generating request) and prefill rows. */
  step?(s: number, rows: { prefill: number; decode: number }): void;
  finished?(r: Request): void;
}

export interface EngineStats {
  running: number;
  waiting: number;
  waitingByPriority: { high: number; normal: number; low: number };
  blocksTotal: number;
  blocksUsed: number;
  blocksCachedFree: number;
  blocksFree: number;
  prefixCacheQueries: number;
  prefixCacheHits: number;
  preemptions: number;
  agingPromotions: number;
  steps: number;
}

/** A step in flight: when it started, its rows (for the observer), how many decode steps it runs, and its result. */
interface LaunchedStep {
  start: number;
  decode: number;
  rows: number;
  steps: number;
  result: Promise<StepResult>;
}

/**
 * What a recorded step sends a request's stream: a token, with the request's output count with
 * it and whether it ended the request; or the end of a request whose row failed.
 */
type Emission = { sample: NonNullable<StepResult["samples"][number]>; count: number; last: boolean } | { failed: true };

interface Live {
  request: Request;
  stream: OutputStream;
  detok: IncrementalDetokenizer | null;
  stops: StopStringMatcher;
  pending: RequestOutput;
  /** Its prompt log-probs have been handed to its pending output. */
  promptSent: boolean;
}

export class Engine {
  readonly kv: KvCacheManager;
  readonly scheduler: Scheduler;
  private readonly live = new Map<string, Live>();
  private loop: Promise<void> | null = null;
  private kickAgain = false;
  private sequence = 0;
  private accepting = true;
  private steps = 0;
  private readonly admission: AdmissionPolicy;

  constructor(
    private readonly runner: Runner,
    readonly config: EngineConfig,
    readonly limits: ModelLimits,
    private readonly tokenizer: TextTokenizer | null = null,
    private readonly now: () => number = () => performance.now() / 1000,
    private readonly observer: EngineObserver = {},
  ) {
    this.kv = new KvCacheManager(limits.numBlocks, config.blockSize, config.enablePrefixCaching);
    this.scheduler = new Scheduler(config, limits, this.kv, now);
    this.admission = new AdmissionPolicy(config);
  }

  /** Queues a request; its outputs arrive on the returned stream. Throws EngineError at admission. */
  add(input: RequestInput): OutputStream {
    return this.addGroup([input])[0]!;
  }

  /** Queues requests that stand or fall together (one API request's prompts × n): all are admitted, or none. */
  addGroup(inputs: readonly RequestInput[]): OutputStream[] {
    for (const input of inputs) this.check(input);
    this.admitGroup(inputs);
    const ids = inputs.map((input) => input.id ?? randomUUID());
    if (new Set(ids).size !== ids.length || ids.some((id) => this.live.has(id))) throw new EngineError("invalid_request", "request ids must be unique");
    return inputs.map((input, i) => this.enqueue(input, ids[i]!));
  }

  private enqueue(input: RequestInput, id: string): OutputStream {
    const tenant = input.tenant ?? "";
    const r = new Request(id, [...input.promptTokenIds], input.params, input.priority ?? Priority.NORMAL, tenant,
      input.cacheSalt ?? tenant, this.now(), this.sequence++);
    r.grammar = input.grammar ?? null;
    const stream = new OutputStream(id, () => this.abort(id));
    const detok = this.tokenizer ? new IncrementalDetokenizer(this.tokenizer, r.promptTokenIds, input.params.skipSpecialTokens) : null;
    this.live.set(id, { request: r, stream, detok, stops: new StopStringMatcher(input.params.stop, input.params.includeStopStrInOutput), pending: emptyOutput(), promptSent: false });
    this.scheduler.add(r);
    this.kick();
    return stream;
  }

  /** Ends a request now: its blocks are free at once and its stream ends with finish_reason "abort". */
  abort(id: string, status = RequestStatus.FINISHED_ABORTED, error?: string, errorKind: "shutdown" | "internal" = "internal"): void {
    const l = this.live.get(id);
    if (!l) return;
    if (error) l.request.error = error;
    l.request.errorKind = errorKind;
    this.scheduler.finish(l.request, status);
    this.complete(l);
  }

  get idle(): boolean {
    return !this.scheduler.hasWork;
  }

  stats(): EngineStats {
    const c = this.scheduler.waiting.counts;
    const pool = this.kv.pool;
    return {
      running: this.scheduler.running.length,
      waiting: this.scheduler.waiting.size,
      waitingByPriority: { high: c[0]!, normal: c[1]!, low: c[2]! },
      blocksTotal: pool.numBlocks,
      blocksUsed: pool.numUsed,
      blocksCachedFree: pool.numCachedFree,
      blocksFree: pool.numFree,
      prefixCacheQueries: this.kv.queries,
      prefixCacheHits: this.kv.hits,
      preemptions: this.scheduler.counters.preemptions,
      agingPromotions: this.scheduler.counters.agingPromotions,
      steps: this.steps,
    };
  }

  /** Stops accepting; lets work finish for up to `timeoutMs`, then ends the rest with an error. */
  async shutdown(timeoutMs = 0): Promise<void> {
    this.accepting = false;
    const deadline = Date.now() + timeoutMs;
    while (this.scheduler.hasWork && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    for (const id of [...this.live.keys()]) this.abort(id, RequestStatus.FINISHED_ERROR, "the server is shutting down", "shutdown");
    await this.loop;
  }

  /** Checks one request on its own: it must be computable and fit the context and the KV pool. */
  private check(input: RequestInput): void {
    if (!this.accepting) throw new EngineError("shutting_down", "the engine is shutting down");
    const n = input.promptTokenIds.length, o = { ...this.limits, blockSize: this.config.blockSize };
    if (n === 0) throw new EngineError("invalid_request", "the prompt is empty", "prompt");
    const bad = input.promptTokenIds.find((t) => !Number.isInteger(t) || t < 0 || t >= o.vocabSize);
    if (bad !== undefined) throw new EngineError("invalid_request", `prompt token id ${bad} is outside the vocabulary (0..${o.vocabSize - 1})`, "prompt");
    const total = n + input.params.maxTokens;
    if (total > o.maxModelLen) {
      throw new EngineError("context_length_exceeded",
        `This model's maximum context length is ${o.maxModelLen} tokens; the prompt has ${n} and max_tokens is ${input.params.maxTokens} (${total} in all).`, "max_tokens");
    }
    if (Math.ceil(total / o.blockSize) > o.numBlocks) {
      throw new EngineError("invalid_request",
        `prompt + max_tokens (${total} tokens) can never fit the KV cache (${o.numBlocks} blocks of ${o.blockSize} tokens)`, "max_tokens");
    }
  }

  /** Queue room, decided by the admission policy for the whole group. */
  private admitGroup(inputs: readonly RequestInput[]): void {
    const first = inputs[0];
    if (!first) return;
    const verdict = this.admission.check(this.scheduler.waiting, { priority: first.priority ?? Priority.NORMAL, tenant: first.tenant ?? "", sequences: inputs.length });
    if (!verdict.ok) throw refusalError(verdict);
  }

  /**
   * Starts the loop, or has it start again if it is ending: a request's stream can end (and its
   * caller add the next) while the loop still awaits a step it no longer needs.
   */
  private kick(): void {
    if (this.loop) {
      this.kickAgain = true;
      return;
    }
    this.kickAgain = false;
    this.loop = this.run().finally(() => {
      this.loop = null;
      if (this.kickAgain) this.kick();
    });
  }

  /**
   * A step's outputs (detokenizing, stop strings, the streams) are emitted once the next step
   * is launched, while it computes: at 512 sequences that work is a fifth of a GPU decode
   * step (docs/BATCHING.md). A row the next step computes for a request that a stop string
   * then ends is wasted, as in vLLM's async scheduling: its result is dropped (the request is
   * no longer running), and its cache write lands in blocks that no step can reuse before it.
   */
  private async run(): Promise<void> {
    let emit: (() => void) | null = null;
    try {
      while (this.scheduler.hasWork) {
        const scheduled = this.scheduler.schedule();
        if (scheduled.length === 0) break; // nothing fits: cannot happen after admission checks, but never spin
        const step = this.launch(scheduled, this.decodeSteps(scheduled));
        emit?.();
        emit = null;
        const result = await this.awaitStep(scheduled, step);
        if (result) emit = this.process(scheduled, result);
      }
    } finally {
      emit?.();
    }
  }

  /**
   * Decode steps for this call (--num-scheduler-steps): more than one only when every running
   * request is a plain decode row in it (no grammar, past min_tokens, no prompt log-probs), no
   * waiting request could start at the next step (it would wait out the run; one that waits for a
   * full batch's slot it cannot take does not count), none would pass the context length, and
   * the blocks for the extra tokens are free now (allocated here). A request that reaches its
   * max_tokens inside a run ends there, like one that stops (the run's later rows of it are
   * dropped), so that one request near its end does not shorten every run of the batch.
   */
  private decodeSteps(scheduled: readonly ScheduledRequest[]): number {
    let k = this.config.numSchedulerSteps;
    if (k === 1 || this.scheduler.admissionPending || scheduled.length !== this.scheduler.running.length) return 1;
    for (const { request: r, numTokens, sample } of scheduled) {
      const p = r.params;
      if (numTokens !== 1 || !sample || r.outputTokenIds.length === 0 || r.grammar || r.outputTokenIds.length < p.minTokens || p.promptLogprobs !== null) return 1;
      k = Math.min(k, this.limits.maxModelLen - r.numTokens);
    }
    if (k <= 1) return 1;
    const needed = scheduled.reduce((n, s) => n + this.kv.blocksNeeded(s.request, k), 0);
    if (needed > this.kv.pool.numFree) return 1;  // taking blocks for a run could push a later step into preemption
    for (const s of scheduled) this.kv.allocateSlots(s.request, k);
    return k;
  }

  /** Starts the step (the runner launches it before returning); a failure to start rejects its result. */
  private launch(scheduled: ScheduledRequest[], steps: number): LaunchedStep {
    const start = this.now();
    try {
      // A constrained row samples under its grammar's mask, made while the step's forward pass runs
      // (its matcher took the previous token in process()); other rows are untouched.
      const seqs: RunnerSequence[] = scheduled.map(({ request: r, numTokens, sample }) => ({
        tokenIds: r.tokenSlice(r.numComputedTokens, r.numComputedTokens + numTokens),
        startPosition: r.numComputedTokens,
        blockTable: this.kv.blockIds(r.id),
        ...(r.params.promptLogprobs !== null ? { score: r.scoreSpan(numTokens) } : {}),
        sample: sample && r.params.maxTokens > 0 ? { params: r.params, counter: r.outputTokenIds.length, promptIds: r.promptTokenIds, outputIds: r.outputTokenIds, banned: this.banned(r), ...maskOf(r) } : null,
      }));
      const decode = scheduled.filter((s) => s.request.outputTokenIds.length > 0 && s.numTokens === 1 && s.request.numComputedTokens === s.request.numTokens - 1).length;
      return { start, decode, rows: seqs.reduce((n, s) => n + s.tokenIds.length, 0), steps, result: this.runner.execute(seqs, steps) };
    } catch (e) {
      return { start, decode: 0, rows: 0, steps, result: Promise.reject(e instanceof Error ? e : new Error(String(e))) };
    }
  }

  private async awaitStep(scheduled: ScheduledRequest[], step: LaunchedStep): Promise<StepResult | null> {
    try {
      const result = await step.result;
      if ((result.following?.length ?? 0) !== step.steps - 1) throw new Error(`the runner returned ${1 + (result.following?.length ?? 0)} of ${step.steps} decode steps`);
      // A multi-step run counts as its steps, each an equal share of its time.
      const seconds = (this.now() - step.start) / step.steps;
      for (let j = 0; j < step.steps; j++) this.observer.step?.(seconds, { decode: step.decode, prefill: step.rows - step.decode });
      this.steps += step.steps;
      return result;
    } catch (e) {
      const message = e instanceof Error ? e.message : String(e);
      for (const s of scheduled) this.abort(s.request.id, RequestStatus.FINISHED_ERROR, `engine step failed: ${message}`);
      return null;
    }
  }

  /** Before min_tokens, the tokens that would stop the request cannot be sampled (vLLM's min_tokens). */
  private banned(r: Request): number[] {
    const p = r.params;
    if (r.outputTokenIds.length >= p.minTokens) return [];
    return [...(p.ignoreEos ? [] : this.limits.eosTokenIds), ...p.stopTokenIds];
  }

  /**
   * Records a step's results, everything the next step's schedule depends on (tokens, stop
   * tokens, lengths, grammars, failures), decode step after decode step; returns the emission
   * of its outputs (see run()). A decode step's row counts only while its request still runs:
   * a stop in an earlier step of the same call drops the rest.
   */
  private process(scheduled: ScheduledRequest[], result: StepResult): () => void {
    const steps = [result, ...(result.following ?? [])].map((r) => this.record(scheduled, r));
    return () => this.emit(scheduled, steps);
  }

  /**
   * One step's results recorded; returns what each row sends its stream where its request was
   * still running, as it stood then. A row the step could not compute fails alone (the rest of the
   * batch goes on): its request ends now, and its stream once the tokens before are out.
   */
  private record(scheduled: ScheduledRequest[], result: StepResult): (Emission | null)[] {
    const running = scheduled.map((s) => s.request.status === RequestStatus.RUNNING);
    this.advanceGrammars(scheduled, result);
    this.recordScores(scheduled, result);
    const tokens = result.samples.map((s) => s?.tokenId ?? null);
    this.scheduler.update(scheduled, tokens);
    return result.samples.map((sample, i) => {
      const r = scheduled[i]!.request, error = result.errors[i];
      if (!running[i]) return null;
      if (error) {
        r.error = `step failed for this request: ${error}`;
        r.errorKind = "internal";
        this.scheduler.finish(r, RequestStatus.FINISHED_ERROR);
        return { failed: true };
      }
      return sample ? { sample, count: r.outputTokenIds.length, last: r.status !== RequestStatus.RUNNING } : null;
    });
  }

  /** Each sampled token goes to its request's stream, step by step; a stop string found in its text ends the request. */
  private emit(scheduled: ScheduledRequest[], steps: (Emission | null)[][]): void {
    const now = this.now();
    for (const emissions of steps) {
      scheduled.forEach((s, i) => {
        const e = emissions[i];
        const l = this.live.get(s.request.id);
        if (!e || !l) return;
        if ("failed" in e) this.complete(l);
        else this.emitToken(l, e, now);
      });
    }
    // Ended without a token (max_tokens 0): its stream ends here.
    for (const s of scheduled) {
      const l = this.live.get(s.request.id);
      if (l && s.request.status >= RequestStatus.FINISHED_STOPPED) this.complete(l);
    }
  }

  /** Prompt log-probs: each scored row's result in order; the whole list goes out with the request's next output. */
  private recordScores(scheduled: ScheduledRequest[], result: StepResult): void {
    scheduled.forEach(({ request: r }, i) => {
      const l = this.live.get(r.id);
      if (!l || r.params.promptLogprobs === null || l.promptSent) return;
      r.promptScores.push(...(result.scores?.[i] ?? []));
      if (r.promptScores.length < r.promptTokenIds.length - 1) return;
      l.pending.promptLogprobs = [null, ...r.promptScores];
      l.promptSent = true;
    });
  }

  /** Each constrained row's grammar takes its sampled token; the scheduler's stop check then sees grammarDone. */
  private advanceGrammars(scheduled: ScheduledRequest[], result: StepResult): void {
    scheduled.forEach(({ request: r }, i) => {
      const sample = result.samples[i];
      if (!r.matcher || !sample || r.status !== RequestStatus.RUNNING) return;
      if (!r.matcher.accept(sample.tokenId)) {
        result.samples[i] = null;
        result.errors[i] = `token ${sample.tokenId} does not follow the request's grammar`;
        return;
      }
      r.grammarDone = r.matcher.done;
    });
  }

  private emitToken(l: Live, { sample, count, last }: Extract<Emission, { sample: unknown }>, now: number): void {
    const r = l.request;
    if (r.firstTokenTime === null) {
      r.firstTokenTime = now;
      this.observer.timeToFirstToken?.(now - r.arrivalTime);
      if (r.scheduledTime !== null) this.observer.queueTime?.(r.scheduledTime - r.arrivalTime);
    } else if (r.lastTokenTime !== null) {
      this.observer.interTokenLatency?.(now - r.lastTokenTime);
    }
    r.lastTokenTime = now;
    l.pending.tokenIds.push(sample.tokenId);
    l.pending.logprobs.push({ tokenId: sample.tokenId, logprob: sample.logprob, top: sample.top });
    // The scheduler decided whether this token stopped the request; its text is hidden unless asked for.
    const hidden = last && r.stopReason?.kind === "token" && !r.params.includeStopStrInOutput;
    const delta = l.detok && !hidden ? l.detok.push(sample.tokenId) : "";
    const { text, stopped: matched } = l.stops.push(delta, count >= r.params.minTokens);
    l.pending.text += text;
    if (matched !== null) this.stopAtString(r, count, last, matched);
    if (last || matched !== null) this.complete(l);
    else this.flush(l);
  }

  /**
   * A stop string ends the request at its count-th token. The tokens a multi-step run recorded
   * past it (and an ending they reached) are dropped; an ending at this same token stands.
   */
  private stopAtString(r: Request, count: number, last: boolean, stop: string): void {
    if (last) return this.scheduler.finish(r, RequestStatus.FINISHED_STOPPED, { kind: "string", stop });
    r.outputTokenIds.length = count;
    if (!isFinished(r.status)) return this.scheduler.finish(r, RequestStatus.FINISHED_STOPPED, { kind: "string", stop });
    r.status = RequestStatus.FINISHED_STOPPED;
    r.stopReason = { kind: "string", stop };
    r.error = null;
  }

  private flush(l: Live): void {
    const out = l.pending;
    if (out.tokenIds.length === 0 && out.text === "") return;
    l.pending = emptyOutput();
    l.stream.push(out);
  }

  private complete(l: Live): void {
    const r = l.request;
    this.live.delete(r.id);
    r.matcher?.dispose();
    const out = l.pending;
    if (r.stopReason?.kind !== "string") {
      // Release held-back text (an incomplete character, a possible stop-string prefix).
      const tail = l.detok && r.status !== RequestStatus.FINISHED_ABORTED ? l.detok.flush() : "";
      out.text += l.stops.push(tail).text + l.stops.flush();
    }
    out.finished = true;
    out.finishReason = finishReason(r.status) ?? "error";
    out.stopReason = stopReasonValue(r.stopReason);
    out.usage = { promptTokens: r.promptTokenIds.length, completionTokens: r.outputTokenIds.length, cachedTokens: r.numCachedTokens };
    if (r.error) Object.assign(out, { error: r.error, errorKind: r.errorKind });
    this.observer.e2eLatency?.(this.now() - r.arrivalTime);
    this.observer.finished?.(r);
    l.stream.push(out);
  }
}

/** A constrained request's mask, as the runner takes it: made once the step has started. */
function maskOf(r: Request): { mask?: MaskSource } {
  const grammar = r.grammar;
  if (!grammar) return {};
  return { mask: () => nextMask(r, grammar) };
}

/** The request's next token mask; its matcher is made at its first sampled step (not while it waits in the queue). */
async function nextMask(r: Request, grammar: Grammar): Promise<Int32Array | undefined> {
  if (!r.matcher) {
    const m = await grammar.matcher();
    if (r.status !== RequestStatus.RUNNING) return void m.dispose(); // it ended while the matcher was made
    r.matcher = m;
  }
  return r.matcher.nextMask();
}

/** vLLM's stop_reason: the stop token id or stop string; null for EOS and non-stop endings. */
function stopReasonValue(s: StopReason | null): number | string | null {
  if (!s) return null;
  if (s.kind === "string") return s.stop;
  return s.eos ? null : s.tokenId;
}

function emptyOutput(): RequestOutput {
  return { tokenIds: [], text: "", logprobs: [], finished: false };
}
