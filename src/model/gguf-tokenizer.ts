/**
 * A GGUF file's own tokenizer (`tokenizer.ggml.*`) as the tokenizer.json and
 * tokenizer_config.json that @huggingface/tokenizers and TextTokenizer read,
 * built to give llama.cpp's token ids:
 * - `gpt2` (byte-level BPE): llama.cpp's pre-tokenizer regex for `tokenizer.ggml.pre`,
 *   its merges, no normalizer (llama.cpp applies none);
 * - `llama` (SentencePiece): merges derived from the scores (a pair merges when the
 *   piece it makes is in the vocabulary; higher scores first, as llama.cpp's merge
 *   queue picks them), byte fallback, and a "▁" prefixed to every run of text
 *   between special tokens, as llama.cpp does.
 * Control, unknown and user-defined tokens become added tokens (matched in text).
 */
import { CheckpointError } from "./errors.js";
import { GgufMetadata, type Gguf } from "./gguf.js";

type Json = Record<string, unknown>;

/** llama.cpp's token types (tokenizer.ggml.token_type). */
const TokenType = { normal: 1, unknown: 2, control: 3, userDefined: 4, unused: 5, byte: 6 } as const;

/** llama.cpp's pre-tokenizer regexes (llama-vocab.cpp) for the `tokenizer.ggml.pre` values Weft knows. */
const PRE_TOKENIZERS: Record<string, { regex: string; ignoreMerges: boolean; addBos: boolean }> = {
  "llama-bpe": {
    regex: "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ignoreMerges: true,
    addBos: true,
  },
  qwen2: {
    regex: "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    ignoreMerges: false,
    addBos: false,
  },
};

export interface GgufTokenizerFiles {
  /** A tokenizer.json for @huggingface/tokenizers. */
  tokenizer: Json;
  /** A tokenizer_config.json: chat_template, bos_token, eos_token, add_bos_token. */
  config: Json;
}

/**
 * llama.cpp decides some token types from the token's text when it loads a vocabulary (llama-vocab.cpp):
 * end-of-generation spellings become control tokens always; end-of-turn, end-of-message and
 * fill-in-the-middle spellings do unless the metadata names that token; four gpt-oss tokens become
 * user-defined; with gemma4's `<|tool_response>`, `</s>` is text again. Its ids follow these types.
 */
const EOG = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>",
  "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>"];
const NAMED_BY_TEXT: [string, string[]][] = [
  ["eot", ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<end_of_utterance>"]],
  ["eom", ["<|eom_id|>"]],
  ["fim_pre", ["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<PRE>", "<|code_prefix|>", "<|prefix|>"]],
  ["fim_suf", ["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<SUF>", "<|code_suffix|>", "<|suffix|>"]],
  ["fim_mid", ["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<MID>", "<|code_middle|>", "<|middle|>"]],
  ["fim_pad", ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]],
  ["fim_rep", ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]],
  ["fim_sep", ["<|file_sep|>"]],
];
const ALWAYS_USER_DEFINED = ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

function llamaCppTypes(m: GgufMetadata, tokens: string[], fileTypes: number[]): number[] {
  const types = [...fileTypes];
  const ids = vocabOf(tokens);
  const control = (text: string): void => {
    const id = ids[text];
    if (id !== undefined && types[id] !== TokenType.control) types[id] = TokenType.control;
  };
  for (const [name, texts] of NAMED_BY_TEXT) if (!m.has(`tokenizer.ggml.${name}_token_id`)) texts.forEach(control);
  EOG.forEach(control);
  for (const t of ALWAYS_USER_DEFINED) if (ids[t] !== undefined) types[ids[t]] = TokenType.userDefined;
  if (ids["<|tool_response>"] !== undefined && ids["</s>"] !== undefined) types[ids["</s>"]] = TokenType.normal;
  return types;
}

