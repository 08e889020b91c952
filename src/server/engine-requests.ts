/**
 * A validated OpenAI request → engine requests: prompts as token ids, one
 * engine request per prompt × n with its sampling parameters. The default
 * max_tokens lives here and nowhere else.
 */
import type { LoadedModel } from "../engine/engine-manager.js";
import type { OutputStream } from "../engine/output-stream.js";
import type { Priority } from "../engine/request.js";
import { defaultSamplingParams, type SamplingParams } from "../engine/sampling-params.js";
import { PromptTooLongError } from "../model/prompt-limits.js";
import { apiError, type ApiError } from "./errors.js";
import type { ChatRequest, CompletionRequest } from "./request-schema.js";
import { compileStructured, requestConstraint, structuredGrammar, type StructuredOutput } from "./structured-output.js";
import { DEFAULT_CHAT_SETTINGS, outputSpec, renderOptions, requestToolParser, type ChatSettings } from "./chat-settings.js";

export type GenerationRequest = ChatRequest | CompletionRequest;

export interface Choice {
  index: number;
  promptIndex: number;
  stream: OutputStream;
}

const PRIORITY_NAMES = ["high", "normal", "low"];
export const priorityName = (p: Priority): string => PRIORITY_NAMES[p] ?? "normal";

/** OpenAI's defaults: chat may use the rest of the context, legacy completions stop at 16. */
export function maxTokens(r: GenerationRequest, promptLen: number, maxModelLen: number): number {
  return r.maxTokens ?? (r.kind === "chat" ? Math.max(1, maxModelLen - promptLen) : 16);
}

/** Tokens the request may consume at most: its prompts plus max_tokens for every choice. */
export function tokenBudget(r: GenerationRequest, prompts: readonly number[][], maxModelLen: number): number {
  return prompts.reduce((n, p) => n + p.length + r.n * maxTokens(r, p.length, maxModelLen), 0);
}

/** Top-N prompt log-probs the engine computes: for prompt_logprobs, and for completions' echo with logprobs. */
export function promptLogprobsWanted(r: GenerationRequest): number | null {
  const echoed = r.kind === "completion" && r.echo && r.logprobs !== null ? r.logprobs : null;
  if (echoed === null) return r.promptLogprobs;
  return Math.max(echoed, r.promptLogprobs ?? 0);
}

function samplingParams(r: GenerationRequest, promptLen: number, maxModelLen: number, choice: number, keepSpecialTokens: boolean): SamplingParams {
  return defaultSamplingParams({
    temperature: r.temperature, topP: r.topP, topK: r.topK, minP: r.minP,
    repetitionPenalty: r.repetitionPenalty, presencePenalty: r.presencePenalty, frequencyPenalty: r.frequencyPenalty,
    logprobs: r.logprobs ?? 0, maxTokens: maxTokens(r, promptLen, maxModelLen), stop: r.stop, stopTokenIds: r.stopTokenIds,
    ignoreEos: r.ignoreEos, includeStopStrInOutput: r.includeStopStrInOutput, minTokens: r.minTokens, logitBias: r.logitBias,
    skipSpecialTokens: r.skipSpecialTokens && !keepSpecialTokens,
    promptLogprobs: promptLogprobsWanted(r),
    ...(r.seed !== null ? { seed: BigInt.asUintN(64, r.seed + BigInt(choice)) } : {}),
  });
}

function tooLong(model: LoadedModel, e: PromptTooLongError, param: string): ApiError {
  return apiError("context_length_exceeded", {
    detail: `This model's maximum context length is ${model.engine.limits.maxModelLen} tokens; a prompt of ${e.chars} characters cannot fit (at most ${e.maxChars} characters can).`,
  }, { param });
}

/**
 * The prompts as token ids: the chat template applied, text tokenized (large
 * inputs off the event loop). A prompt too long to fit is refused before any
 * tokenizing; `signal` (the client going away) stops work in flight.
 */
