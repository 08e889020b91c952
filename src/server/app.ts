/**
 * The HTTP server: OpenAI's routes over the engines. Protection is decided
 * where routing is decided: each route declares its `access` in its route
 * config, and the auth hook reads the matched route's config, never the URL
 * text. A request that matches no route is treated as needing a key.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import type { Logger } from "pino";
import { randomBytes } from "node:crypto";
import type { EngineManager } from "../engine/engine-manager.js";
import { Priority } from "../engine/request.js";
import { ApiError, apiError, toApiError } from "./errors.js";
import type { Authenticator, Caller } from "./auth.js";
import type { Metrics } from "./metrics.js";
import { parseChatRequest, parseCompletionRequest } from "./request-schema.js";
import { runGeneration } from "./generation.js";
import { priorityName } from "./engine-requests.js";
import type { RateLimiter } from "./rate-limiter.js";
import type { SseLimits } from "./sse.js";
import type { UsageSink } from "./generation.js";
import { installCors } from "./cors.js";
import { installHostCheck } from "./host-check.js";
import { httpServerOptions, installHttpLimits, unroutedError, type HttpLimits } from "./http-limits.js";
import { registerBatchApi, type BatchOptions } from "../batch/batch-api.js";
import { DEFAULT_CHAT_SETTINGS, type ChatSettings } from "./chat-settings.js";
import { installTokenizeRoutes } from "./tokenize-routes.js";

/** The HTTP edge: browsers' access and the limits on clients (see cors.ts, host-check.ts, http-limits.ts). */
export interface HttpEdgeOptions {
  /** Origins allowed to call from a browser (CORS), such as https://app.example.com; "*" for any. */
  allowedOrigins: readonly string[];
  /** Host names answered besides localhost and IP literals (DNS-rebinding check); "*" for any. */
  allowedHosts: readonly string[];
  limits: HttpLimits;
}

export interface ServerOptions {
  manager: EngineManager;
  auth: Authenticator;
  /** Where finished requests' usage goes (never blocks the request). */
  usage: UsageSink | null;
  logger: Logger;
  metrics: Metrics;
  /** Largest accepted request body, bytes. */
  bodyLimit: number;
  /** Require an API key on /metrics too. */
  protectMetrics: boolean;
  rateLimiter: RateLimiter;
  sseLimits: SseLimits;
  http: HttpEdgeOptions;
  /** The Files and Batches API (src/batch/); absent: not served. */
  batch?: BatchOptions;
  /** --chat-template, --reasoning-parser, --tool-call-parser; absent: the defaults. */
  chat?: ChatSettings;
}

export interface Server {
  app: FastifyInstance;
  /** Stops accepting (503), lets in-flight requests finish for up to `timeoutMs`, ends the rest with an error, closes. */
  shutdown(timeoutMs: number): Promise<void>;
}

/** Who may reach a route: anyone, API-key holders, or (metrics) key holders when --protect-metrics is on. */
export type Access = "public" | "key" | "metrics";

declare module "fastify" {
  interface FastifyRequest {
    caller?: Caller;
  }
  interface FastifyContextConfig {
    access?: Access;
    /** Answered while the server drains (health checks). */
    duringShutdown?: boolean;
  }
}

type Json = Record<string, unknown>;

