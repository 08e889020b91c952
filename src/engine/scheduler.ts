/**
 * Iteration-level scheduling under a token budget, with no prefill/decode
 * phases: each request's computed-token count chases its token count.
 * Running requests go first (one token each, or their next prefill chunk);
 * then waiting requests by effective priority while budget and blocks allow;
 * a full batch yields a slot to a waiting request of better base priority
 * that is also ahead in aging order; a step that computes such a
 * request's first token leaves out the rows it runs before, so that token
 * comes from a short step; and while interactive work is about, few LOW rows
 * run per step, so the step in flight when a newcomer arrives is short.
 */
import { KvCacheManager } from "../kv/kv-cache-manager.js";
import type { EngineConfig, ModelLimits } from "./engine-config.js";
import { RequestQueue, runsBefore } from "./request-queue.js";
import { Priority, Request, RequestStatus, isFinished, type StopReason } from "./request.js";

export interface ScheduledRequest {
  request: Request;
  /** Tokens computed for it in this step. */
  numTokens: number;
  /** This step reaches the end of its known tokens, so its last row is sampled. */
  sample: boolean;
}

export interface SchedulerCounters {
  preemptions: number;
  agingPromotions: number;
}

export class Scheduler {
  readonly waiting: RequestQueue<Request>;
  running: Request[] = [];
  readonly counters: SchedulerCounters = { preemptions: 0, agingPromotions: 0 };
  /** When HIGH/NORMAL work was last seen running or waiting (seconds, as now()). */
  private lastInteractive = Number.NEGATIVE_INFINITY;

  constructor(
    readonly config: EngineConfig,
    readonly limits: ModelLimits,
    readonly kv: KvCacheManager,
    private readonly now: () => number,
  ) {
    this.waiting = new RequestQueue(config.agingRate, config.fairShare);
  }

  get hasWork(): boolean {
    return this.running.length > 0 || this.waiting.size > 0;
  }

  add(r: Request): void {
    this.waiting.push(r);
  }

  schedule(): ScheduledRequest[] {
    const out: ScheduledRequest[] = [];
    let budget = this.config.maxNumBatchedTokens;
    let lowPrefill = this.config.lowPriorityPrefillTokens;
    let lowRows = this.lowRowCap();
    let preempted = false;
    for (const r of [...this.running]) {
      if (budget === 0) break;
      if (r.status !== RequestStatus.RUNNING) continue; // preempted earlier in this loop
      if (r.priority === Priority.LOW && lowRows-- <= 0) continue; // keeps its blocks; runs once the cap allows
      const n = this.lowPrefillCap(r, Math.min(r.numTokens - r.numComputedTokens, budget), lowPrefill);
      if (n === 0) continue;
      while (!this.kv.allocateSlots(r, n)) {
        const victim = this.worstRunning();
        this.preempt(victim);
        preempted = true;
        const i = out.findIndex((s) => s.request === victim);
        if (i >= 0) budget += out.splice(i, 1)[0]!.numTokens;
        if (victim === r) break;
      }
      if (r.status !== RequestStatus.RUNNING) continue;
      out.push({ request: r, numTokens: n, sample: r.numComputedTokens + n === r.numTokens });
      budget -= n;
      if (n > 1 && r.priority === Priority.LOW) lowPrefill -= n;
    }
    // After a preemption memory is short: admit nothing new this step.
    while (!preempted && budget > 0) {
      const r = this.waiting.peek();
      if (!r) break;
      // Past the LOW row cap a LOW head waits, unless interactive work waits behind it (it aged ahead of them).
      if (r.priority === Priority.LOW && lowRows <= 0 && !this.interactiveWaiting()) break;
      if (this.running.length >= this.config.maxNumSeqs) {
        const freed = this.yieldSlot(r, out);
        if (freed === null) break;
        budget += freed;
      }
      // A request scoring its prompt computes every position: no prefix-cache hit.
      const cached = r.numComputedTokens === 0 && r.params.promptLogprobs === null ? this.kv.computedBlocks(r) : { blocks: [], numTokens: 0 };
      const n = this.lowPrefillCap(r, Math.min(r.numTokens - cached.numTokens, budget), lowPrefill);
      if (n === 0 || !this.kv.allocateSlots(r, n, cached.blocks)) break;
      if (this.kv.enablePrefixCaching) this.kv.recordLookup(r.numTokens, cached.numTokens);
      if (r.priority > (this.waiting.bestBasePriority() ?? r.priority)) this.counters.agingPromotions++;
      this.waiting.pop();
      r.numComputedTokens = cached.numTokens;
      if (r.numPreemptions === 0) r.numCachedTokens = cached.numTokens;
      r.status = RequestStatus.RUNNING;
      r.scheduledTime ??= this.now();
      this.running.push(r);
      out.push({ request: r, numTokens: n, sample: cached.numTokens + n === r.numTokens });
      budget -= n;
      if (r.priority === Priority.LOW) lowRows--;
      if (n > 1 && r.priority === Priority.LOW) lowPrefill -= n;
    }
    return this.deferBehindFirstTokens(out);
  }

