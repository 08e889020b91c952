/**
 * A model's prompt encoder for the request path: chat templating and
 * tokenization, returning promises so that large inputs can run off the
 * event loop.
 */
import type { ChatMessage, TextTokenizer } from "./tokenizer.js";

export class PromptEncoder {
  constructor(
    readonly dir: string,
    private readonly tokenizer: TextTokenizer | null,
  ) {}

  private get tok(): TextTokenizer {
    if (!this.tokenizer) throw new Error(`the model at ${this.dir} has no tokenizer`);
    return this.tokenizer;
  }

  async encode(text: string): Promise<number[]> {
    return this.tok.encode(text);
  }

  async encodeChat(messages: ChatMessage[]): Promise<number[]> {
    return this.tok.encodeChat(messages);
  }

  async close(): Promise<void> {}
}
