/** A request's outputs as an async iterable: the engine pushes, the caller iterates. */
import type { FinishReason, GeneratedLogprob } from "./request.js";
import type { PromptScore } from "../runtime/model-runner.js";

export interface Usage {
  promptTokens: number;
  completionTokens: number;
  /** Prompt tokens served from the prefix cache. */
  cachedTokens: number;
}

export interface RequestOutput {
  /** Token ids generated since the previous output. */
  tokenIds: number[];
  /** Text completed since the previous output (may lag tokens by an incomplete character or a possible stop string). */
  text: string;
  logprobs: GeneratedLogprob[];
  /** Once, with the first output, when asked (params.promptLogprobs): one per prompt token, null for the first. */
  promptLogprobs?: (PromptScore | null)[];
  finished: boolean;
  finishReason?: FinishReason;
  /** vLLM's stop_reason: the stop token id or stop string that ended it; null for EOS. */
  stopReason?: number | string | null;
  usage?: Usage;
  /** Set when finishReason is "error". */
  error?: string;
  /** Why it failed: the engine shut down (retry elsewhere), or a fault. */
  errorKind?: "shutdown" | "internal";
}

export class OutputStream implements AsyncIterable<RequestOutput> {
  private readonly buffered: RequestOutput[] = [];
  private waiter: ((r: IteratorResult<RequestOutput>) => void) | null = null;
  private ended = false;
  /** performance.now() when the first token arrived. */
  firstTokenAt: number | null = null;

  constructor(
    readonly id: string,
    /** Called when the consumer stops iterating before the end: the request is aborted. */
    private readonly onCancel: () => void,
  ) {}

  push(out: RequestOutput): void {
    if (this.ended) return;
    if (out.finished) this.ended = true;
    if (out.tokenIds.length > 0) this.firstTokenAt ??= performance.now();
    if (this.waiter) {
      const w = this.waiter;
      this.waiter = null;
      w({ value: out, done: false });
    } else {
      this.buffered.push(out);
    }
  }

  [Symbol.asyncIterator](): AsyncIterator<RequestOutput> {
    let done = false;
    return {
      next: () => {
        const out = this.buffered.shift();
        if (out) return Promise.resolve({ value: out, done: false });
        if (done || (this.ended && this.buffered.length === 0)) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => (this.waiter = resolve));
      },
      return: () => {
        done = true;
        if (!this.ended) this.onCancel();
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }

  /** Drains the stream into one record: all tokens, text and log-probs, and the final fields. */
  async collect(): Promise<RequestOutput> {
    const all: RequestOutput = { tokenIds: [], text: "", logprobs: [], finished: false };
    for await (const o of this) {
      all.tokenIds.push(...o.tokenIds);
      all.text += o.text;
      all.logprobs.push(...o.logprobs);
      if (o.promptLogprobs) all.promptLogprobs = o.promptLogprobs;
      if (o.finished) Object.assign(all, { finished: true, finishReason: o.finishReason, stopReason: o.stopReason, usage: o.usage, error: o.error, errorKind: o.errorKind });
    }
    return all;
  }
}
