/**
 * Incremental detokenization. Decoding each token alone breaks multi-byte
 * characters (byte-level BPE, byte fallback) and SentencePiece's leading
 * spaces, so each step decodes a short window of preceding tokens and emits
 * only the new text, holding it back while it ends in an incomplete character.
 */
import type { TextTokenizer } from "./tokenizer.js";

const REPLACEMENT = "\uFFFD";
/** Tokens of left context kept in the decode window. */
const CONTEXT = 5;

export class IncrementalDetokenizer {
  private readonly ids: number[];
  private prefixOffset: number;
  private readOffset: number;

  constructor(
    private readonly tok: TextTokenizer,
    promptIds: readonly number[],
    private readonly skipSpecialTokens = true,
  ) {
    this.ids = promptIds.slice(-CONTEXT);
    this.prefixOffset = 0;
    this.readOffset = this.ids.length;
  }

  /** Adds one generated token; returns the text it completes (possibly ""). */
  push(id: number): string {
    this.ids.push(id);
    return this.emit(false);
  }

  /** Text still held back at the end of generation (an incomplete character decodes as U+FFFD). */
  flush(): string {
    return this.emit(true);
  }

  private emit(final: boolean): string {
    const prefix = this.tok.decode(this.ids.slice(this.prefixOffset, this.readOffset), this.skipSpecialTokens);
    const full = this.tok.decode(this.ids.slice(this.prefixOffset), this.skipSpecialTokens);
    if (full.length <= prefix.length || (!final && full.endsWith(REPLACEMENT))) return "";
    const delta = full.slice(prefix.length);
    this.prefixOffset = this.readOffset;
    this.readOffset = this.ids.length;
    // Keep the window short: drop ids no longer needed as context.
    if (this.prefixOffset > CONTEXT) {
      const drop = this.prefixOffset - CONTEXT;
      this.ids.splice(0, drop);
      this.prefixOffset -= drop;
      this.readOffset -= drop;
    }
    return delta;
  }
}
