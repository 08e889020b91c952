/**
 * The most characters a prompt can have and still fit in the context: a prompt
 * longer than that is refused before it is tokenized (BPE on a long text takes
 * seconds per MiB), and a prompt that fits is never refused.
 *
 * Rule: a text that encodes to n tokens has at most n × charsPerToken characters
 * (UTF-16 code units, JavaScript's string length), where charsPerToken = E × L:
 *  - L, the longest token's text: the longest vocabulary entry or added token.
 *    A byte-level BPE entry spells one byte per character, and a text's UTF-16
 *    length is at most its UTF-8 length; a SentencePiece entry spells its text
 *    ("▁" for a space; a byte-fallback entry "<0xE4>" stands for one byte).
 *    Shipped: Qwen3 128 (a run of 128 spaces), Llama 3.1 128, Llama 2 16.
 *  - E, how much the normalizer can shrink the text: 1 with none; 1.5 for NFC
 *    before byte-level BPE, which composes at most 3 code units into one 2-byte
 *    character (u + ◌̈ + ◌̄ → ǖ) or 4 into one 3-byte character.
 * Where no bound holds (the text can be dropped: another normalizer, a
 * pre-tokenizer that removes text, unknown characters fused into one token, a
 * model other than BPE) charsPerToken is Infinity and nothing is refused.
 */

type Json = Record<string, unknown>;

/** Input code units per byte of NFC output, at most (u + ◌̈ + ◌̄ → ǖ: 3 units, 2 bytes). */
export const NFC_UNITS_PER_BYTE = 1.5;

/** Pre-tokenizers that keep every character (Split only unless its behavior is "Removed"). */
const KEEPS_TEXT = new Set(["ByteLevel", "Metaspace", "Digits", "Split"]);

function preTokenizers(p: Json | null | undefined): Json[] {
  if (!p) return [];
  return p.type === "Sequence" ? ((p.pretokenizers as Json[] | undefined) ?? []) : [p];
}

function longestToken(json: Json): number {
  let longest = 0;
  for (const t of Object.keys(((json.model as Json).vocab as Json | undefined) ?? {})) longest = Math.max(longest, t.length);
  for (const t of (json.added_tokens as { content: string }[] | undefined) ?? []) longest = Math.max(longest, t.content.length);
  return longest;
}

/** Input characters one token can stand for at most, from a tokenizer.json (see the header). */
export function charsPerTokenBound(json: Json): number {
  const model = json.model as Json;
  const pre = preTokenizers(json.pre_tokenizer as Json | null | undefined);
  const byteLevel = pre.some((p) => p.type === "ByteLevel");
  // Without byte-level BPE or byte fallback, an unknown character becomes <unk> (fused runs of them) or nothing.
  if (model.type !== "BPE" || !(byteLevel || model.byte_fallback === true)) return Infinity;
  if (!pre.every((p) => KEEPS_TEXT.has(p.type as string) && p.behavior !== "Removed")) return Infinity;
  const normalizer = (json.normalizer as Json | null | undefined)?.type ?? null;
  const shrink = normalizer === null ? 1 : normalizer === "NFC" && byteLevel ? NFC_UNITS_PER_BYTE : Infinity;
  return shrink * longestToken(json);
}

/** The most characters a prompt (for chat: the rendered template) can have and fit in `maxModelLen` tokens. */
export function maxPromptChars(maxModelLen: number, tokenizer: { readonly charsPerToken: number }): number {
  return maxModelLen * tokenizer.charsPerToken;
}

/** A prompt longer than maxPromptChars: it cannot fit in the context, whatever its tokens. */
export class PromptTooLongError extends Error {
  constructor(
    readonly chars: number,
    readonly maxChars: number,
  ) {
    super(`a prompt of ${chars} characters cannot fit in the context: at most ${maxChars} characters can`);
    this.name = "PromptTooLongError";
  }
}

export function checkPromptChars(chars: number, maxChars: number): void {
  if (chars > maxChars) throw new PromptTooLongError(chars, maxChars);
}
