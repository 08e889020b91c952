/**
 * Chat templating and tokenization off the event loop. BPE on a long word costs
 * ~10-20 µs a character (seconds per MiB), so inputs above `inlineMaxChars` go to
 * a small pool of worker threads, each running the same TextTokenizer code on its
 * own copy of the model directory's tokenizer, loaded on first use; small inputs
 * are encoded inline, where they cost less than a message round trip and never
 * wait behind a long one. One call per worker at a time, first come first served.
 * A worker that dies (a crash, its heap limit, an aborted call) rejects its call
 * and is replaced when there is work for it. Idle workers never keep the process alive.
 */
import os from "node:os";
import { Worker } from "node:worker_threads";
import { checkPromptChars, PromptTooLongError } from "./prompt-limits.js";
import type { ChatMessage, ChatRenderOptions, TextTokenizer } from "./tokenizer.js";

export type WorkerRequest =
  | { kind: "encode"; dir: string; text: string }
  | { kind: "chat"; dir: string; messages: ChatMessage[]; maxChars: number; options: ChatRenderOptions }
  | { kind: "forget"; dir: string };

export interface WireError {
  name: string;
  message: string;
  chars?: number;
  maxChars?: number;
}

export type WorkerReply = { ids: Uint32Array } | { error: WireError };

export interface TokenizerPoolOptions {
  /** Worker threads, started when first needed. Default 2 (1 on one core): one huge prompt does not hold up the next. */
  workers?: number;
  /**
   * Inputs up to this size are encoded inline (characters, plus MESSAGE_COST per chat message).
   * Default 2048: at the slowest rate measured (CJK text with no spaces) that is ~30 ms.
   */
  inlineMaxChars?: number;
  /** Heap limit of each worker in MiB (default: Node's). A worker past it dies and rejects its call; the process lives on. */
  maxHeapMb?: number;
}

export interface EncodeOptions {
  /** Refuses a longer text (for chat: the rendered template) with PromptTooLongError before tokenizing it. */
  maxChars?: number;
  /** Aborting drops a queued call and stops the worker running it; the call rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** A worker died with this call in it, or the pool was closed. */
export class TokenizerWorkerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "TokenizerWorkerError";
  }
}

/** Rendering a message through a template costs about as much as tokenizing this many characters. */
const MESSAGE_COST = 32;

const WORKER_URL = new URL("./tokenizer-worker.js", import.meta.url);

interface Job {
  request: WorkerRequest;
  resolve: (ids: number[]) => void;
  reject: (e: unknown) => void;
  signal: AbortSignal | undefined;
  onAbort: () => void;
}

interface Slot {
  worker: Worker;
  job: Job | null;
  error: Error | null;
}

export function toWireError(e: unknown): WireError {
  if (e instanceof PromptTooLongError) return { name: e.name, message: e.message, chars: e.chars, maxChars: e.maxChars };
  if (e instanceof Error) return { name: e.name, message: e.message };
  return { name: "Error", message: String(e) };
}

function fromWireError(w: WireError): Error {
  if (w.name === "PromptTooLongError" && w.chars !== undefined && w.maxChars !== undefined) return new PromptTooLongError(w.chars, w.maxChars);
  const e = new Error(w.message);
  e.name = w.name;
  return e;
}

/** A chat's size for the inline-or-worker choice: its text, a cost per message, and any tools or calls it carries. */
function chatSize(messages: ChatMessage[], options: ChatRenderOptions): number {
  const extra = (x: unknown): number => (x === undefined ? 0 : JSON.stringify(x).length);
  return messages.reduce((n, m) => n + m.content.length + MESSAGE_COST + extra((m as { tool_calls?: unknown }).tool_calls), 0) +
    extra(options.tools) + extra(options.kwargs) + (options.template?.length ?? 0);
}

export class TokenizerPool {
  private readonly size: number;
  private readonly inlineMaxChars: number;
  private readonly maxHeapMb: number | undefined;
  private readonly slots: Slot[] = [];
  private readonly queue: Job[] = [];
  private closed = false;

  constructor(opts: TokenizerPoolOptions = {}) {
    this.size = Math.max(1, opts.workers ?? Math.min(2, os.availableParallelism()));
    this.inlineMaxChars = opts.inlineMaxChars ?? 2048;
    this.maxHeapMb = opts.maxHeapMb;
  }

  /** `tok.encode(text)`, in a worker when the text is large. */
  async encode(tok: TextTokenizer, text: string, opts: EncodeOptions = {}): Promise<number[]> {
    opts.signal?.throwIfAborted();
    checkPromptChars(text.length, opts.maxChars ?? Infinity);
    if (text.length <= this.inlineMaxChars) return tok.encode(text);
    return this.submit({ kind: "encode", dir: tok.dir, text }, opts.signal);
  }

