/**
 * Admission to the waiting queue, counted in sequences (one per prompt × n).
 * A request's sequences are admitted together or refused together.
 * Room is reserved by priority: requests of base priority p or worse may hold
 * at most QUEUE_SHARES[p] of the queue (HIGH all of it, NORMAL 3/4, LOW 1/2),
 * so no flood of worse work can take the room kept for better work.
 * One tenant may hold at most maxWaitingPerTenant waiting sequences.
 * Nothing accepted is evicted: a refusal is a 429 to retry, or a 400 when the
 * request is larger than the limit itself and could never be admitted.
 */
import type { EngineConfig } from "./engine-config.js";
import { EngineError } from "./errors.js";
import { Priority } from "./request.js";

/** The share of the queue that requests of each base priority or worse may hold, indexed by Priority. */
export const QUEUE_SHARES: readonly number[] = [1, 0.75, 0.5];

/** The queue moves at every engine step: a second later the counts are fresh. */
const RETRY_AFTER_S = 1;

const NAMES = ["high", "normal", "low"];

/** What admission reads from the waiting queue (RequestQueue provides both). */
export interface WaitingCounts {
  /** Waiting sequences per base priority, indexed by Priority. */
  readonly counts: readonly number[];
  waitingOf(tenant: string): number;
}

/** One API request's sequences: they share a priority and a tenant. */
export interface AdmissionGroup {
  priority: Priority;
  tenant: string;
  /** prompts × n. */
  sequences: number;
}

/** The limit that refused a group: the whole queue, the room its priority may use, or its tenant's cap. */
export type QueueLimit = "total" | "priority_share" | "tenant";

export type Refusal =
  /** Temporary: the limit has room again once waiting sequences are scheduled. */
  | { ok: false; code: "queue_full"; limit: QueueLimit; message: string; retryAfter: number }
  /** Permanent: the group alone is larger than the limit. */
  | { ok: false; code: "invalid_request"; limit: QueueLimit; message: string; param: "n" };

export type Admission = { ok: true } | Refusal;

export class AdmissionPolicy {
  /** room[p]: the most sequences of base priority p or worse that may wait; room[HIGH] is the whole queue. */
  private readonly room: readonly number[];
  private readonly perTenant: number;

  constructor(config: Pick<EngineConfig, "maxWaitingRequests" | "maxWaitingPerTenant">) {
    // Rounded up, so a tiny queue admits every priority rather than refusing some always.
    this.room = QUEUE_SHARES.map((s) => Math.ceil(s * config.maxWaitingRequests));
    this.perTenant = config.maxWaitingPerTenant;
  }

  /** Whether all of the group's sequences may join the queue now; if not, the limit that refuses them. */
  check(waiting: WaitingCounts, g: AdmissionGroup): Admission {
    const k = g.sequences, cap = this.perTenant;
    if (cap > 0 && k > cap) return never("tenant", k, `more than the ${cap} one API key may have waiting`);
    const own = this.room[g.priority]!;
    if (k > own) return never(g.priority === Priority.HIGH ? "total" : "priority_share", k, `more than the ${own} ${NAMES[g.priority]}-priority sequences the queue may hold`);
    const mine = waiting.waitingOf(g.tenant);
    if (cap > 0 && mine + k > cap) return full("tenant", `this API key already has ${mine} sequences waiting, of the ${cap} it may have; this request has ${k}`);
    // Each nested share, from the group's own priority up to the whole queue, must have room.
    let held = waiting.counts.slice(g.priority).reduce((a, b) => a + b, 0);
    for (let p = g.priority; p >= Priority.HIGH; p--) {
      if (p < g.priority) held += waiting.counts[p] ?? 0;
      const room = this.room[p]!;
      if (held + k <= room) continue;
      return p === Priority.HIGH
        ? full("total", `the queue is full: ${held} of its ${room} places are taken; this request has ${k} sequences`)
        : full("priority_share", `the queue is full for ${NAMES[p]} priority: requests of ${NAMES[p]} priority or lower hold ${held} ` +
          `of the ${room} places they may use (the rest is kept for higher priorities); this request has ${k} sequences`);
    }
    return { ok: true };
  }
}

/** The engine's error for a refusal. */
export function refusalError(r: Refusal): EngineError {
  return r.code === "queue_full" ? new EngineError("queue_full", r.message, null, r.retryAfter) : new EngineError("invalid_request", r.message, r.param);
}

function full(limit: QueueLimit, message: string): Refusal {
  return { ok: false, code: "queue_full", limit, message, retryAfter: RETRY_AFTER_S };
}

function never(limit: QueueLimit, sequences: number, what: string): Refusal {
  return { ok: false, code: "invalid_request", limit, message: `this request has ${sequences} sequences (prompts × n), ${what}: send fewer prompts or a smaller n`, param: "n" };
}
