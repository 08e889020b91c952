/**
 * Iteration-level scheduling under a token budget, with no prefill/decode
 * phases: each request's computed-token count chases its token count.
 * Running requests go first (one token each, or their next prefill chunk);
 * then waiting requests by effective priority while budget and blocks allow.
 */
import { KvCacheManager } from "../kv/kv-cache-manager.js";
import { RequestQueue } from "./request-queue.js";
import { Request, RequestStatus, isFinished } from "./request.js";

export interface SchedulerConfig {
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  agingRate: number;
  /** The model's context length: generation stops there. */
  maxModelLen: number;
  eosTokenIds: readonly number[];
}

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

  constructor(
    readonly config: SchedulerConfig,
    readonly kv: KvCacheManager,
    private readonly now: () => number,
  ) {
    this.waiting = new RequestQueue(config.agingRate);
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
    let preempted = false;
    for (const r of [...this.running]) {
      if (budget === 0) break;
      if (r.status !== RequestStatus.RUNNING) continue; // preempted earlier in this loop
      const n = Math.min(r.numTokens - r.numComputedTokens, budget);
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
    }
    // After a preemption memory is short: admit nothing new this step.
    while (!preempted && budget > 0 && this.running.length < this.config.maxNumSeqs) {
      const r = this.waiting.peek();
      if (!r) break;
      const cached = r.numComputedTokens === 0 ? this.kv.computedBlocks(r) : { blocks: [], numTokens: 0 };
      const n = Math.min(r.numTokens - cached.numTokens, budget);
      if (!this.kv.allocateSlots(r, n, cached.blocks)) break;
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
    }
    return out;
  }

  /**
   * Records a step's results: computed counts advance, sampled tokens are
   * appended, and token-level stop conditions end requests.
   */
  update(scheduled: readonly ScheduledRequest[], sampled: readonly (number | null)[]): void {
    scheduled.forEach((s, i) => {
      const r = s.request;
      if (r.status !== RequestStatus.RUNNING) return; // aborted while the step ran
      r.numComputedTokens += s.numTokens;
      this.kv.cacheFullBlocks(r);
      const token = sampled[i];
      if (token === null || token === undefined) return;
      r.outputTokenIds.push(token);
      const stop = this.tokenStop(r, token);
      if (stop !== null) this.finish(r, stop);
    });
  }

  /** Ends a request now: out of the queues, blocks freed. */
  finish(r: Request, status: RequestStatus): void {
    if (isFinished(r.status)) return;
    if (r.status === RequestStatus.RUNNING) this.running = this.running.filter((x) => x !== r);
    else this.waiting.remove(r);
    r.status = status;
    this.kv.free(r.id);
  }

  private tokenStop(r: Request, token: number): RequestStatus | null {
    const p = r.params;
    if (!p.ignoreEos && this.config.eosTokenIds.includes(token)) return RequestStatus.FINISHED_STOPPED;
    if (p.stopTokenIds.includes(token)) return RequestStatus.FINISHED_STOPPED;
    if (r.outputTokenIds.length >= p.maxTokens) return RequestStatus.FINISHED_LENGTH;
    if (r.numTokens >= this.config.maxModelLen) return RequestStatus.FINISHED_LENGTH;
    return null;
  }

  /** The running request with the worst effective priority; the latest arrival on ties. */
  private worstRunning(): Request {
    const key = (r: Request): number => r.priority + this.config.agingRate * r.arrivalTime;
    return this.running.reduce((w, r) => (key(r) > key(w) || (key(r) === key(w) && r.sequence > w.sequence) ? r : w));
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
