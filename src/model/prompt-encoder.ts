/**
 * A model's prompt encoder for the request path: chat templating and
 * tokenization through the shared tokenizer pool (large inputs run in worker
 * threads), refusing before any work a prompt too long to fit the context.
 */
import { maxPromptChars } from "./prompt-limits.js";
import type { TokenizerPool } from "./tokenizer-pool.js";
import type { ChatMessage, ChatRenderOptions, TextTokenizer } from "./tokenizer.js";

export class PromptEncoder {
  /** Characters past which a prompt (for chat: the rendered template) cannot fit. */
  readonly maxChars: number;

  constructor(
    readonly dir: string,
    private readonly tokenizer: TextTokenizer | null,
    private readonly pool: TokenizerPool,
    maxModelLen: number,
  ) {
    this.maxChars = tokenizer ? maxPromptChars(maxModelLen, tokenizer) : Infinity;
  }

  private get tok(): TextTokenizer {
    if (!this.tokenizer) throw new Error(`the model at ${this.dir} has no tokenizer`);
    return this.tokenizer;
  }

  encode(text: string, signal?: AbortSignal): Promise<number[]> {
    return this.pool.encode(this.tok, text, { maxChars: this.maxChars, signal });
  }

  encodeChat(messages: ChatMessage[], signal?: AbortSignal, render?: ChatRenderOptions): Promise<number[]> {
    return this.pool.encodeChat(this.tok, messages, { maxChars: this.maxChars, signal, render });
  }

  /** The pool's workers drop this model's tokenizer. */
  close(): void {
    this.pool.forget(this.dir);
  }
}
