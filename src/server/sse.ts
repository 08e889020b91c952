/** Server-sent events over a raw Node response: one `data:` line per event, flushed as written. */
import type { ServerResponse } from "node:http";

export class SseWriter {
  private closed = false;

  constructor(private readonly res: ServerResponse) {
    res.writeHead(200, {
      "content-type": "text/event-stream; charset=utf-8",
      "cache-control": "no-cache",
      connection: "keep-alive",
      "x-accel-buffering": "no",
    });
    res.flushHeaders();
    res.on("close", () => (this.closed = true));
  }

  get isClosed(): boolean {
    return this.closed || this.res.destroyed;
  }

  send(data: unknown): void {
    if (this.isClosed) return;
    this.res.write(`data: ${JSON.stringify(data)}\n\n`);
  }

  done(): void {
    if (this.isClosed) return;
    this.res.write("data: [DONE]\n\n");
    this.res.end();
    this.closed = true;
  }
}
