/**
 * Per-key token usage, recorded off the request path. `record` only adds to
 * an in-memory total per key name, so the queue holds at most one entry per
 * key. A timer writes all totals in one transaction every `flushMs`, waiting
 * at most 20 ms for a lock: while another process holds the database the
 * totals stay queued and the write is retried on the next tick, so no
 * accepted usage is lost while the process lives. Failures are logged (the
 * first of a run, then the recovery) and counted, never thrown. `close` makes
 * a last, patient write.
 */
import { STDERR_LOG, type KeyStore, type LockWait, type StoreLog, type UsageTotals } from "./database.js";

export interface UsageRecorderOptions {
  /** Milliseconds between writes; default 1000. */
  flushMs?: number;
  /** Where failed and recovered writes are reported; default stderr. */
  log?: StoreLog;
}

export class UsageRecorder {
  private pending = new Map<string, UsageTotals>();
  private timer: NodeJS.Timeout | null = null;
  private closed = false;
  /** Failed writes in the current run of failures. */
  private failing = 0;
  /** Writes that failed since the start (their totals were kept for the next one). */
  failedWrites = 0;
  private readonly flushMs: number;
  private readonly log: StoreLog;

  constructor(
    private readonly store: KeyStore,
    options: UsageRecorderOptions = {},
  ) {
    this.flushMs = options.flushMs ?? 1000;
    this.log = options.log ?? STDERR_LOG;
  }

  /** Counts one finished request of key `name`. Cheap, synchronous, never throws. */
  record(name: string, promptTokens: number, completionTokens: number): void {
    if (this.closed) {
      this.log.warn({ key: name, promptTokens, completionTokens }, "usage recorded after close was not written");
      return;
    }
    add(this.pending, name, { requests: 1, promptTokens, completionTokens });
    this.schedule();
  }

  /** Keys whose usage is waiting to be written. */
  get pendingKeys(): number {
    return this.pending.size;
  }

  /** Writes the queued totals now; false when the database refused them (they stay queued). */
  flush(): boolean {
    return this.write("brief");
  }

  /** Stops the timer and writes what is queued, waiting up to 5 s for a lock; what still cannot be written is logged. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    if (!this.write("patient")) this.log.warn({ lost: Object.fromEntries(this.pending) }, "usage could not be written before close");
  }

  private schedule(): void {
    if (this.timer || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.write("brief");
      if (this.pending.size > 0) this.schedule();
    }, this.flushMs);
    this.timer.unref();
  }

  private write(wait: LockWait): boolean {
    if (this.pending.size === 0) return true;
    const batch = this.pending;
    this.pending = new Map();
    try {
      this.store.addUsage(batch, wait);
    } catch (e) {
      for (const [name, t] of batch) add(this.pending, name, t);
      this.failedWrites++;
      if (this.failing++ === 0) this.log.warn({ err: e instanceof Error ? e.message : String(e), pendingKeys: this.pending.size }, "usage write failed; retrying every tick");
      return false;
    }
    if (this.failing > 0) this.log.info({ failedAttempts: this.failing }, "usage written again");
    this.failing = 0;
    return true;
  }
}

function add(totals: Map<string, UsageTotals>, name: string, t: UsageTotals): void {
  const sum = totals.get(name) ?? { requests: 0, promptTokens: 0, completionTokens: 0 };
  sum.requests += t.requests;
  sum.promptTokens += t.promptTokens;
  sum.completionTokens += t.completionTokens;
  totals.set(name, sum);
}