export function buildServer(o: ServerOptions): Server {
  const app: FastifyInstance = Fastify({
    ...httpServerOptions(o.http.limits),
    loggerInstance: o.logger as FastifyBaseLogger,
    // One line per request is logged by the generation handler, without prompt text.
    logController: new LogController({ disableRequestLogging: true }),
    bodyLimit: o.bodyLimit,
    genReqId: () => `req-${randomBytes(8).toString("hex")}`,
    return503OnClosing: false,
    // Malformed URLs (bad percent-encoding) answer in OpenAI's shape too.
    frameworkErrors: (err, req, reply) => sendError(reply, toApiError(err, errorContext(req, o.logger))),
  });
  let shuttingDown = false;
  app.removeContentTypeParser("text/plain"); // JSON only: anything else is a 415
  // Order matters: limits, Host, CORS preflight, then auth.
  installHttpLimits(app, o.http.limits);
  installHostCheck(app, { allowedHosts: o.http.allowedHosts, authRequired: () => o.auth.required });
  installCors(app, o.http.allowedOrigins);

  app.addHook("onRequest", async (req, reply) => {
    const config = req.routeOptions.config;
    if (shuttingDown && !config.duringShutdown) throw apiError("shutting_down", {});
    if (needsKey(config.access ?? "key", o.protectMetrics)) req.caller = o.auth.authenticate(req.headers.authorization);
    reply.raw.setHeader("x-request-id", req.id); // on the raw response, so streams (hijacked replies) carry it too
  });

  app.setErrorHandler((err, req, reply) => sendError(reply, toApiError(err, errorContext(req, o.logger))));
  app.setNotFoundHandler((req, reply) => sendError(reply, unroutedError(req)));

  const generate = (kind: "chat" | "completion", batch: boolean) => async (req: FastifyRequest, reply: FastifyReply): Promise<void> => {
    const caller = callerOf(req);
    const admission = o.rateLimiter.admitRequest(caller.tenant);
    const body = req.body;
    if (typeof body !== "object" || body === null || Array.isArray(body)) throw apiError("invalid_request", { param: "body", detail: "must be a JSON object" });
    const parsed = kind === "chat" ? parseChatRequest(body as Json) : parseCompletionRequest(body as Json);
    const priority = batch ? Priority.LOW : caller.priority;
    const model = await o.manager.acquire(parsed.model, req.id);
    await runGeneration(parsed, {
      model, caller, priority, requestId: req.id, admission, log: o.logger, usage: o.usage, sseLimits: o.sseLimits,
      logPriority: priorityName(priority), chat: o.chat ?? DEFAULT_CHAT_SETTINGS,
    }, reply);
  };

  const key = { config: { access: "key" as const } };
  app.post("/v1/chat/completions", key, generate("chat", false));
  app.post("/v1/completions", key, generate("completion", false));
  app.post("/v1/batch/chat/completions", key, generate("chat", true));
  app.post("/v1/batch/completions", key, generate("completion", true));
  installTokenizeRoutes(app, o.manager, o.chat ?? DEFAULT_CHAT_SETTINGS);
  app.get("/v1/models", key, async () => ({ object: "list", data: [...o.manager.models.keys()].map((id) => o.manager.card(id)) }));
  app.get("/v1/models/*", key, async (req) => o.manager.card((req.params as Record<string, string>)["*"] ?? ""));
  app.get("/health", { config: { access: "public", duringShutdown: true } }, async (_req, reply) =>
    (shuttingDown ? reply.code(503).send({ status: "shutting_down" }) : { status: "ok" }));
  app.get("/metrics", { config: { access: "metrics" } }, async (_req, reply) => reply.type(o.metrics.registry.contentType).send(await o.metrics.render()));

  const batchApi = o.batch ? registerBatchApi(app, { ...o.batch, manager: o.manager, usage: o.usage, log: o.logger, chat: o.chat ?? DEFAULT_CHAT_SETTINGS }) : null;
  return {
    app,
    async shutdown(timeoutMs) {
      shuttingDown = true;
      batchApi?.stop(); // before the engines: no batch line may reload a model
      await o.manager.shutdown(timeoutMs);
      await app.close();
      o.auth.close();
    },
  };
}

function needsKey(access: Access, protectMetrics: boolean): boolean {
  return access === "key" || (access === "metrics" && protectMetrics);
}

/** The authenticated caller; every generation route is `access: "key"`, so the hook has set it. */
function callerOf(req: FastifyRequest): Caller {
  if (!req.caller) throw new Error(`route ${req.routeOptions.url ?? "?"} reached without an authenticated caller`);
  return req.caller;
}

export function errorContext(req: FastifyRequest, log: Logger): { requestId: string; logFault: (f: Record<string, unknown>, m: string) => void } {
  return { requestId: req.id, logFault: (fields, msg) => log.error(fields, msg) };
}

function sendError(reply: FastifyReply, e: ApiError): FastifyReply {
  if (e.retryAfter !== undefined) void reply.header("retry-after", String(e.retryAfter));
  return reply.code(e.status).send(e.body());
}