  /**
   * LOW rows this step: all of them, unless HIGH/NORMAL work is running or waiting, or was within
   * the interactive window; then --low-priority-rows-while-interactive, taken oldest first (running
   * order is admission order), newly admitted LOW rows included. The capped rows keep their blocks,
   * and the batch keeps moving.
   */
  private lowRowCap(): number {
    const now = this.now();
    if (this.running.some((r) => r.priority < Priority.LOW) || this.interactiveWaiting()) this.lastInteractive = now;
    const cap = this.config.lowPriorityRowsWhileInteractive;
    return cap > 0 && (now - this.lastInteractive) * 1000 < this.config.interactiveWindowMs ? cap : Number.POSITIVE_INFINITY; // now() is in seconds
  }

  private interactiveWaiting(): boolean {
    return (this.waiting.bestBasePriority() ?? Priority.LOW) < Priority.LOW;
  }

  /**
   * A LOW-priority (batch) request's prompt tokens this step, within what is left of the
   * step's LOW prefill allowance: a long batch prefill would make the step in flight when
   * interactive work arrives long, and that step's length is what the newcomer waits.
   * One decode token is never held back.
   */
  private lowPrefillCap(r: Request, n: number, left: number): number {
    return r.priority === Priority.LOW && n > 1 ? Math.min(n, left) : n;
  }

  /**
   * A step that computes a request's first token leaves out every row of worse
   * base priority that the request runs before in aging order: batch rows would
   * make that step several times longer on a CPU (a 32-row decode step against
   * one short prefill), and TTFT is what interactive users feel. The rows left
   * out keep their blocks and run at the next step; aging bounds how long a row
   * can be left out, since an old enough request is ahead of any newcomer.
   * A worse row's prompt chunk that aged ahead is left out too, once: computing
   * prompt tokens costs far more than one decode token, and the next step takes it.
   */
  private deferBehindFirstTokens(out: ScheduledRequest[]): ScheduledRequest[] {
    const firsts = out.filter((s) => s.request.outputTokenIds.length === 0).map((s) => s.request);
    if (firsts.length === 0) return out;
    const rate = this.config.agingRate;
    const deferred = ({ request: r, numTokens }: ScheduledRequest): boolean => {
      const better = firsts.filter((f) => f.priority < r.priority);
      if (better.some((f) => runsBefore(f, r, rate))) return true;
      if (better.length === 0 || numTokens === 1 || r.promptDeferred) return false;
      r.promptDeferred = true;
      return true;
    };
    return out.filter((s) => !deferred(s));
  }

