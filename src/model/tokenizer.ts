/**
 * Text ↔ token ids for one model: `tokenizer.json` through @huggingface/tokenizers,
 * the chat template (`chat_template.jinja` in the directory, else `tokenizer_config.json`'s)
 * through @huggingface/jinja.
 */
import fs from "node:fs";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import { CheckpointError } from "./errors.js";
import { readGguf } from "./gguf.js";
import { ggufTokenizerFiles } from "./gguf-tokenizer.js";
import { charsPerTokenBound, checkPromptChars } from "./prompt-limits.js";

/** A tool call in an assistant message, as chat templates read it: arguments as an object (vLLM and transformers do the same). */
export interface TemplateToolCall {
  id?: string;
  type: "function";
  function: { name: string; arguments: unknown };
}

export interface ChatMessage {
  role: string;
  content: string;
  tool_calls?: TemplateToolCall[];
  /** On a `tool` message: the call it answers. */
  tool_call_id?: string;
  name?: string;
  reasoning_content?: string;
}

/** What a chat rendering may add to the messages, as transformers' apply_chat_template takes it. */
export interface ChatRenderOptions {
  /** OpenAI tool objects, passed to the template as `tools`. */
  tools?: readonly unknown[];
  /** Extra template variables (a request's chat_template_kwargs, e.g. enable_thinking). */
  kwargs?: Readonly<Record<string, unknown>>;
  /** Template text used instead of the model's (--chat-template). */
  template?: string;
  /** Default true: end with the assistant's turn opening. */
  addGenerationPrompt?: boolean;
}

/** Compiled override templates, by text: the few --chat-template files a server has. */
const compiled = new Map<string, Template>();
function compile(text: string): Template {
  let t = compiled.get(text);
  if (!t) compiled.set(text, (t = new Template(text)));
  return t;
}

type Json = Record<string, unknown>;

function tokenString(v: unknown): string | null {
  if (typeof v === "string") return v;
  if (v && typeof v === "object" && typeof (v as Json).content === "string") return (v as Json).content as string;
  return null;
}

/**
 * Older Llama/Mistral tokenizer.json files spell SentencePiece's prefix space as
 * normalizers (Prepend "▁", then spaces → "▁"), which prepends even to text that
 * already starts with a space. transformers 5 loads them with a Metaspace
 * pre-tokenizer (prepend_scheme "first") instead; do the same so ids agree.
 */
function modernizeLegacySentencePiece(json: Json): Json {
  const norm = json.normalizer as { type?: string; normalizers?: Json[] } | null | undefined;
  const steps = norm?.type === "Sequence" ? (norm.normalizers ?? []) : [];
  const isLegacy =
    steps.length === 2 &&
    steps[0]?.type === "Prepend" && steps[0].prepend === "▁" &&
    steps[1]?.type === "Replace" && (steps[1].pattern as Json | undefined)?.String === " " && steps[1].content === "▁";
  if (!isLegacy || json.pre_tokenizer) return json;
  return { ...json, normalizer: null, pre_tokenizer: { type: "Metaspace", replacement: "▁", prepend_scheme: "first", split: false } };
}

export class TextTokenizer {
  readonly bosToken: string | null;
  readonly eosToken: string | null;
  readonly specialIds: Set<number>;
  /** The model's chat template text, or null. */
  readonly chatTemplate: string | null;
  private readonly template: Template | null;

  private constructor(
    /** The model directory it was loaded from: the tokenizer pool's workers load the same one. */
    readonly dir: string,
    private readonly tok: Tokenizer,
    config: Json,
    /** Input characters one token can stand for at most (prompt-limits.ts). */
    readonly charsPerToken: number,
  ) {
    this.bosToken = tokenString(config.bos_token);
    this.eosToken = tokenString(config.eos_token);
    this.chatTemplate = typeof config.chat_template === "string" ? config.chat_template : null;
    this.template = this.chatTemplate !== null ? new Template(this.chatTemplate) : null;
    this.specialIds = new Set([...tok.get_added_tokens_decoder()].filter(([, t]) => t.special).map(([id]) => id));
  }

