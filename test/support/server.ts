/** Starts the real HTTP server in-process on a loopback port, with the tiny-qwen3 fixture and a real database. */
import assert from "node:assert/strict";
import path from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { EngineManager, DEFAULT_ENGINE_CONFIG, type EngineConfig, type ManagerHooks } from "../../src/engine/engine-manager.js";
import { managerHooks } from "../../src/commands/serve.js";
import { UsageRecorder } from "../../src/store/usage-recorder.js";
import { DEFAULT_HTTP_LIMITS, type HttpLimits } from "../../src/server/http-limits.js";
import type { ChatSettings } from "../../src/server/chat-settings.js";
import { Authenticator } from "../../src/server/auth.js";
import { buildServer, type Server } from "../../src/server/app.js";
import { Metrics } from "../../src/server/metrics.js";
import { RateLimiter, type RateLimits } from "../../src/server/rate-limiter.js";
import { DEFAULT_SSE_LIMITS, type SseLimits } from "../../src/server/sse.js";
import { KeyStore } from "../../src/store/database.js";
import { completeFixtureModel, tempDir } from "../helpers.js";

export interface TestServer {
  url: string;
  server: Server;
  manager: EngineManager;
  store: KeyStore;
  dbFile: string;
  logs: string[];
  close(): Promise<void>;
}

export interface TestServerOptions {
  engine?: Partial<EngineConfig>;
  apiKey?: string;
  bodyLimit?: number;
  protectMetrics?: boolean;
  rateLimits?: RateLimits;
  sseLimits?: SseLimits;
  /** Model directory (default: the tiny-qwen3 fixture). */
  modelDir?: string;
  /** More models by id (besides "tiny"). */
  models?: Record<string, string>;
  maxLoadedModels?: number;
  /** The HTTP edge; absent fields take the serve defaults. */
  http?: { allowedOrigins?: string[]; allowedHosts?: string[]; limits?: Partial<HttpLimits> };
  /** Reasoning and tool-call parsers, chat template override (the serve flags). */
  chat?: ChatSettings;
  /** Wraps each model's runner (fault injection). */
  wrapRunner?: ManagerHooks["wrapRunner"];
  /** Serve the Files and Batches API (files in a temp dir unless `dataDir`). */
  batch?: { dataDir?: string; maxFileBytes?: number };
}

let modelDir: string | null = null;
export function fixtureModelDir(): string {
  modelDir ??= completeFixtureModel("tiny-qwen3");
  return modelDir;
}

export async function startServer(o: TestServerOptions = {}): Promise<TestServer> {
  const logs: string[] = [];
  const sink = new Writable({ write(chunk: Buffer, _enc, cb) { logs.push(...chunk.toString().trim().split("\n")); cb(); } });
  const logger = pino({ base: undefined }, sink);
  const dbFile = path.join(tempDir(), "weft.db");
  const store = new KeyStore(dbFile);
  const models = new Map([["tiny", o.modelDir ?? fixtureModelDir()], ...Object.entries(o.models ?? {})]);
  const config: EngineConfig = { ...DEFAULT_ENGINE_CONFIG, kvCacheMemory: 64 * 2 ** 20, blockSize: 16, maxModelLen: 1024, ...o.engine };
  const metrics = new Metrics(() => manager);
  const manager: EngineManager = new EngineManager(models, config, o.maxLoadedModels ?? 2, { ...managerHooks(metrics, logger), wrapRunner: o.wrapRunner });
  const auth = new Authenticator(store, o.apiKey ?? null, logger);
  const usage = new UsageRecorder(store, { flushMs: 50, log: logger });
  const server = buildServer({
    manager, auth, usage, logger, metrics, bodyLimit: o.bodyLimit ?? 1024 * 1024, protectMetrics: o.protectMetrics ?? false,
    ...(o.chat ? { chat: o.chat } : {}),
    http: { allowedOrigins: o.http?.allowedOrigins ?? [], allowedHosts: o.http?.allowedHosts ?? [], limits: { ...DEFAULT_HTTP_LIMITS, ...o.http?.limits } },
    rateLimiter: new RateLimiter(o.rateLimits ?? { requestsPerMinute: 0, tokensPerMinute: 0 }), sseLimits: o.sseLimits ?? DEFAULT_SSE_LIMITS,
    ...(o.batch ? { batch: { dbFile, dataDir: o.batch.dataDir ?? tempDir(), maxFileBytes: o.batch.maxFileBytes ?? 200 * 2 ** 20 } } : {}),
  });
  await server.app.listen({ host: "127.0.0.1", port: 0 });
  const port = (server.app.server.address() as { port: number }).port;
  return {
    url: `http://127.0.0.1:${port}`, server, manager, store, dbFile, logs,
    async close() {
      await server.shutdown(0);
      usage.close();
      store.close();
    },
  };
}

/** A metric's value from the exposition text (first sample matching name and labels). */
export async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(name + "{") || l.startsWith(name + " "));
  if (!line) throw new Error(`metric ${name} not found`);
  return Number(line.split(" ").at(-1));
}

/** One greedy completion of "The history of" from a served model: its text and completion token count. */
export async function greedyCompletion(url: string, model: string, maxTokens: number): Promise<{ text: string; tokens: number }> {
  const res = await fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: "The history of", max_tokens: maxTokens, temperature: 0, ignore_eos: true }) });
  assert.equal(res.status, 200);
  const j = (await res.json()) as { choices: { text: string }[]; usage: { completion_tokens: number } };
  return { text: j.choices[0]!.text, tokens: j.usage.completion_tokens };
}
