/**
 * Runs one chat or completion request: tokenize, reserve its token budget,
 * admit every choice, then answer as SSE or as one JSON body. Whatever
 * happens after admission, the request ends exactly once: the token
 * reservation is settled, usage is recorded and one log line is written.
 */
import type { FastifyReply } from "fastify";
import type { Logger } from "pino";
import type { LoadedModel } from "../engine/engine-manager.js";
import type { RequestOutput } from "../engine/output-stream.js";
import type { Priority } from "../engine/request.js";
import type { Caller } from "./auth.js";
import { addChoices, encodePrompts, tokenBudget, type Choice, type GenerationRequest } from "./engine-requests.js";
import { toApiError } from "./errors.js";
import { ChunkFormatter, failureError, responseHeader, usageTotals, wholeBody, type UsageTotals } from "./openai-format.js";
import type { RateAdmission } from "./rate-limiter.js";
import type { ChatOutputSpec } from "./chat-output.js";
import { DEFAULT_CHAT_SETTINGS, outputSpec, type ChatSettings } from "./chat-settings.js";
import { SseWriter, type SseLimits } from "./sse.js";

/** Receives finished requests' usage; must not block or throw. */
export interface UsageSink {
  record(keyName: string, promptTokens: number, completionTokens: number): void;
}

export interface GenerationContext {
  model: LoadedModel;
  caller: Caller;
  priority: Priority;
  logPriority: string;
  requestId: string;
  /** The caller's rate-limit admission: the token budget is reserved on it, then settled. */
  admission: RateAdmission;
  usage: UsageSink | null;
  log: Logger;
  sseLimits: SseLimits;
  /** --chat-template, --reasoning-parser, --tool-call-parser (default: the model's template, parsers chosen from it). */
  chat?: ChatSettings;
}

/** Runs a chat or completion request and answers it on `reply`. */
export async function runGeneration(r: GenerationRequest, ctx: GenerationContext, reply: FastifyReply): Promise<void> {
  // A client that leaves while its prompt is tokenized frees the worker at once.
  const gone = new AbortController();
  const chat = ctx.chat ?? DEFAULT_CHAT_SETTINGS;
  reply.raw.once("close", () => {
    if (!reply.raw.writableFinished) gone.abort();
  });
  let prompts: number[][];
  try {
    prompts = await encodePrompts(r, ctx.model, gone.signal, chat);
  } catch (e) {
    if (!gone.signal.aborted) throw e;
    reply.hijack(); // nobody is left to answer
    return;
  }
  const spec = r.kind === "chat" && ctx.model.tokenizer ? outputSpec(r, ctx.model.tokenizer, chat, prompts[0]!, ctx.model.id) : null;
  ctx.admission.reserve(tokenBudget(r, prompts, ctx.model.engine.limits.maxModelLen), prompts.length * r.n);
  let choices: Choice[];
  try {
    choices = addChoices(r, ctx.model, prompts, { requestId: ctx.requestId, tenant: ctx.caller.tenant, priority: ctx.priority }, chat);
  } catch (e) {
    ctx.admission.settle(0);
    throw e;
  }
  const started = performance.now();
  // A client that goes away aborts its requests at the next step; their blocks are freed at once.
  reply.raw.on("close", () => {
    if (!reply.raw.writableFinished) for (const c of choices) ctx.model.engine.abort(c.stream.id);
  });
  let ended = false;
  const finish = (outs: RequestOutput[]): UsageTotals => {
    const totals = usageTotals(prompts, outs, r.n);
    if (!ended) finished(ctx, totals, outs, choices, started);
    ended = true;
    return totals;
  };
  try {
    if (r.stream) await streamResponse(r, ctx, prompts, choices, reply, finish, spec);
    else await wholeResponse(r, ctx, prompts, choices, reply, finish, spec);
  } finally {
    if (!ended) finish(choices.map(() => emptyFinal()));
  }
}

/** The end of a request: settle the reservation, record usage, log one line. Never throws. */
function finished(ctx: GenerationContext, u: UsageTotals, outs: RequestOutput[], choices: Choice[], started: number): void {
  ctx.admission.settle(u.promptTokens + u.completionTokens);
  if (ctx.caller.keyName && ctx.usage) ctx.usage.record(ctx.caller.keyName, u.promptTokens, u.completionTokens);
  const first = Math.min(...choices.map((c) => c.stream.firstTokenAt ?? Infinity));
  ctx.log.info({
    id: ctx.requestId, tenant: ctx.caller.tenant, model: ctx.model.id, priority: ctx.logPriority, prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens, cached_tokens: u.cachedTokens, ttft_ms: Number.isFinite(first) ? Math.round(first - started) : null,
    duration_ms: Math.round(performance.now() - started), finish_reason: outs.map((o) => o.finishReason ?? "abort").join(","),
    ...(outs.some((o) => o.error) ? { error: outs.find((o) => o.error)?.error } : {}),
  }, "request");
}

async function wholeResponse(r: GenerationRequest, ctx: GenerationContext, prompts: number[][], choices: Choice[], reply: FastifyReply,
  finish: (o: RequestOutput[]) => UsageTotals, spec: ChatOutputSpec | null): Promise<void> {
  const outs = await Promise.all(choices.map((c) => c.stream.collect()));
  finish(outs);
  const failed = outs.find((o) => o.finishReason === "error");
  if (failed) throw failureError(failed, ctx.requestId);
  if (reply.raw.destroyed) return;
  await reply.send(wholeBody(r, responseHeader(r, ctx.model.id), ctx.model, prompts, choices, outs, spec));
}

async function streamResponse(r: GenerationRequest, ctx: GenerationContext, prompts: number[][], choices: Choice[], reply: FastifyReply,
  finish: (o: RequestOutput[]) => UsageTotals, spec: ChatOutputSpec | null): Promise<void> {
  reply.hijack();
  const onStall = (): void => ctx.log.warn({ id: ctx.requestId, tenant: ctx.caller.tenant }, "stream reader stalled: request aborted");
  const sse = new SseWriter(reply.raw, ctx.sseLimits, onStall);
  const fmt = new ChunkFormatter(r, responseHeader(r, ctx.model.id), ctx.model, spec);
  const finals: RequestOutput[] = [];
  let failed: RequestOutput | null = null;
  try {
    await Promise.all(choices.map(async (c, i) => {
      const opening = fmt.opening(c, prompts);
      if (opening) sse.send(opening);
      let textOffset = 0;
      for await (const o of c.stream) {
        if (o.finished) finals[i] = o;
        if (o.finishReason === "error") {
          failed ??= o;
          continue;
        }
        for (const chunk of fmt.deltas(c, o, textOffset)) sse.send(chunk);
        textOffset += o.text.length;
      }
    }));
    const totals = finish(choices.map((_, i) => finals[i] ?? emptyFinal()));
    if (failed !== null) sse.send(failureError(failed, ctx.requestId).body());
    else if (r.includeUsage) sse.send(fmt.usage(totals));
  } catch (e) {
    // A fault after the headers went out still ends the stream with an error event.
    sse.send(toApiError(e, { requestId: ctx.requestId, logFault: (f, m) => ctx.log.error(f, m) }).body());
  } finally {
    sse.done();
  }
}

function emptyFinal(): RequestOutput {
  return { tokenIds: [], text: "", logprobs: [], finished: true, finishReason: "abort" };
}

