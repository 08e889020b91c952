/**
 * Per-key rate limits over a sliding minute, checked in two phases around
 * tokenization. admitRequest(key), before the body is read, counts the request
 * and refuses it if the key's request or token budget is already spent.
 * reserve(tokens, sequences), once the prompts are tokenized, reserves the most
 * the request can use (its prompt tokens + max_tokens for each of its prompts × n
 * sequences), refused if that does not fit what is left of the minute (429) or
 * exceeds the whole per-minute limit (400: it never could). settle(actual) then
 * keeps only the tokens really used and refunds the rest. A request counts from
 * admitRequest on and its sequences from reserve on, even if the queue refuses
 * it later; tokens count what was used. Retry-After is when enough counted use
 * leaves the window.
 */
import { apiError, type ApiError } from "./errors.js";

export interface RateLimits {
  /** Requests per minute per key; 0 = unlimited. A request counts once, whatever its prompts × n. */
  requestsPerMinute: number;
  /** Prompt + completion tokens per minute per key, reserved at admission; 0 = unlimited. */
  tokensPerMinute: number;
  /** Sequences (prompts × n) per minute per key; 0 or absent = unlimited. */
  sequencesPerMinute?: number;
}

const WINDOW_MS = 60_000;

/** One admitted request in a key's window: its sequences and tokens (reserved, then settled). */
interface Use {
  at: number;
  sequences: number;
  tokens: number;
}

/** What is checked at reservation: the request's need of one budget, and how to tell the client it never fits. */
interface Need {
  amount: (u: Use) => number;
  need: number;
  limit: number;
  unit: string;
  param: string;
  /** The request's size, then what to change, for the 400. */
  size: string;
  fix: string;
}

export class RateLimiter {
  private readonly windows = new Map<string, Use[]>();

  constructor(
    readonly limits: RateLimits,
    private readonly now: () => number = Date.now,
  ) {}

  get enabled(): boolean {
    const l = this.limits;
    return l.requestsPerMinute > 0 || l.tokensPerMinute > 0 || (l.sequencesPerMinute ?? 0) > 0;
  }

  /** Phase one: counts a request for `key`, or throws 429 when its requests or tokens for the minute are spent. */
  admitRequest(key: string): RateAdmission {
    if (!this.enabled) return new RateAdmission(null, () => {});
    const uses = this.window(key);
    const { requestsPerMinute: rpm, tokensPerMinute: tpm } = this.limits;
    if (rpm > 0 && uses.length >= rpm) throw this.limited(`${rpm} requests per minute`, uses, () => 1, uses.length + 1 - rpm);
    const used = total(uses, tokensOf);
    if (tpm > 0 && used >= tpm) throw this.limited(`${tpm} tokens per minute`, uses, tokensOf, used + 1 - tpm);
    const use: Use = { at: this.now(), sequences: 0, tokens: 0 };
    uses.push(use);
    return new RateAdmission(use, (tokens, sequences) => this.checkReservation(key, tokens, sequences));
  }

  private checkReservation(key: string, tokens: number, sequences: number): void {
    const uses = this.window(key);
    const spm = this.limits.sequencesPerMinute ?? 0, tpm = this.limits.tokensPerMinute;
    if (spm > 0) {
      this.take(uses, { amount: sequencesOf, need: sequences, limit: spm, unit: "sequences", param: "n",
        size: `this request has ${sequences} sequences (prompts × n)`, fix: "send fewer prompts or a smaller n" });
    }
    if (tpm > 0) {
      this.take(uses, { amount: tokensOf, need: tokens, limit: tpm, unit: "tokens", param: "max_tokens",
        size: `this request may use up to ${tokens} tokens (its prompts, plus max_tokens for each of its ${sequences} sequences)`, fix: "lower max_tokens or n" });
    }
  }

  /** Throws unless `need` more fits the limit over the window: 400 if it never can, else 429. */
  private take(uses: Use[], n: Need): void {
    if (n.need > n.limit) {
      throw apiError("invalid_request", { param: n.param, detail: `${n.size}, more than this API key's limit of ${n.limit} ${n.unit} per minute: ${n.fix}` });
    }
    const used = total(uses, n.amount);
    if (used + n.need > n.limit) {
      const what = `${n.limit} ${n.unit} per minute (${Math.max(0, n.limit - used)} left; this request needs ${n.need})`;
      throw this.limited(what, uses, n.amount, used + n.need - n.limit);
    }
  }

  /** The key's uses still inside the window, oldest first. */
  private window(key: string): Use[] {
    let uses = this.windows.get(key);
    if (!uses) this.windows.set(key, (uses = []));
    const cutoff = this.now() - WINDOW_MS;
    while (uses.length && uses[0]!.at <= cutoff) uses.shift();
    return uses;
  }

  /** A 429 whose Retry-After is when the oldest uses leaving the window free `excess` of `amount`. */
  private limited(what: string, uses: readonly Use[], amount: (u: Use) => number, excess: number): ApiError {
    let freed = 0, waitMs = WINDOW_MS;
    for (const u of uses) {
      freed += amount(u);
      if (freed >= excess) {
        waitMs = u.at + WINDOW_MS - this.now();
        break;
      }
    }
    return apiError("rate_limit_exceeded", { detail: what }, { retryAfter: Math.max(1, Math.ceil(waitMs / 1000)) });
  }
}

/**
 * One request's standing with the limiter, from admitRequest to its end:
 * reserve once its size is known, settle when it ends (any end: success,
 * error, abort; settling again changes nothing).
 */
export class RateAdmission {
  private settled = false;

  constructor(
    /** Null when no limit is set: nothing is counted. */
    private readonly use: Use | null,
    private readonly check: (tokens: number, sequences: number) => void,
  ) {}

  /** Reserves the most the request can use; throws 429 (or 400, never fitting) and reserves nothing on refusal. */
  reserve(tokens: number, sequences: number): void {
    if (!this.use || this.settled) return;
    this.check(tokens, sequences);
    this.use.tokens = tokens;
    this.use.sequences = sequences;
  }

  /** Keeps `actualTokens` (prompt + completion) of the reservation and refunds the rest. */
  settle(actualTokens: number): void {
    if (!this.use || this.settled) return;
    this.settled = true;
    this.use.tokens = Math.max(0, actualTokens);
  }
}

const tokensOf = (u: Use): number => u.tokens;
const sequencesOf = (u: Use): number => u.sequences;

function total(uses: readonly Use[], amount: (u: Use) => number): number {
  return uses.reduce((n, u) => n + amount(u), 0);
}