  /**
   * Records a step's results: computed counts advance, sampled tokens are
   * appended, and stop conditions end requests (the one place they are decided,
   * as vLLM's check_stop; stop strings, found in text, come back through finish).
   */
  update(scheduled: readonly ScheduledRequest[], sampled: readonly (number | null)[]): void {
    scheduled.forEach((s, i) => {
      const r = s.request;
      if (r.status !== RequestStatus.RUNNING) return; // aborted while the step ran
      r.numComputedTokens += s.numTokens;
      this.kv.cacheFullBlocks(r);
      const token = sampled[i];
      if (token === null || token === undefined) {
        // max_tokens 0 (an echo of the prompt): done once the prompt is computed.
        if (r.params.maxTokens === 0 && r.numComputedTokens === r.numTokens) this.finish(r, RequestStatus.FINISHED_LENGTH);
        return;
      }
      r.outputTokenIds.push(token);
      this.checkStop(r, token);
    });
  }

  /** Ends a request now: out of the queues, blocks freed; `reason` says why it stopped. */
  finish(r: Request, status: RequestStatus, reason: StopReason | null = null): void {
    if (isFinished(r.status)) return;
    if (r.status === RequestStatus.RUNNING) this.running = this.running.filter((x) => x !== r);
    else this.waiting.remove(r);
    r.status = status;
    r.stopReason = reason;
    this.kv.free(r.id);
  }

  private checkStop(r: Request, token: number): void {
    const p = r.params;
    const eos = !p.ignoreEos && this.limits.eosTokenIds.includes(token);
    const mayStop = r.outputTokenIds.length >= p.minTokens;
    if (mayStop && (eos || p.stopTokenIds.includes(token))) this.finish(r, RequestStatus.FINISHED_STOPPED, { kind: "token", tokenId: token, eos });
    else if (r.grammarDone) this.finish(r, RequestStatus.FINISHED_STOPPED, { kind: "token", tokenId: token, eos: this.limits.eosTokenIds.includes(token) });
    else if (r.outputTokenIds.length >= p.maxTokens || r.numTokens >= this.limits.maxModelLen) this.finish(r, RequestStatus.FINISHED_LENGTH);
  }

  /**
   * A full batch gives a slot to a waiting request of better base priority
   * (interactive traffic over batch work) when it is also ahead in aging
   * order, so a request that aged its way in is never pushed back out: the
   * worst running request is preempted, recomputed later from its cached
   * blocks. Returns the budget its row in this step gave back, or null when no
   * slot is yielded.
   */
  private yieldSlot(r: Request, out: ScheduledRequest[]): number | null {
    const victim = this.worstRunning();
    if (!this.takesSlot(r, victim)) return null;
    this.preempt(victim);
    const i = out.findIndex((s) => s.request === victim);
    return i >= 0 ? out.splice(i, 1)[0]!.numTokens : 0;
  }

  /** Whether waiting request r takes a full batch's slot from `victim`: better base priority, and ahead in aging order. */
  private takesSlot(r: Request, victim: Request): boolean {
    return r.priority < victim.priority && runsBefore(r, victim, this.config.agingRate);
  }

  /**
   * Whether the next schedule could start the waiting head, KV blocks aside: a slot is free, or
   * it takes one (yieldSlot). While it cannot, the running batch is all there is to run.
   */
  get admissionPending(): boolean {
    const r = this.waiting.peek();
    if (!r) return false;
    return this.running.length < this.config.maxNumSeqs || this.takesSlot(r, this.worstRunning());
  }

  /** The running request with the worst effective priority; the latest arrival on ties. */
  private worstRunning(): Request {
    return this.running.reduce((w, r) => (runsBefore(w, r, this.config.agingRate) ? r : w));
  }

  /** Frees a running request's blocks and sends it back to wait; it recomputes from scratch later. */
  private preempt(r: Request): void {
    this.running = this.running.filter((x) => x !== r);
    this.kv.free(r.id);
    r.status = RequestStatus.PREEMPTED;
    r.numComputedTokens = 0;
    r.numPreemptions++;
    this.counters.preemptions++;
    this.waiting.push(r);
  }
}
