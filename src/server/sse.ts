/**
 * Server-sent events over a raw Node response: one `data:` line per event,
 * flushed as written. A reader that stops reading cannot make the server
 * buffer without bound: once the socket's buffer is full, the reader has
 * `stallTimeoutMs` to drain it, and the buffer may not grow past
 * `maxBufferedBytes`; either way the response is destroyed, which aborts the
 * request and frees its KV blocks.
 */
import type { ServerResponse } from "node:http";

export interface SseLimits {
  stallTimeoutMs: number;
  maxBufferedBytes: number;
}

export const DEFAULT_SSE_LIMITS: SseLimits = { stallTimeoutMs: 30_000, maxBufferedBytes: 4 * 1024 * 1024 };

export class SseWriter {
  private closed = false;
  private stallTimer: NodeJS.Timeout | null = null;

  constructor(
    private readonly res: ServerResponse,
    private readonly limits: SseLimits = DEFAULT_SSE_LIMITS,
    /** Called once if the reader is cut off for stalling. */
    private readonly onStall: () => void = () => {},
  ) {
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    res.flushHeaders();
    res.on("close", () => {
      this.closed = true;
      this.clearStall();
    });
    res.on("drain", () => this.clearStall());
  }

  get isClosed(): boolean {
    return this.closed || this.res.destroyed;
  }

  send(data: unknown): void {
    this.write(`data: ${JSON.stringify(data)}\n\n`);
  }

  done(): void {
    if (this.isClosed) return;
    this.res.write("data: [DONE]\n\n");
    this.res.end();
    this.closed = true;
    this.clearStall();
  }

  private write(chunk: string): void {
    if (this.isClosed) return;
    const flushed = this.res.write(chunk);
    if (this.res.writableLength > this.limits.maxBufferedBytes) return this.cutOff();
    if (!flushed && !this.stallTimer) this.stallTimer = setTimeout(() => this.cutOff(), this.limits.stallTimeoutMs);
  }

  private cutOff(): void {
    if (this.isClosed) return;
    this.onStall();
    this.res.destroy();
  }

  private clearStall(): void {
    if (this.stallTimer) clearTimeout(this.stallTimer);
    this.stallTimer = null;
  }
}
