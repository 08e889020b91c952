/**
 * POST /tokenize and POST /detokenize in vLLM's shapes. /tokenize takes a
 * `prompt`, or chat `messages` rendered through the chat template as a chat
 * completion would be (tools and chat_template_kwargs included).
 */
import type { FastifyInstance } from "fastify";
import type { EngineManager, LoadedModel } from "../engine/engine-manager.js";
import { checkPromptChars, PromptTooLongError } from "../model/prompt-limits.js";
import type { TextTokenizer } from "../model/tokenizer.js";
import { renderOptions, type ChatSettings } from "./chat-settings.js";
import { encodePrompts } from "./engine-requests.js";
import { apiError, invalid } from "./errors.js";
import { parseChatRequest, parseCompletionRequest } from "./request-schema.js";

type Json = Record<string, unknown>;

function bool(body: Json, key: string, def: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return def;
  if (typeof v !== "boolean") throw invalid(key, "must be a boolean");
  return v;
}

function jsonBody(body: unknown): Json {
  if (typeof body !== "object" || body === null || Array.isArray(body)) throw apiError("invalid_request", { param: "body", detail: "must be a JSON object" });
  return body as Json;
}

function tokenizerOf(model: LoadedModel): TextTokenizer {
  if (!model.tokenizer) throw apiError("invalid_request", { param: "model", detail: `model ${model.id} has no tokenizer` });
  return model.tokenizer;
}

/** Chat messages → ids; the default (a generation prompt, no added special tokens) is exactly a chat completion's prompt. */
async function chatIds(body: Json, model: LoadedModel, chat: ChatSettings): Promise<number[]> {
  const r = parseChatRequest(body);
  const addGenerationPrompt = bool(body, "add_generation_prompt", true);
  const addSpecialTokens = bool(body, "add_special_tokens", false);
  if (addGenerationPrompt && !addSpecialTokens) return (await encodePrompts(r, model, undefined, chat))[0]!;
  const tok = tokenizerOf(model);
  const text = tok.renderChat(r.messages, { ...renderOptions(r, chat), addGenerationPrompt });
  checkPromptChars(text.length, model.encoder.maxChars);
  return tok.encode(text, addSpecialTokens);
}

async function promptIds(body: Json, model: LoadedModel): Promise<number[]> {
  if (typeof body.prompt !== "string") throw invalid("prompt", "must be a string (or send chat messages)");
  const addSpecialTokens = bool(body, "add_special_tokens", true);
  if (addSpecialTokens) return (await encodePrompts(parseCompletionRequest(body), model))[0]!;
  checkPromptChars(body.prompt.length, model.encoder.maxChars);
  return tokenizerOf(model).encode(body.prompt, false);
}

export function installTokenizeRoutes(app: FastifyInstance, manager: EngineManager, chat: ChatSettings): void {
  const key = { config: { access: "key" as const } };

  app.post("/tokenize", key, async (req) => {
    const body = jsonBody(req.body);
    if (typeof body.model !== "string" || body.model === "") throw invalid("model", "is required and must be a string");
    const model = await manager.acquire(body.model, req.id);
    let tokens: number[];
    try {
      tokens = body.messages !== undefined ? await chatIds(body, model, chat) : await promptIds(body, model);
    } catch (e) {
      if (!(e instanceof PromptTooLongError)) throw e;
      throw apiError("context_length_exceeded", { detail: `a prompt of ${e.chars} characters cannot fit this model's context (at most ${e.maxChars} characters can)` });
    }
    const strs = bool(body, "return_token_strs", false);
    const tok = model.tokenizer;
    return {
      count: tokens.length, max_model_len: model.engine.limits.maxModelLen, tokens,
      token_strs: strs && tok ? tokens.map((t) => tok.tokenPiece(t) ?? "") : null,
    };
  });

  app.post("/detokenize", key, async (req) => {
    const body = jsonBody(req.body);
    if (typeof body.model !== "string" || body.model === "") throw invalid("model", "is required and must be a string");
    const model = await manager.acquire(body.model, req.id);
    const vocab = model.engine.limits.vocabSize;
    const tokens = body.tokens;
    if (!Array.isArray(tokens) || !tokens.every((t) => Number.isSafeInteger(t) && (t as number) >= 0 && (t as number) < vocab)) {
      throw invalid("tokens", `must be a list of token ids (0..${vocab - 1})`);
    }
    return { prompt: tokenizerOf(model).decode(tokens as number[], false) };
  });
}
