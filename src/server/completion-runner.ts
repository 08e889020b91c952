/**
 * One chat or completion request run without HTTP (a batch line): validated
 * like the HTTP routes, encoded, added to the engine, collected into the same
 * body a non-streamed response has. A full engine queue is waited out, not
 * reported; a shutdown is reported as such, so the caller can leave the line
 * to be run again after restart.
 */
import type { EngineManager } from "../engine/engine-manager.js";
import { EngineError } from "../engine/errors.js";
import type { Priority } from "../engine/request.js";
import type { RequestOutput } from "../engine/output-stream.js";
import { addChoices, encodePrompts, type Choice, type GenerationRequest } from "./engine-requests.js";
import { failureError, responseHeader, usageTotals, wholeBody, type UsageTotals } from "./openai-format.js";
import { invalid, toApiError, type ErrorContext } from "./errors.js";
import { parseChatRequest, parseCompletionRequest } from "./request-schema.js";
import { outputSpec, type ChatSettings } from "./chat-settings.js";

type Json = Record<string, unknown>;

export type CompletionKind = "chat" | "completion";

export interface CompletionJob {
  kind: CompletionKind;
  body: Json;
  requestId: string;
  tenant: string;
  priority: Priority;
  /** Aborting ends the request's engine work; the result is then `aborted`. */
  signal: AbortSignal;
  /** The server's chat template and parsers, as the HTTP routes use them. */
  chat: ChatSettings;
}

/** An HTTP-like answer, or why there is none: the server shut down, or the job was aborted. */
export type CompletionResult =
  | { kind: "response"; statusCode: number; body: Json; usage: UsageTotals | null }
  | { kind: "shutdown" }
  | { kind: "aborted" };

/** How long to wait before offering a request again when the engine's queue is full. */
const QUEUE_FULL_RETRY_MS = 250;

export async function runCompletion(manager: EngineManager, job: CompletionJob, ctx: ErrorContext): Promise<CompletionResult> {
  try {
    if (job.body.stream === true) throw invalid("stream", "streaming is not supported in a batch");
    const r: GenerationRequest = job.kind === "chat" ? parseChatRequest(job.body) : parseCompletionRequest(job.body);
    const model = await manager.acquire(r.model, job.requestId);
    const prompts = await encodePrompts(r, model, job.signal, job.chat);
    const spec = r.kind === "chat" && model.tokenizer ? outputSpec(r, model.tokenizer, job.chat, prompts[0]!, model.id) : null;
    const choices = await admit(() => addChoices(r, model, prompts, job, job.chat), job.signal);
    if (!choices) return { kind: "aborted" };
    const abort = (): void => choices.forEach((c) => model.engine.abort(c.stream.id));
    job.signal.addEventListener("abort", abort, { once: true });
    const outs = await Promise.all(choices.map((c) => c.stream.collect())).finally(() => job.signal.removeEventListener("abort", abort));
    return answer(outs, job, () => wholeBody(r, responseHeader(r, model.id), model, prompts, choices, outs, spec), usageTotals(prompts, outs, r.n));
  } catch (e) {
    if (job.signal.aborted) return { kind: "aborted" };
    if (e instanceof EngineError && e.code === "shutting_down") return { kind: "shutdown" };
    const err = toApiError(e, ctx);
    return { kind: "response", statusCode: err.status, body: err.body() as unknown as Json, usage: null };
  }
}

function answer(outs: RequestOutput[], job: CompletionJob, body: () => Json, usage: UsageTotals): CompletionResult {
  if (job.signal.aborted) return { kind: "aborted" };
  const failed = outs.find((o) => o.finishReason === "error");
  if (failed?.errorKind === "shutdown") return { kind: "shutdown" };
  if (failed) {
    const e = failureError(failed, job.requestId);
    return { kind: "response", statusCode: e.status, body: e.body() as unknown as Json, usage };
  }
  return { kind: "response", statusCode: 200, body: body(), usage };
}

/** Adds the request's choices, waiting while the engine's queue is full; null when aborted while waiting. */
async function admit(add: () => Choice[], signal: AbortSignal): Promise<Choice[] | null> {
  for (;;) {
    if (signal.aborted) return null;
    try {
      return add();
    } catch (e) {
      if (!(e instanceof EngineError && e.code === "queue_full")) throw e;
    }
    await new Promise((resolve) => setTimeout(resolve, QUEUE_FULL_RETRY_MS));
  }
}
