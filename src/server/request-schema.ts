/**
 * OpenAI request bodies → typed, validated requests. Unknown fields are
 * ignored; a present field with a bad value is a 400 naming the field.
 * Sampling parameters are checked in the units the sampler uses (float32):
 * a value that rounds to something outside the sampler's domain is refused
 * here, so no row can fail a batch step.
 */
import { apiError, invalid } from "./errors.js";
import type { ChatMessage, TemplateToolCall } from "../model/tokenizer.js";
import { parseStructuredOutput, type StructuredOutput } from "./structured-output.js";

type Json = Record<string, unknown>;

export interface CommonFields {
  model: string;
  maxTokens: number | null;
  temperature: number;
  topP: number;
  topK: number;
  minP: number;
  /** 64 bits; negative seeds are taken in two's complement. */
  seed: bigint | null;
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
  /** vLLM's skip_special_tokens (default true): special tokens' text is left out of the output. */
  skipSpecialTokens: boolean;
  /** vLLM's min_tokens: no stop token or EOS ends the request before this many tokens. */
  minTokens: number;
  /** OpenAI's logit_bias as (token id, bias) pairs. */
  logitBias: [number, number][];
  /** response_format or structured_outputs: the grammar the output must follow, or null. */
  structured: StructuredOutput | null;
  /** vLLM's prompt_logprobs: top-N log-probs at every prompt position (not streamed), or null. */
  promptLogprobs: number | null;
}

/** OpenAI's tool_choice: a function named, or what the model may do. */
export type ToolChoice = "none" | "auto" | "required" | { name: string };

