/**
 * OpenAI request bodies → typed, validated requests. Unknown fields are
 * ignored; a present field with a bad value is a 400 naming the field.
 * Sampling parameters are checked in the units the sampler uses (float32):
 * a value that rounds to something outside the sampler's domain is refused
 * here, so no row can fail a batch step.
 */
import { apiError, invalid } from "./errors.js";
import type { ChatMessage } from "../model/tokenizer.js";

type Json = Record<string, unknown>;

export interface CommonFields {
  model: string;
  maxTokens: number | null;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  seed: number | null;
  stop: string[];
  stopTokenIds: number[];
  n: number;
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
  /** Top log-probs per token; null = no log-probs. */
  logprobs: number | null;
  stream: boolean;
  includeUsage: boolean;
  user: string | null;
  ignoreEos: boolean;
  /** vLLM's include_stop_str_in_output: the matched stop string or stop token's text stays in the output. */
  includeStopStrInOutput: boolean;
  returnTokenIds: boolean;
}

export interface ChatRequest extends CommonFields {
  kind: "chat";
  messages: ChatMessage[];
}

export interface CompletionRequest extends CommonFields {
  kind: "completion";
  /** Each prompt as text or as token ids. */
  prompts: (string | number[])[];
  echo: boolean;
}

const MAX_N = 16;
const MAX_STOPS = 16;
const MAX_LOGPROBS = 20;

function present(body: Json, key: string): boolean {
  return body[key] !== undefined && body[key] !== null;
}

function num(body: Json, key: string, def: number, min: number, max: number, integer = false): number {
  if (!present(body, key)) return def;
  const v = body[key];
  if (typeof v !== "number" || !Number.isFinite(v)) throw invalid(key, "must be a number");
  if (integer && !Number.isInteger(v)) throw invalid(key, "must be an integer");
  if (v < min || v > max) throw invalid(key, `must be between ${min} and ${max}`);
  return v;
}

/**
 * A float the sampler receives as float32: `min`/`max` bound the float32 value,
 * and `positive` refuses values that round to 0.
 */
function float32(body: Json, key: string, def: number, min: number, max: number, positive = false): number {
  const v = num(body, key, def, min, max);
  const f = Math.fround(v);
  if (positive && !(f > 0)) throw invalid(key, `must be greater than 0 (got ${v}, which is 0 in float32)`);
  return f;
}

/** Temperatures below this divide logits into overflow; vLLM clamps them, we refuse them. */
const MIN_TEMPERATURE = 0.01;
/** Penalties below this divide logits into overflow in float32. */
const MIN_REPETITION_PENALTY = 0.01;

function temperature(body: Json): number {
  const t = num(body, "temperature", 1, 0, 2);
  if (t > 0 && t < MIN_TEMPERATURE) throw invalid("temperature", `must be 0 (greedy) or at least ${MIN_TEMPERATURE}`);
  return Math.fround(t);
}

function bool(body: Json, key: string, def = false): boolean {
  if (!present(body, key)) return def;
  if (typeof body[key] !== "boolean") throw invalid(key, "must be a boolean");
  return body[key] as boolean;
}

function tokenIds(v: unknown, key: string): number[] {
  if (!Array.isArray(v) || !v.every((t) => Number.isSafeInteger(t) && (t as number) >= 0)) {
    throw invalid(key, "must be a list of non-negative integer token ids");
  }
  return v as number[];
}

function stops(body: Json): string[] {
  if (!present(body, "stop")) return [];
  const v = body.stop;
  const list = typeof v === "string" ? [v] : v;
  if (!Array.isArray(list) || !list.every((s) => typeof s === "string")) throw invalid("stop", "must be a string or a list of strings");
  if (list.length > MAX_STOPS) throw invalid("stop", `at most ${MAX_STOPS} stop sequences`);
  if (list.some((s) => s === "")) throw invalid("stop", "stop sequences must not be empty");
  return list as string[];
}