  /** Loads `tokenizer.json` (required) and `tokenizer_config.json` (optional) from `dir`. */
  static fromDir(dir: string): TextTokenizer {
    if (dir.endsWith(".gguf")) {
      const { tokenizer, config } = ggufTokenizerFiles(readGguf(dir));
      return new TextTokenizer(dir, new Tokenizer(tokenizer, config), config, charsPerTokenBound(tokenizer));
    }
    const file = path.join(dir, "tokenizer.json");
    if (!fs.existsSync(file)) throw new CheckpointError(dir, "no tokenizer.json");
    const json = modernizeLegacySentencePiece(JSON.parse(fs.readFileSync(file, "utf8")) as Json);
    const cfgFile = path.join(dir, "tokenizer_config.json");
    const config = fs.existsSync(cfgFile) ? (JSON.parse(fs.readFileSync(cfgFile, "utf8")) as Json) : {};
    // transformers ≥ 4.43 saves the template as its own file, which wins over tokenizer_config.json's.
    const templateFile = path.join(dir, "chat_template.jinja");
    if (fs.existsSync(templateFile)) config.chat_template = fs.readFileSync(templateFile, "utf8");
    const charsPerToken = charsPerTokenBound(json);
    return new TextTokenizer(dir, new Tokenizer(json, config), config, charsPerToken);
  }

  get hasChatTemplate(): boolean {
    return this.template !== null;
  }

  /** Token ids of `text`; special tokens (e.g. BOS) added as the tokenizer's post-processor says. */
  encode(text: string, addSpecialTokens = true): number[] {
    return this.tok.encode(text, { add_special_tokens: addSpecialTokens }).ids;
  }

  decode(ids: number[], skipSpecialTokens = true): string {
    return this.tok.decode(ids, { skip_special_tokens: skipSpecialTokens });
  }

  /** One token's text, special tokens included (log-probs name every candidate); memoized, as log-probs ask for the same ids step after step. */
  tokenText(id: number): string {
    let text = this.texts.get(id);
    if (text === undefined) this.texts.set(id, (text = this.decode([id], false)));
    return text;
  }

  private readonly texts = new Map<number, string>();

  /** A token's vocabulary entry as stored (e.g. "Ġhello"), as transformers' convert_ids_to_tokens gives it. */
  tokenPiece(id: number): string | undefined {
    return this.tok.id_to_token(id);
  }

  tokenId(token: string): number | undefined {
    return this.tok.token_to_id(token);
  }

  /** The chat template rendered (with a generation prompt unless told otherwise), as transformers' apply_chat_template does. */
  renderChat(messages: ChatMessage[], options: ChatRenderOptions = {}): string {
    const template = options.template !== undefined ? compile(options.template) : this.template;
    if (!template) throw new Error("this model has no chat template");
    return template.render({
      ...options.kwargs,
      messages,
      ...(options.tools?.length ? { tools: options.tools } : {}),
      add_generation_prompt: options.addGenerationPrompt ?? true,
      bos_token: this.bosToken ?? "",
      eos_token: this.eosToken ?? "",
    });
  }

  /**
   * Token ids of a rendered chat; the template already holds any BOS. A rendering longer than
   * `maxChars` is refused before tokenizing (PromptTooLongError): the limit applies to the
   * rendered text because templates drop text (Llama 3.1 trims each message, Qwen3 drops the
   * reasoning of earlier turns), so the messages' length does not bound it.
   */
  encodeChat(messages: ChatMessage[], maxChars = Infinity, options: ChatRenderOptions = {}): number[] {
    const text = this.renderChat(messages, options);
    checkPromptChars(text.length, maxChars);
    return this.encode(text, false);
  }
}
