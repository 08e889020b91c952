/**
 * Chat and text completions: validated requests → engine requests (one per
 * prompt × n) → OpenAI response objects, streamed as SSE or returned whole.
 */
import type { FastifyReply } from "fastify";
import { randomBytes } from "node:crypto";
import { EngineError } from "../engine/errors.js";
import type { LoadedModel } from "../engine/engine-manager.js";
import type { OutputStream, RequestOutput } from "../engine/output-stream.js";
import { Priority, type GeneratedLogprob } from "../engine/request.js";
import { defaultSamplingParams, type SamplingParams } from "../engine/sampling-params.js";
import { ApiError } from "./errors.js";
import type { ChatRequest, CompletionRequest } from "./request-schema.js";
import { SseWriter, type SseLimits } from "./sse.js";
import type { Caller } from "./auth.js";

export interface GenerationContext {
  model: LoadedModel;
  caller: Caller;
  priority: Priority;
  requestId: string;
  /** Called once when the request ends: the per-request log line and usage record. */
  onDone: (summary: RequestSummary) => void;
  sseLimits: SseLimits;
  /** Called when a stalled stream reader is cut off. */
  onStall: () => void;
}

export interface RequestSummary {
  promptTokens: number;
  completionTokens: number;
  ttftMs: number | null;
  finishReasons: string[];
}

interface Choice {
  index: number;
  promptIndex: number;
  stream: OutputStream;
}

interface Prepared {
  prompts: number[][];
  choices: Choice[];
}

const PRIORITY_NAMES = ["high", "normal", "low"];
export const priorityName = (p: Priority): string => PRIORITY_NAMES[p] ?? "normal";

function samplingParams(r: ChatRequest | CompletionRequest, promptLen: number, maxModelLen: number, choice: number): SamplingParams {
  const maxTokens = r.maxTokens ?? (r.kind === "chat" ? Math.max(1, maxModelLen - promptLen) : 16);
  return defaultSamplingParams({
    temperature: r.temperature, topP: r.topP, topK: r.topK, minP: r.minP,
    repetitionPenalty: r.repetitionPenalty, presencePenalty: r.presencePenalty, frequencyPenalty: r.frequencyPenalty,
    logprobs: r.logprobs ?? 0, maxTokens, stop: r.stop, stopTokenIds: r.stopTokenIds, ignoreEos: r.ignoreEos,
    ...(r.seed !== null ? { seed: (r.seed + choice) >>> 0 } : {}),
  });
}

function toApiError(e: unknown): ApiError {
  if (e instanceof ApiError) return e;
  if (e instanceof EngineError) {
    if (e.code === "queue_full") return new ApiError("queue_full", e.message, null, 1);
    if (e.code === "shutting_down") return new ApiError("shutting_down", e.message, null, 5);
    return new ApiError(e.code, e.message, e.param);
  }
  throw e;
}

/** Adds every (prompt, choice) to the engine; on an admission error nothing stays queued. */
function prepare(r: ChatRequest | CompletionRequest, ctx: GenerationContext, prompts: number[][]): Prepared {
  const { engine } = ctx.model;
  const maxModelLen = engine.options.maxModelLen;
  const choices: Choice[] = [];
  try {
    prompts.forEach((ids, p) => {
      for (let i = 0; i < r.n; i++) {
        const index = p * r.n + i;
        const stream = engine.add({
          id: `${ctx.requestId}-${index}`, promptTokenIds: ids, params: samplingParams(r, ids.length, maxModelLen, index),
          priority: ctx.priority, tenant: ctx.caller.tenant,
        });
        choices.push({ index, promptIndex: p, stream });
      }
    });
  } catch (e) {
    for (const c of choices) engine.abort(c.stream.id);
    throw toApiError(e);
  }
  return { prompts, choices };
}

export function encodePrompts(r: ChatRequest | CompletionRequest, model: LoadedModel): number[][] {
  const tok = model.tokenizer;
  if (r.kind === "chat") {
    if (!tok) throw new ApiError("invalid_request", `model ${model.id} has no tokenizer`, "model");
    if (!tok.hasChatTemplate) throw new ApiError("invalid_request", `model ${model.id} has no chat template: use /v1/completions`, "messages");
    return [tok.encodeChat(r.messages)];
  }
  return r.prompts.map((p) => {
    if (typeof p !== "string") return p;
    if (!tok) throw new ApiError("invalid_request", `model ${model.id} has no tokenizer: send token ids`, "prompt");
    return tok.encode(p);
  });
}

