/** `weft serve`: the OpenAI-compatible server. */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pino, type Logger } from "pino";
import { EngineManager, planKv, type ManagerHooks } from "../engine/engine-manager.js";
import type { EngineConfig } from "../engine/engine-config.js";
import { makeModel } from "../model/make-model.js";
import { loadCheckpoint } from "../model/checkpoint.js";
import { parseModelSpec, resolveModelSource } from "../model/registry.js";
import { Authenticator } from "../server/auth.js";
import { buildServer } from "../server/app.js";
import { Metrics } from "../server/metrics.js";
import { RateLimiter } from "../server/rate-limiter.js";
import { DEFAULT_DB_PATH, KeyStore } from "../store/database.js";
import { UsageRecorder } from "../store/usage-recorder.js";
import { DEFAULT_HTTP_LIMITS } from "../server/http-limits.js";
import type { ReasoningParserName, ChatSettings } from "../server/chat-settings.js";
import { defaultDataDir } from "../batch/file-storage.js";

export interface ServeOptions {
  host: string;
  port: number;
  model: string[];
  db: string;
  apiKey?: string;
  protectMetrics?: boolean;
  bodyLimit: number;
  maxLoadedModels: number;
  shutdownTimeout: number;
  rateLimit: number;
  rateLimitTokens: number;
  rateLimitSequences: number;
  streamStallTimeout: number;
  streamMaxBuffer: number;
  allowedOrigins: string[];
  allowedHosts: string[];
  headerTimeout: number;
  requestTimeout: number;
  keepAliveTimeout: number;
  maxConnections: number;
  /** Batch input and output files; default: a files/ folder next to the database. */
  dataDir?: string;
  maxBatchFileBytes: number;
  /** A chat template file used instead of every model's own. */
  chatTemplate?: string;
  reasoningParser: ReasoningParserName;
  toolCallParser: ChatSettings["toolCallParser"];
  maxThinkTokens: number;
  /** Every engine knob, from ENGINE_FLAGS. */
  engine: EngineConfig;
}

export const DEMO_PRESET = "qwen3-0.6b";

/** The built-in demo: a random-weight Qwen3-0.6B-shaped model, made on first use. */
function demoModel(log: pino.Logger): string {
  const dir = path.join(os.homedir(), ".cache", "weft", "models", `${DEMO_PRESET}-random`);
  if (!fs.existsSync(path.join(dir, "model.safetensors"))) {
    log.info(`creating the demo model (${DEMO_PRESET} shape, RANDOM weights) in ${dir}…`);
    makeModel({ preset: DEMO_PRESET, out: dir });
  }
  log.warn(`serving the built-in demo model: ${DEMO_PRESET} shape with RANDOM weights, so its text is gibberish. ` +
    "Serve a real checkpoint with --model ID=/path/to/hf-model-dir or --model org/name.");
  return dir;
}

async function resolveModels(specs: string[], log: pino.Logger): Promise<Map<string, string>> {
  const models = new Map<string, string>();
  if (specs.length === 0) models.set(`${DEMO_PRESET}-random`, demoModel(log));
  for (const spec of specs) {
    const { id, source } = parseModelSpec(spec);
    models.set(id, await resolveModelSource(source, { log: (m) => log.info(m) }));
  }
  return models;
}

/** How the manager reports to metrics and the log; load failures keep their detail (paths) in the log only. */
export function managerHooks(metrics: Metrics, log: Logger): ManagerHooks {
  return {
    observer: (id) => metrics.observer(id),
    onUnload: (m) => metrics.unloaded(m),
    log: (m) => log.info(m),
    logLoadFailure: (model, id, e) => log.error({ id, model, err: e instanceof Error ? { message: e.message, stack: e.stack } : String(e) }, "model load failed"),
  };
}

export async function serve(o: ServeOptions): Promise<void> {
  const log = pino({ base: undefined });
  const models = await resolveModels(o.model, log);
  const metrics = new Metrics(() => manager);
  const manager: EngineManager = new EngineManager(models, o.engine, o.maxLoadedModels, managerHooks(metrics, log));
  const store = new KeyStore(o.db);
  const auth = new Authenticator(store, o.apiKey ?? null, log);
  const usage = new UsageRecorder(store, { log });
  const server = buildServer({
    manager, auth, usage, logger: log, metrics, bodyLimit: o.bodyLimit, protectMetrics: o.protectMetrics ?? false,
    http: {
      allowedOrigins: o.allowedOrigins,
      allowedHosts: o.allowedHosts,
      limits: {
        ...DEFAULT_HTTP_LIMITS,
        headersTimeoutMs: Math.round(o.headerTimeout * 1000),
        requestTimeoutMs: Math.round(o.requestTimeout * 1000),
        keepAliveTimeoutMs: Math.round(o.keepAliveTimeout * 1000),
        maxConnections: o.maxConnections,
      },
    },
    rateLimiter: new RateLimiter({ requestsPerMinute: o.rateLimit, tokensPerMinute: o.rateLimitTokens, sequencesPerMinute: o.rateLimitSequences }),
    sseLimits: { stallTimeoutMs: o.streamStallTimeout * 1000, maxBufferedBytes: o.streamMaxBuffer },
    batch: { dbFile: o.db, dataDir: o.dataDir ?? defaultDataDir(o.db), maxFileBytes: o.maxBatchFileBytes },
    chat: {
      chatTemplate: o.chatTemplate !== undefined ? fs.readFileSync(o.chatTemplate, "utf8") : null,
      reasoningParser: o.reasoningParser,
      toolCallParser: o.toolCallParser,
      maxThinkTokens: o.maxThinkTokens,
    },
  });
  let stopping = false;
  const stop = (signal: string): void => {
    if (stopping) return;
    stopping = true;
    log.info(`${signal}: draining for up to ${o.shutdownTimeout}s`);
    server.shutdown(o.shutdownTimeout * 1000).then(() => {
      usage.close();
      store.close();
      log.info("stopped");
      process.exit(0);
    }, (e: unknown) => {
      log.error({ err: String(e) }, "shutdown failed");
      process.exit(1);
    });
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
  // Engines are created on first use; check each checkpoint's config now so a bad one fails at start.
  for (const [id, dir] of models) {
    const ckpt = loadCheckpoint(dir); // a directory or a GGUF file; a bad one fails here, at start
    const c = ckpt.config;
    const kv = planKv(c, manager.config, ckpt.weightBytes);
    log.info(`model ${id}: ${c.architecture} at ${dir}; device ${kv.device}, dtype ${kv.dtype}; context ${kv.maxModelLen} tokens; KV cache ${kv.numBlocks} blocks × ` +
      `${manager.config.blockSize} tokens, ${kv.kvCacheDtype} (${((kv.numBlocks * kv.bytesPerBlock) / 2 ** 20).toFixed(0)} MiB); engine starts on first request`);
  }
  await manager.prepare(); // tokenizers built before serving: no model load blocks the event loop on one later
  await server.app.listen({ host: o.host, port: o.port });
  log.info(`weft listening on http://${o.host}:${(server.app.server.address() as { port: number }).port} ` +
    `(models: ${[...models.keys()].join(", ")}; auth ${auth.required ? "on" : "off"}; db ${o.db === DEFAULT_DB_PATH ? "default " : ""}${o.db})`);
}