function addedTokens(tokens: string[], types: number[]): Json[] {
  const out: Json[] = [];
  types.forEach((t, id) => {
    if (t === TokenType.control || t === TokenType.unknown || t === TokenType.userDefined) {
      out.push({ id, content: tokens[id], single_word: false, lstrip: false, rstrip: false, normalized: false, special: t !== TokenType.userDefined });
    }
  });
  return out;
}

function vocabOf(tokens: string[]): Record<string, number> {
  const vocab: Record<string, number> = {};
  tokens.forEach((t, id) => {
    if (!(t in vocab)) vocab[t] = id; // a duplicated piece keeps its first id, as llama.cpp's text_to_token does
  });
  return vocab;
}

function bpeModel(g: Gguf, m: GgufMetadata, tokens: string[]): Json {
  const pre = m.str("tokenizer.ggml.pre", "default");
  const p = PRE_TOKENIZERS[pre];
  if (!p) throw new CheckpointError(g.file, `tokenizer.ggml.pre "${pre}" is not supported (supported: ${Object.keys(PRE_TOKENIZERS).join(", ")})`);
  return {
    normalizer: null,
    pre_tokenizer: {
      type: "Sequence",
      pretokenizers: [
        { type: "Split", pattern: { Regex: p.regex }, behavior: "Isolated", invert: false },
        { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
      ],
    },
    decoder: { type: "ByteLevel", add_prefix_space: false, trim_offsets: false, use_regex: false },
    model: {
      type: "BPE", dropout: null, unk_token: null, continuing_subword_prefix: "", end_of_word_suffix: "", fuse_unk: false,
      byte_fallback: false, ignore_merges: p.ignoreMerges, vocab: vocabOf(tokens), merges: m.strs("tokenizer.ggml.merges"),
    },
  };
}

/**
 * SentencePiece merges from scores (as transformers converts a GGUF): for every piece, each split
 * into two pieces of the vocabulary, ordered by the piece's score, highest first (then by id).
 */
function mergesFromScores(tokens: string[], scores: number[], types: number[]): [string, string][] {
  const vocab = new Set(tokens);
  const merges: { l: string; r: string; score: number; id: number }[] = [];
  tokens.forEach((piece, id) => {
    if (types[id] !== TokenType.normal && types[id] !== TokenType.userDefined) return;
    const chars = [...piece];
    for (let k = 1; k < chars.length; k++) {
      const l = chars.slice(0, k).join(""), r = chars.slice(k).join("");
      if (vocab.has(l) && vocab.has(r)) merges.push({ l, r, score: scores[id]!, id });
    }
  });
  merges.sort((a, b) => b.score - a.score || a.id - b.id);
  return merges.map((x) => [x.l, x.r]);
}

function spmModel(m: GgufMetadata, tokens: string[], types: number[]): Json {
  const scores = m.nums("tokenizer.ggml.scores");
  const prefix = m.bool("tokenizer.ggml.add_space_prefix", true);
  const unk = m.has("tokenizer.ggml.unknown_token_id") ? tokens[m.num("tokenizer.ggml.unknown_token_id")] : tokens[types.indexOf(TokenType.unknown)];
  const spaces = { type: "Replace", pattern: { String: " " }, content: "▁" };
  // llama.cpp reads text as UTF-8, where a lone surrogate is U+FFFD (a piece of its own in some vocabularies).
  const wellFormed = { type: "Replace", pattern: { Regex: "[\\uD800-\\uDFFF]" }, content: "\uFFFD" };
  return {
    // Prepend applies to each run of text between added tokens, and even before a leading space: llama.cpp's rule.
    normalizer: { type: "Sequence", normalizers: [wellFormed, ...(prefix ? [{ type: "Prepend", prepend: "▁" }] : []), spaces] },
    pre_tokenizer: null,
    decoder: {
      type: "Sequence",
      decoders: [{ type: "Replace", pattern: { String: "▁" }, content: " " }, { type: "ByteFallback" }, { type: "Fuse" },
        ...(prefix ? [{ type: "Strip", content: " ", start: 1, stop: 0 }] : [])],
    },
    model: {
      type: "BPE", dropout: null, unk_token: unk ?? null, continuing_subword_prefix: null, end_of_word_suffix: null,
      fuse_unk: true, byte_fallback: true, ignore_merges: false, vocab: vocabOf(tokens), merges: mergesFromScores(tokens, scores, types),
    },
  };
}

/** BOS (and EOS) added to an encoding when the file asks for them. */
function postProcessor(bos: string | undefined, eos: string | undefined, ids: Map<string, number>): Json | null {
  if (bos === undefined && eos === undefined) return null;
  const special = (t: string | undefined, typeId: number): Json[] => (t === undefined ? [] : [{ SpecialToken: { id: t, type_id: typeId } }]);
  const seq = (id: string, typeId: number): Json => ({ Sequence: { id, type_id: typeId } });
  const specialTokens: Record<string, Json> = {};
  for (const t of [bos, eos]) if (t !== undefined) specialTokens[t] = { id: t, ids: [ids.get(t)], tokens: [t] };
  return {
    type: "TemplateProcessing",
    single: [...special(bos, 0), seq("A", 0), ...special(eos, 0)],
    pair: [...special(bos, 0), seq("A", 0), ...special(eos, 0), ...special(bos, 1), seq("B", 1), ...special(eos, 1)],
    special_tokens: specialTokens,
  };
}

/** The tokenizer.json and tokenizer_config.json equivalent to the GGUF's own tokenizer. */
export function ggufTokenizerFiles(g: Gguf): GgufTokenizerFiles {
  const m = new GgufMetadata(g.file, g.metadata);
  const kind = m.str("tokenizer.ggml.model");
  const tokens = m.strs("tokenizer.ggml.tokens");
  const fileTypes = m.nums("tokenizer.ggml.token_type", tokens.map(() => TokenType.normal));
  if (fileTypes.length !== tokens.length) throw new CheckpointError(g.file, "tokenizer.ggml.token_type and tokenizer.ggml.tokens differ in length");
  const types = llamaCppTypes(m, tokens, fileTypes);
  let body: Json, addBosDefault: boolean;
  if (kind === "gpt2") {
    body = bpeModel(g, m, tokens);
    addBosDefault = PRE_TOKENIZERS[m.str("tokenizer.ggml.pre", "default")]!.addBos;
  } else if (kind === "llama") {
    body = spmModel(m, tokens, types);
    addBosDefault = true;
  } else {
    throw new CheckpointError(g.file, `tokenizer.ggml.model "${kind}" is not supported (supported: gpt2, llama)`);
  }
  const id = (key: string): number | null => (m.has(key) ? m.num(key) : null);
  const bos = id("tokenizer.ggml.bos_token_id"), eos = id("tokenizer.ggml.eos_token_id");
  const addBos = m.bool("tokenizer.ggml.add_bos_token", addBosDefault), addEos = m.bool("tokenizer.ggml.add_eos_token", false);
  const piece = (id: number | null, on: boolean): string | undefined => (on && id !== null ? tokens[id] : undefined);
  const ids = new Map([bos, eos].filter((i) => i !== null).map((i) => [tokens[i]!, i]));
  const tokenizer: Json = {
    version: "1.0", truncation: null, padding: null, added_tokens: addedTokens(tokens, types),
    ...body, post_processor: postProcessor(piece(bos, addBos), piece(eos, addEos), ids),
  };
  const config: Json = {
    bos_token: bos === null ? null : (tokens[bos] ?? null),
    eos_token: eos === null ? null : (tokens[eos] ?? null),
    add_bos_token: addBos,
    add_eos_token: addEos,
  };
  if (m.has("tokenizer.chat_template")) config.chat_template = m.str("tokenizer.chat_template");
  return { tokenizer, config };
}