  /** `tok.encodeChat(messages, maxChars, render)`, in a worker when the chat (tools and template included) is large. */
  async encodeChat(tok: TextTokenizer, messages: ChatMessage[], opts: EncodeOptions & { render?: ChatRenderOptions } = {}): Promise<number[]> {
    opts.signal?.throwIfAborted();
    const maxChars = opts.maxChars ?? Infinity;
    const options = opts.render ?? {};
    if (chatSize(messages, options) <= this.inlineMaxChars) return tok.encodeChat(messages, maxChars, options);
    return this.submit({ kind: "chat", dir: tok.dir, messages, maxChars, options }, opts.signal);
  }

  /** Loads `tok`'s tokenizer in every worker now, off the event loop, so a first large prompt does not wait for it. */
  async warm(tok: TextTokenizer): Promise<void> {
    await Promise.all(Array.from({ length: this.size }, () => this.submit({ kind: "encode", dir: tok.dir, text: "" }, undefined).catch(() => {})));
  }

  /** Drops the workers' copies of a model directory's tokenizer (call when the model is unloaded). */
  forget(dir: string): void {
    for (const s of this.slots) s.worker.postMessage({ kind: "forget", dir } satisfies WorkerRequest);
  }

  /** Rejects queued and running calls and stops the workers. */
  async close(): Promise<void> {
    this.closed = true;
    const running = this.slots.flatMap((s) => (s.job ? [s.job] : []));
    for (const job of [...this.queue.splice(0), ...running]) this.fail(job, new TokenizerWorkerError("the tokenizer pool is closed"));
    for (const s of this.slots) s.job = null;
    await Promise.all(this.slots.splice(0).map((s) => s.worker.terminate()));
  }

  private submit(request: WorkerRequest, signal: AbortSignal | undefined): Promise<number[]> {
    if (this.closed) return Promise.reject(new TokenizerWorkerError("the tokenizer pool is closed"));
    return new Promise((resolve, reject) => {
      const job: Job = { request, resolve, reject, signal, onAbort: () => this.abort(job) };
      signal?.addEventListener("abort", job.onAbort, { once: true });
      this.queue.push(job);
      this.dispatch();
    });
  }

  /** Gives queued calls to idle workers, starting workers up to the pool's size. */
  private dispatch(): void {
    while (this.queue.length > 0 && !this.closed) {
      const slot = this.slots.find((s) => s.job === null) ?? (this.slots.length < this.size ? this.spawn() : undefined);
      if (!slot) return;
      const job = this.queue.shift()!;
      slot.job = job;
      slot.worker.ref(); // a pending call keeps the process alive until it settles
      slot.worker.postMessage(job.request);
    }
  }

  private spawn(): Slot {
    const limits = this.maxHeapMb !== undefined ? { resourceLimits: { maxOldGenerationSizeMb: this.maxHeapMb } } : {};
    const slot: Slot = { worker: new Worker(WORKER_URL, limits), job: null, error: null };
    slot.worker.unref();
    slot.worker.on("message", (reply: WorkerReply) => this.onReply(slot, reply));
    slot.worker.on("error", (e: Error) => (slot.error = e));
    slot.worker.on("exit", (code: number) => this.onExit(slot, code));
    this.slots.push(slot);
    return slot;
  }

  private onReply(slot: Slot, reply: WorkerReply): void {
    const job = slot.job;
    if (!job) return;
    slot.job = null;
    slot.worker.unref();
    if ("ids" in reply) this.release(job).resolve(Array.from(reply.ids));
    else this.fail(job, fromWireError(reply.error));
    this.dispatch();
  }

  private onExit(slot: Slot, code: number): void {
    this.remove(slot);
    const job = slot.job;
    slot.job = null;
    if (job) this.fail(job, new TokenizerWorkerError(`the tokenizer worker stopped: ${slot.error?.message ?? `exit code ${code}`}`));
    this.dispatch();
  }

  private abort(job: Job): void {
    const queued = this.queue.indexOf(job);
    if (queued >= 0) this.queue.splice(queued, 1);
    const slot = this.slots.find((s) => s.job === job);
    if (slot) {
      // Tokenization cannot be interrupted inside the worker: stop the worker.
      slot.job = null;
      this.remove(slot);
      void slot.worker.terminate();
    }
    this.fail(job, job.signal?.reason);
    this.dispatch();
  }

  private remove(slot: Slot): void {
    const i = this.slots.indexOf(slot);
    if (i >= 0) this.slots.splice(i, 1);
  }

  /** The job, no longer listening for its abort. */
  private release(job: Job): Job {
    job.signal?.removeEventListener("abort", job.onAbort);
    return job;
  }

  private fail(job: Job, e: unknown): void {
    this.release(job).reject(e);
  }
}
