/**
 * The HTTP server: OpenAI's routes over the engines, with auth, one error
 * catalogue, metrics, and a graceful shutdown.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyError, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { randomBytes } from "node:crypto";
import type { EngineManager } from "../engine/engine-manager.js";
import { Priority } from "../engine/request.js";
import type { KeyStore } from "../store/database.js";
import { ApiError } from "./errors.js";
import type { Authenticator, Caller } from "./auth.js";
import { Metrics } from "./metrics.js";
import { parseChatRequest, parseCompletionRequest } from "./request-schema.js";
import { priorityName, runGeneration, type RequestSummary } from "./generation.js";
import type { RateLimiter } from "./rate-limiter.js";
import type { SseLimits } from "./sse.js";

export interface ServerOptions {
  manager: EngineManager;
  auth: Authenticator;
  store: KeyStore | null;
  logger: Logger;
  metrics: Metrics;
  /** Largest accepted request body, bytes. */
  bodyLimit: number;
  /** Require an API key on /metrics too. */
  protectMetrics: boolean;
  rateLimiter: RateLimiter;
  sseLimits: SseLimits;
}

export interface Server {
  app: FastifyInstance;
  /** Stops accepting (503), lets in-flight requests finish for up to `timeoutMs`, ends the rest with an error, closes. */
  shutdown(timeoutMs: number): Promise<void>;
}

declare module "fastify" {
  interface FastifyRequest {
    caller?: Caller;
  }
}

type Json = Record<string, unknown>;

export function buildServer(o: ServerOptions): Server {
  const app: FastifyInstance = Fastify({
    loggerInstance: o.logger as FastifyBaseLogger,
    // One line per request is logged by the generation handler, without prompt text.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: o.bodyLimit,
    genReqId: () => `req-${randomBytes(8).toString("hex")}`,
    return503OnClosing: false,
  });
  let shuttingDown = false;
  app.removeContentTypeParser("text/plain"); // JSON only: anything else is a 415

  app.addHook("onRequest", async (req) => {
    if (shuttingDown && req.url !== "/health") throw new ApiError("shutting_down", "The server is shutting down.", null, 5);
    const needsKey = req.url.startsWith("/v1/") || (o.protectMetrics && req.url === "/metrics");
    if (needsKey) req.caller = o.auth.authenticate(req.headers.authorization);
  });

  app.setErrorHandler((err: FastifyError | ApiError, req, reply) => sendError(reply, toApiError(err, req, o.logger)));
  app.setNotFoundHandler((req, reply) => sendError(reply, new ApiError("not_found", `No route for ${req.method} ${req.url.split("?")[0]}.`)));

  const generate = (kind: "chat" | "completion", batch: boolean) => async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const body = req.body;
    if (typeof body !== "object" || body === null || Array.isArray(body)) throw new ApiError("invalid_request", "The request body must be a JSON object.");
    const parsed = kind === "chat" ? parseChatRequest(body as Json) : parseCompletionRequest(body as Json);
    if (!o.manager.has(parsed.model)) throw new ApiError("model_not_found", `The model '${parsed.model}' does not exist.`, "model");
    const model = loadModel(o.manager, parsed.model);
    const caller = req.caller!;
    o.rateLimiter.admit(caller.tenant);
    const priority = batch ? Priority.LOW : caller.priority;
    const started = performance.now();
    const onDone = (s: RequestSummary): void => {
      o.rateLimiter.charge(caller.tenant, s.promptTokens + s.completionTokens);
      if (caller.keyName && o.store) o.store.recordUsage(caller.keyName, s.promptTokens, s.completionTokens);
      o.logger.info({
        id: req.id, tenant: caller.tenant, model: parsed.model, priority: priorityName(priority), prompt_tokens: s.promptTokens,
        completion_tokens: s.completionTokens, ttft_ms: s.ttftMs === null ? null : Math.round(s.ttftMs),
        duration_ms: Math.round(performance.now() - started), finish_reason: s.finishReasons.join(","),
      }, "request");
    };
    const onStall = (): void => o.logger.warn({ id: req.id, tenant: caller.tenant }, "stream reader stalled: request aborted");
    await runGeneration(parsed, { model, caller, priority, requestId: req.id, onDone, sseLimits: o.sseLimits, onStall }, reply);
  };

  app.post("/v1/chat/completions", generate("chat", false));
  app.post("/v1/completions", generate("completion", false));
  app.post("/v1/batch/chat/completions", generate("chat", true));
  app.post("/v1/batch/completions", generate("completion", true));
  app.get("/v1/models", async () => ({ object: "list", data: [...o.manager.models.keys()].map((id) => modelCard(o.manager, id)) }));
  app.get<{ Params: { id: string } }>("/v1/models/*", async (req) => {
    const id = (req.params as Record<string, string>)["*"]!;
    if (!o.manager.has(id)) throw new ApiError("model_not_found", `The model '${id}' does not exist.`, "model");
    return modelCard(o.manager, id);
  });
  app.get("/health", async (_req, reply) => (shuttingDown ? reply.code(503).send({ status: "shutting_down" }) : { status: "ok" }));
  app.get("/metrics", async (_req, reply) => reply.type(o.metrics.registry.contentType).send(await o.metrics.render()));

  return {
    app,
    async shutdown(timeoutMs) {
      shuttingDown = true;
      await o.manager.shutdown(timeoutMs);
      await app.close();
      o.auth.close();
    },
  };
}

function loadModel(manager: EngineManager, id: string): ReturnType<EngineManager["get"]> {
  try {
    return manager.get(id);
  } catch (e) {
    throw new ApiError("model_load_failed", `Model '${id}' could not be loaded: ${e instanceof Error ? e.message : String(e)}`, "model");
  }
}

function modelCard(manager: EngineManager, id: string): Json {
  const loaded = manager.engines.find((m) => m.id === id);
  return {
    id, object: "model", created: 0, owned_by: "weft",
    ...(loaded ? { max_model_len: loaded.engine.options.maxModelLen } : {}),
  };
}

function toApiError(err: FastifyError | ApiError, req: FastifyRequest, log: Logger): ApiError {
  if (err instanceof ApiError) return err;
  switch (err.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE": return new ApiError("body_too_large", "The request body is too large.");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE": return new ApiError("unsupported_media_type", "Send the body as application/json.");
    case "FST_ERR_CTP_EMPTY_JSON_BODY": return new ApiError("invalid_json", "The request body is empty.");
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH": return new ApiError("invalid_json", "The Content-Length header does not match the body.");
  }
  if (err.statusCode === 400 || err instanceof SyntaxError) return new ApiError("invalid_json", `The request body is not valid JSON: ${err.message}`);
  if (err.statusCode === 404) return new ApiError("not_found", err.message);
  if (err.statusCode === 405) return new ApiError("method_not_allowed", err.message);
  // Anything else is our fault: log it, tell the client only the request id.
  log.error({ id: req.id, err: { message: err.message, stack: err.stack } }, "internal error");
  return new ApiError("internal_error", `Internal server error (request ${req.id}).`);
}

function sendError(reply: FastifyReply, e: ApiError): FastifyReply {
  if (e.retryAfter !== undefined) void reply.header("retry-after", String(e.retryAfter));
  return reply.code(e.status).send(e.body());
}