function tokenText(model: LoadedModel, id: number): string {
  return model.tokenizer ? model.tokenizer.decode([id], false) : String(id);
}

function chatLogprobs(model: LoadedModel, lps: GeneratedLogprob[], top: number): unknown {
  const entry = (id: number, logprob: number): { token: string; logprob: number; bytes: number[] } => {
    const token = tokenText(model, id);
    return { token, logprob, bytes: [...Buffer.from(token, "utf8")] };
  };
  return { content: lps.map((lp) => ({ ...entry(lp.tokenId, lp.logprob), top_logprobs: lp.top.slice(0, top).map((t) => entry(t.tokenId, t.logprob)) })) };
}

function completionLogprobs(model: LoadedModel, lps: GeneratedLogprob[], top: number, offset: number): unknown {
  const tokens = lps.map((lp) => tokenText(model, lp.tokenId));
  const offsets: number[] = [];
  let at = offset;
  for (const t of tokens) {
    offsets.push(at);
    at += t.length;
  }
  return {
    tokens,
    token_logprobs: lps.map((lp) => lp.logprob),
    top_logprobs: lps.map((lp) => Object.fromEntries(lp.top.slice(0, top).map((t) => [tokenText(model, t.tokenId), t.logprob]))),
    text_offset: offsets,
  };
}

function usage(prompts: number[][], outs: RequestOutput[]): Record<string, unknown> {
  const promptTokens = prompts.reduce((n, p) => n + p.length, 0);
  const completion = outs.reduce((n, o) => n + (o.usage?.completionTokens ?? 0), 0);
  const cached = outs.reduce((m, o) => Math.max(m, o.usage?.cachedTokens ?? 0), 0);
  return { prompt_tokens: promptTokens, completion_tokens: completion, total_tokens: promptTokens + completion, prompt_tokens_details: { cached_tokens: cached } };
}

export function newId(prefix: string): string {
  return `${prefix}-${randomBytes(12).toString("hex")}`;
}

/** Runs a chat or completion request and answers it on `reply`. */
export async function runGeneration(r: ChatRequest | CompletionRequest, ctx: GenerationContext, reply: FastifyReply): Promise<void> {
  const prompts = encodePrompts(r, ctx.model);
  const prepared = prepare(r, ctx, prompts);
  const started = performance.now();
  const finish = (outs: RequestOutput[]): void => {
    const first = Math.min(...prepared.choices.map((c) => c.stream.firstTokenAt ?? Infinity));
    ctx.onDone({
      promptTokens: prompts.reduce((n, p) => n + p.length, 0),
      completionTokens: outs.reduce((n, o) => n + (o.usage?.completionTokens ?? 0), 0),
      ttftMs: Number.isFinite(first) ? first - started : null,
      finishReasons: outs.map((o) => o.finishReason ?? "abort"),
    });
  };
  // A client that goes away aborts its requests at the next step; their blocks are freed at once.
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) for (const c of prepared.choices) ctx.model.engine.abort(c.stream.id);
  });
  if (r.stream) await streamResponse(r, ctx, prepared, reply, finish);
  else await wholeResponse(r, ctx, prepared, reply, finish);
}

