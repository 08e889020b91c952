/**
 * Per-key rate limits over a sliding minute: requests per minute, and tokens
 * (prompt + completion) per minute. A request over either limit gets 429 with
 * Retry-After set to when the oldest counted use leaves the window.
 */
import { ApiError } from "./errors.js";

export interface RateLimits {
  /** Requests per minute per key; 0 = unlimited. */
  requestsPerMinute: number;
  /** Tokens per minute per key; 0 = unlimited. */
  tokensPerMinute: number;
}

const WINDOW_MS = 60_000;

interface Usage {
  requests: number[]; // timestamps
  tokens: { at: number; n: number }[];
}

export class RateLimiter {
  private readonly usage = new Map<string, Usage>();

  constructor(
    readonly limits: RateLimits,
    private readonly now: () => number = Date.now,
  ) {}

  get enabled(): boolean {
    return this.limits.requestsPerMinute > 0 || this.limits.tokensPerMinute > 0;
  }

  /** Counts a request for `key`, or throws 429 when a limit is reached. */
  admit(key: string): void {
    if (!this.enabled) return;
    const u = this.window(key);
    const t = this.now();
    const { requestsPerMinute: rpm, tokensPerMinute: tpm } = this.limits;
    if (rpm > 0 && u.requests.length >= rpm) throw this.limited(`${rpm} requests per minute`, u.requests[0]! + WINDOW_MS - t);
    const used = u.tokens.reduce((n, x) => n + x.n, 0);
    if (tpm > 0 && used >= tpm) throw this.limited(`${tpm} tokens per minute`, u.tokens[0]!.at + WINDOW_MS - t);
    u.requests.push(t);
  }

  /** Charges tokens once a request's usage is known. */
  charge(key: string, tokens: number): void {
    if (this.limits.tokensPerMinute > 0 && tokens > 0) this.window(key).tokens.push({ at: this.now(), n: tokens });
  }

  private window(key: string): Usage {
    let u = this.usage.get(key);
    if (!u) this.usage.set(key, (u = { requests: [], tokens: [] }));
    const cutoff = this.now() - WINDOW_MS;
    while (u.requests.length && u.requests[0]! <= cutoff) u.requests.shift();
    while (u.tokens.length && u.tokens[0]!.at <= cutoff) u.tokens.shift();
    return u;
  }

  private limited(what: string, waitMs: number): ApiError {
    return new ApiError("rate_limit_exceeded", `Rate limit reached for this API key: ${what}.`, null, Math.max(1, Math.ceil(waitMs / 1000)));
  }
}