export interface ChatRequest extends CommonFields {
  kind: "chat";
  messages: ChatMessage[];
  /** The request's tools, as sent (OpenAI function tools), for the chat template. */
  tools: Json[];
  toolChoice: ToolChoice;
  parallelToolCalls: boolean;
  /** Extra chat template variables (vLLM's chat_template_kwargs). */
  chatTemplateKwargs: Json;
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

/** Any 64-bit integer, signed or not. */
function seed(body: Json): bigint | null {
  if (!present(body, "seed")) return null;
  const v = num(body, "seed", 0, -(2 ** 63), 2 ** 64, true);
  if (v >= 2 ** 64) throw invalid("seed", "must be below 2^64");
  return BigInt.asUintN(64, BigInt(v));
}

const MAX_LOGIT_BIAS = 300;

/** {"token id": bias in [-100, 100]}, as OpenAI takes it. */
function logitBias(body: Json): [number, number][] {
  if (!present(body, "logit_bias")) return [];
  const v = body.logit_bias;
  if (typeof v !== "object" || v === null || Array.isArray(v)) throw invalid("logit_bias", "must be an object mapping token ids to biases");
  const entries = Object.entries(v as Json);
  if (entries.length > MAX_LOGIT_BIAS) throw invalid("logit_bias", `at most ${MAX_LOGIT_BIAS} tokens`);
  return entries.map(([k, b]): [number, number] => {
    if (!/^\d+$/.test(k) || !Number.isSafeInteger(Number(k))) throw invalid("logit_bias", `key "${k}" is not a token id`);
    if (typeof b !== "number" || !(b >= -100 && b <= 100)) throw invalid("logit_bias", `the bias of token ${k} must be a number between -100 and 100`);
    return [Number(k), Math.fround(b)];
  });
}

/** vLLM's prompt_logprobs: 0..20; like vLLM, not with stream (the echo of completions streams them instead). */
function promptLogprobs(body: Json): number | null {
  if (!present(body, "prompt_logprobs")) return null;
  const n = num(body, "prompt_logprobs", 0, 0, MAX_LOGPROBS, true);
  if (body.stream === true) throw invalid("prompt_logprobs", "is not available with stream: true");
  return n;
}

/** `zeroMaxTokens`: max_tokens 0 is allowed (completions' echo returns just the prompt). */
function common(body: Json, logprobs: number | null, zeroMaxTokens = false): CommonFields {
  if (typeof body.model !== "string" || body.model === "") throw invalid("model", "is required and must be a string");
  const maxKey = present(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const streamOptions = body.stream_options;
  if (present(body, "stream_options") && (typeof streamOptions !== "object" || Array.isArray(streamOptions))) {
    throw invalid("stream_options", "must be an object");
  }
  const includeUsage = present(body, "stream_options") ? bool(streamOptions as Json, "include_usage") : false;
  if (present(body, "user") && typeof body.user !== "string") throw invalid("user", "must be a string");
  const topK = num(body, "top_k", 0, -1, 1_000_000, true);
  const maxTokens = present(body, maxKey) ? num(body, maxKey, 16, 0, 1_000_000, true) : null;
  if (maxTokens === 0 && !zeroMaxTokens) throw invalid(maxKey, "must be at least 1 (0 is allowed only with echo on /v1/completions)");
  const minTokens = num(body, "min_tokens", 0, 0, 1_000_000, true);
  if (maxTokens !== null && minTokens > maxTokens) throw invalid("min_tokens", `must not exceed ${maxKey} (${maxTokens})`);
  return {
    model: body.model,
    maxTokens,
    temperature: temperature(body),
    topP: float32(body, "top_p", 1, 0, 1, true),
    topK: topK < 0 ? 0 : topK,
    minP: float32(body, "min_p", 0, 0, 1),
    seed: seed(body),
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
    skipSpecialTokens: bool(body, "skip_special_tokens", true),
    minTokens,
    logitBias: logitBias(body),
    structured: parseStructuredOutput(body),
    promptLogprobs: promptLogprobs(body),
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

const isObject = (v: unknown): v is Json => typeof v === "object" && v !== null && !Array.isArray(v);

/** An assistant message's tool_calls, arguments parsed to objects as chat templates expect them. */
function messageToolCalls(v: unknown, i: number): TemplateToolCall[] {
  if (!Array.isArray(v)) throw invalid(`messages[${i}].tool_calls`, "must be a list");
  return v.map((c: unknown, j): TemplateToolCall => {
    const at = `messages[${i}].tool_calls[${j}]`;
    const fn = isObject(c) ? c.function : undefined;
    if (!isObject(c) || !isObject(fn) || typeof fn.name !== "string") throw invalid(at, "must be {id, type: \"function\", function: {name, arguments}}");
    let args: unknown = fn.arguments ?? {};
    if (typeof args === "string") {
      try {
        args = JSON.parse(args);
      } catch {
        throw invalid(`${at}.function.arguments`, "must be a JSON object encoded as a string");
      }
    }
    if (!isObject(args)) throw invalid(`${at}.function.arguments`, "must be a JSON object encoded as a string");
    return { ...(typeof c.id === "string" ? { id: c.id } : {}), type: "function", function: { name: fn.name, arguments: args } };
  });
}

function chatMessage(m: unknown, i: number): ChatMessage {
  if (!isObject(m)) throw invalid(`messages[${i}]`, "must be an object");
  if (typeof m.role !== "string" || !["system", "developer", "user", "assistant", "tool"].includes(m.role)) {
    throw invalid(`messages[${i}].role`, "must be one of system, developer, user, assistant, tool");
  }
  const msg: ChatMessage = { role: m.role === "developer" ? "system" : m.role, content: messageContent(m.content, i) };
  if (m.role === "assistant" && present(m, "tool_calls")) msg.tool_calls = messageToolCalls(m.tool_calls, i);
  if (m.role === "assistant" && typeof m.reasoning_content === "string") msg.reasoning_content = m.reasoning_content;
  if (m.role === "tool") {
    if (typeof m.tool_call_id !== "string") throw invalid(`messages[${i}].tool_call_id`, "is required on a tool message and must be a string");
    msg.tool_call_id = m.tool_call_id;
  }
  if (typeof m.name === "string") msg.name = m.name;
  return msg;
}

function tools(body: Json): Json[] {
  if (!present(body, "tools")) return [];
  if (!Array.isArray(body.tools)) throw invalid("tools", "must be a list of tools");
  return body.tools.map((t: unknown, i) => {
    const fn = isObject(t) ? t.function : undefined;
    if (!isObject(t) || t.type !== "function" || !isObject(fn)) throw invalid(`tools[${i}]`, "must be {type: \"function\", function: {name, description, parameters}}");
    if (typeof fn.name !== "string" || fn.name === "") throw invalid(`tools[${i}].function.name`, "must be a non-empty string");
    if (present(fn, "parameters") && !isObject(fn.parameters)) throw invalid(`tools[${i}].function.parameters`, "must be a JSON schema object");
    return t;
  });
}

function toolChoice(body: Json, declared: Json[]): ToolChoice {
  const v = body.tool_choice;
  const names = declared.map((t) => (t.function as Json).name);
  if (!present(body, "tool_choice")) return declared.length > 0 ? "auto" : "none";
  if (v === "none" || v === "auto" || v === "required") {
    if (v === "required" && declared.length === 0) throw invalid("tool_choice", "\"required\" needs tools");
    return v;
  }
  const fn = isObject(v) && v.type === "function" && isObject(v.function) ? v.function : null;
  if (!fn || typeof fn.name !== "string") throw invalid("tool_choice", "must be \"none\", \"auto\", \"required\" or {type: \"function\", function: {name}}");
  if (!names.includes(fn.name)) throw invalid("tool_choice", `names function "${fn.name}", which is not in tools`);
  return { name: fn.name };
}

export function parseChatRequest(body: Json): ChatRequest {
  if (!Array.isArray(body.messages) || body.messages.length === 0) throw invalid("messages", "must be a non-empty list");
  const messages = body.messages.map(chatMessage);
  const wantLogprobs = bool(body, "logprobs");
  const top = num(body, "top_logprobs", 0, 0, MAX_LOGPROBS, true);
  if (present(body, "top_logprobs") && !wantLogprobs) throw invalid("top_logprobs", "requires logprobs: true");
  if (present(body, "chat_template_kwargs") && !isObject(body.chat_template_kwargs)) throw invalid("chat_template_kwargs", "must be an object");
  const declared = tools(body);
  const fields = common(body, wantLogprobs ? top : null);
  const choice = toolChoice(body, declared);
  if (fields.structured && (choice === "required" || typeof choice === "object")) {
    throw invalid("tool_choice", `a required tool call cannot also follow ${fields.structured.param}: give one of them`);
  }
  const kwargs = present(body, "chat_template_kwargs") ? (body.chat_template_kwargs as Json) : {};
  return {
    kind: "chat", messages, tools: declared, toolChoice: choice, parallelToolCalls: bool(body, "parallel_tool_calls", true),
    chatTemplateKwargs: constrained(fields, choice) ? noThinking(kwargs) : kwargs,
    ...fields,
  };
}

/** Decoding is constrained from the first token: by a structured output, or a tool call that must come. */
const constrained = (f: CommonFields, choice: ToolChoice): boolean => f.structured !== null || choice === "required" || typeof choice === "object";

/** A thinking template (Qwen3) does not think before a constrained answer unless the request asks for it. */
function noThinking(kwargs: Json): Json {
  return "enable_thinking" in kwargs ? kwargs : { ...kwargs, enable_thinking: false };
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
  const echo = bool(body, "echo");
  return { kind: "completion", prompts, echo, ...common(body, logprobs, echo) };
}