export async function encodePrompts(r: GenerationRequest, model: LoadedModel, signal?: AbortSignal, chat: ChatSettings = DEFAULT_CHAT_SETTINGS): Promise<number[][]> {
  const tok = model.tokenizer;
  if (r.kind === "chat") {
    if (!tok) throw apiError("invalid_request", { param: "model", detail: `model ${model.id} has no tokenizer` });
    if (!tok.hasChatTemplate && chat.chatTemplate === null) throw apiError("invalid_request", { param: "messages", detail: `model ${model.id} has no chat template: use /v1/completions` });
    requestToolParser(r, tok, chat, model.id);
    await compileStructured(r.structured, model); // a bad schema fails before the prompt is rendered
    const options = renderOptions(r, chat);
    let ids: number[];
    try {
      ids = await model.encoder.encodeChat(r.messages, signal, options);
    } catch (e) {
      throw e instanceof PromptTooLongError ? tooLong(model, e, "messages") : e;
    }
    await compileStructured(chatConstraint(r, model, ids, chat), model);
    return [ids];
  }
  await compileStructured(r.structured, model);
  for (const p of r.prompts) {
    if (typeof p === "string" && p.length > model.encoder.maxChars) throw tooLong(model, new PromptTooLongError(p.length, model.encoder.maxChars), "prompt");
  }
  return Promise.all(r.prompts.map(async (p) => {
    if (typeof p !== "string") return p;
    if (!tok) throw apiError("invalid_request", { param: "prompt", detail: `model ${model.id} has no tokenizer: send token ids` });
    return model.encoder.encode(p, signal);
  }));
}

/** A chat request's constraint: its structured output, or the tool call it requires, after a think block where it may think. */
function chatConstraint(r: ChatRequest, model: LoadedModel, promptIds: readonly number[], chat: ChatSettings): StructuredOutput | null {
  return requestConstraint(r, model.tokenizer ? outputSpec(r, model.tokenizer, chat, promptIds, model.id) : null, chat.maxThinkTokens);
}

/** Adds every (prompt, choice) to the engine, all or none. */
export function addChoices(r: GenerationRequest, model: LoadedModel, prompts: number[][], ids: { requestId: string; tenant: string; priority: Priority },
  chat: ChatSettings = DEFAULT_CHAT_SETTINGS): Choice[] {
  const maxModelLen = model.engine.limits.maxModelLen;
  const vocab = model.engine.limits.vocabSize;
  const outside = r.logitBias.find(([id]) => id >= vocab);
  if (outside) throw apiError("invalid_request", { param: "logit_bias", detail: `token id ${outside[0]} is outside the vocabulary (0..${vocab - 1})` });
  if (promptLogprobsWanted(r) !== null && model.runner.info().device === "cuda") {
    throw apiError("invalid_request", { param: r.promptLogprobs !== null ? "prompt_logprobs" : "echo", detail: `model ${model.id} runs on CUDA, which does not compute prompt log-probs yet` });
  }
  // A tool-call marker that is a special token (Mistral's [TOOL_CALLS]) must survive detokenizing.
  const keepSpecial = r.kind === "chat" && model.tokenizer !== null && (requestToolParser(r, model.tokenizer, chat, model.id)?.needsSpecialTokens ?? false);
  const grammar = structuredGrammar(r.kind === "chat" ? chatConstraint(r, model, prompts[0]!, chat) : r.structured, model);
  const inputs = prompts.flatMap((promptTokenIds, p) => Array.from({ length: r.n }, (_, i) => {
    const index = p * r.n + i;
    return {
      index, promptIndex: p,
      input: { id: `${ids.requestId}-${index}`, promptTokenIds, params: samplingParams(r, promptTokenIds.length, maxModelLen, index, keepSpecial), priority: ids.priority, tenant: ids.tenant, ...(grammar ? { grammar } : {}) },
    };
  }));
  const streams = model.engine.addGroup(inputs.map((x) => x.input));
  return inputs.map((x, i) => ({ index: x.index, promptIndex: x.promptIndex, stream: streams[i]! }));
}