async function wholeResponse(r: ChatRequest | CompletionRequest, ctx: GenerationContext, p: Prepared, reply: FastifyReply,
  finish: (o: RequestOutput[]) => void): Promise<void> {
  const full = await Promise.all(p.choices.map((c) => c.stream.collect()));
  finish(full);
  const failed = full.find((o) => o.finishReason === "error");
  if (failed?.errorKind === "shutdown") throw new ApiError("shutting_down", `The server shut down before request ${ctx.requestId} finished.`, null, 5);
  if (failed) throw new ApiError("internal_error", `generation failed (request ${ctx.requestId}): ${failed.error ?? "unknown error"}`);
  if (reply.raw.destroyed) return;
  const id = newId(r.kind === "chat" ? "chatcmpl" : "cmpl");
  const created = Math.floor(Date.now() / 1000);
  const body: Record<string, unknown> = { id, object: r.kind === "chat" ? "chat.completion" : "text_completion", created, model: ctx.model.id };
  body.choices = p.choices.map((c, i) => {
    const o = full[i]!;
    const choice: Record<string, unknown> = { index: c.index };
    if (r.kind === "chat") {
      choice.message = { role: "assistant", content: o.text };
      choice.logprobs = r.logprobs !== null ? chatLogprobs(ctx.model, o.logprobs, r.logprobs) : null;
    } else {
      const prefix = r.echo ? promptText(ctx.model, r, p.prompts[c.promptIndex]!, c.promptIndex) : "";
      choice.text = prefix + o.text;
      choice.logprobs = r.logprobs !== null ? completionLogprobs(ctx.model, o.logprobs, r.logprobs, prefix.length) : null;
    }
    choice.finish_reason = o.finishReason;
    if (r.returnTokenIds) choice.token_ids = o.tokenIds;
    return choice;
  });
  body.usage = usage(p.prompts, full);
  if (r.returnTokenIds) body.prompt_token_ids = p.prompts.length === 1 ? p.prompts[0] : p.prompts;
  await reply.send(body);
}

function promptText(model: LoadedModel, r: CompletionRequest, ids: number[], i: number): string {
  const original = r.prompts[i];
  return typeof original === "string" ? original : model.tokenizer?.decode(ids, false) ?? "";
}

async function streamResponse(r: ChatRequest | CompletionRequest, ctx: GenerationContext, p: Prepared, reply: FastifyReply,
  finish: (o: RequestOutput[]) => void): Promise<void> {
  reply.hijack();
  const sse = new SseWriter(reply.raw, ctx.sseLimits, ctx.onStall);
  const id = newId(r.kind === "chat" ? "chatcmpl" : "cmpl");
  const created = Math.floor(Date.now() / 1000);
  const object = r.kind === "chat" ? "chat.completion.chunk" : "text_completion";
  const chunk = (choices: unknown[], extra: Record<string, unknown> = {}): Record<string, unknown> => ({
    id, object, created, model: ctx.model.id, choices, ...(r.includeUsage ? { usage: null } : {}), ...extra,
  });
  const finals: RequestOutput[] = [];
  let error: RequestOutput | null = null;
  await Promise.all(p.choices.map(async (c) => {
    if (r.kind === "chat") sse.send(chunk([{ index: c.index, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null }]));
    else if (r.echo) sse.send(chunk([{ index: c.index, text: promptText(ctx.model, r, p.prompts[c.promptIndex]!, c.promptIndex), logprobs: null, finish_reason: null }]));
    let textOffset = 0;
    for await (const o of c.stream) {
      if (o.finished) finals.push(o);
      if (o.finishReason === "error") {
        error ??= o;
        continue;
      }
      const finishReason = o.finished ? o.finishReason : null;
      if (!o.text && !finishReason && !(r.logprobs !== null && o.logprobs.length)) continue;
      const extra: Record<string, unknown> = r.returnTokenIds ? { token_ids: o.tokenIds } : {};
      if (r.kind === "chat") {
        const lp = r.logprobs !== null ? chatLogprobs(ctx.model, o.logprobs, r.logprobs) : null;
        sse.send(chunk([{ index: c.index, delta: o.text ? { content: o.text } : {}, logprobs: lp, finish_reason: finishReason, ...extra }]));
      } else {
        const lp = r.logprobs !== null ? completionLogprobs(ctx.model, o.logprobs, r.logprobs, textOffset) : null;
        textOffset += o.text.length;
        sse.send(chunk([{ index: c.index, text: o.text, logprobs: lp, finish_reason: finishReason, ...extra }]));
      }
    }
  }));
  finish(finals);
  if (error !== null) {
    const e: RequestOutput = error;
    sse.send(e.errorKind === "shutdown"
      ? new ApiError("shutting_down", `The server shut down before request ${ctx.requestId} finished.`).body()
      : new ApiError("internal_error", `generation failed (request ${ctx.requestId}): ${e.error ?? "unknown error"}`).body());
  } else if (r.includeUsage) {
    sse.send({ id, object, created, model: ctx.model.id, choices: [], usage: usage(p.prompts, finals) });
  }
  sse.done();
}