function common(body: Json, logprobs: number | null): CommonFields {
  if (typeof body.model !== "string" || body.model === "") throw invalid("model", "is required and must be a string");
  const maxKey = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const streamOptions = body.stream_options;
  if (present(body, "stream_options") && (typeof streamOptions !== "object" || Array.isArray(streamOptions))) {
    throw invalid("stream_options", "must be an object");
  }
  const includeUsage = present(body, "stream_options") ? bool(streamOptions as Json, "include_usage") : false;
  if (present(body, "user") && typeof body.user !== "string") throw invalid("user", "must be a string");
  const topK = num(body, "top_k", 0, -1, 1_000_000, true);
  return {
    model: body.model,
    maxTokens: present(body, maxKey) ? num(body, maxKey, 16, 1, 1_000_000, true) : null,
    temperature: temperature(body),
    topP: float32(body, "top_p", 1, 0, 1, true),
    topK: topK < 0 ? 0 : topK,
    minP: float32(body, "min_p", 0, 0, 1),
    seed: present(body, "seed") ? num(body, "seed", 0, -(2 ** 53), 2 ** 53, true) : null,
    stop: stops(body),
    stopTokenIds: present(body, "stop_token_ids") ? tokenIds(body.stop_token_ids, "stop_token_ids") : [],
    n: num(body, "n", 1, 1, MAX_N, true),
    presencePenalty: float32(body, "presence_penalty", 0, -2, 2),
    frequencyPenalty: float32(body, "frequency_penalty", 0, -2, 2),
    repetitionPenalty: float32(body, "repetition_penalty", 1, MIN_REPETITION_PENALTY, 10),
    logprobs,
    stream: bool(body, "stream"),
    includeUsage,
    user: present(body, "user") ? (body.user as string) : null,
    ignoreEos: bool(body, "ignore_eos"),
    includeStopStrInOutput: bool(body, "include_stop_str_in_output"),
    returnTokenIds: bool(body, "return_token_ids"),
  };
}

function messageContent(v: unknown, i: number): string {
  if (typeof v === "string") return v;
  if (v === null || v === undefined) return "";
  if (!Array.isArray(v)) throw invalid(`messages[${i}].content`, "must be a string or a list of content parts");
  return v.map((part: unknown, j) => {
    const p = part as Json;
    if (typeof p !== "object" || p === null || typeof p.type !== "string") throw invalid(`messages[${i}].content[${j}]`, "must be a content part object");
    if (p.type !== "text") {
      throw apiError("unsupported_content", { param: `messages[${i}].content[${j}].type`, detail: `content parts of type "${p.type}" are not supported (text only)` });
    }
    if (typeof p.text !== "string") throw invalid(`messages[${i}].content[${j}].text`, "must be a string");
    return p.text;
  }).join("");
}

export function parseChatRequest(body: Json): ChatRequest {
  if (!Array.isArray(body.messages) || body.messages.length === 0) throw invalid("messages", "must be a non-empty list");
  const messages = body.messages.map((m: unknown, i): ChatMessage => {
    const msg = m as Json;
    if (typeof msg !== "object" || msg === null || Array.isArray(msg)) throw invalid(`messages[${i}]`, "must be an object");
    if (typeof msg.role !== "string" || !["system", "developer", "user", "assistant", "tool"].includes(msg.role)) {
      throw invalid(`messages[${i}].role`, "must be one of system, developer, user, assistant, tool");
    }
    return { role: msg.role === "developer" ? "system" : msg.role, content: messageContent(msg.content, i) };
  });
  const wantLogprobs = bool(body, "logprobs");
  const top = num(body, "top_logprobs", 0, 0, MAX_LOGPROBS, true);
  if (present(body, "top_logprobs") && !wantLogprobs) throw invalid("top_logprobs", "requires logprobs: true");
  return { kind: "chat", messages, ...common(body, wantLogprobs ? top : null) };
}

export function parseCompletionRequest(body: Json): CompletionRequest {
  const p = body.prompt;
  let prompts: (string | number[])[];
  if (typeof p === "string") prompts = [p];
  else if (Array.isArray(p) && p.length > 0 && p.every((x) => typeof x === "number")) prompts = [tokenIds(p, "prompt")];
  else if (Array.isArray(p) && p.length > 0) {
    prompts = p.map((x: unknown) => (typeof x === "string" ? x : tokenIds(x, "prompt")));
  } else throw invalid("prompt", "must be a string, a list of strings, a list of token ids, or a list of such lists");
  if (prompts.some((x) => x.length === 0)) throw invalid("prompt", "must not be empty");
  const logprobs = present(body, "logprobs") ? num(body, "logprobs", 0, 0, MAX_LOGPROBS, true) : null;
  return { kind: "completion", prompts, echo: bool(body, "echo"), ...common(body, logprobs) };
}
