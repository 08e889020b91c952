/**
 * Engines per model, loaded on first use off the event loop; past
 * `maxLoadedModels` the least recently used idle one is unloaded and its
 * native memory freed at once; a model that fails to load is reported as
 * such; shutdown drains them all.
 */
import fs from "node:fs";
import path from "node:path";
import { loadCheckpoint, type Checkpoint } from "../model/checkpoint.js";
import { TextTokenizer } from "../model/tokenizer.js";
import { kvElementBytes, ModelRunner, resolveDevice, resolveDtype, resolveKvCacheDtype } from "../runtime/model-runner.js";
import { loadNative } from "../runtime/native.js";
import type { ComputeDtype, Device, KvCacheDtype } from "../runtime/native.js";
import { EngineError } from "./errors.js";
import { DEFAULT_ENGINE_CONFIG, type EngineConfig, type ModelLimits } from "./engine-config.js";
import { PromptEncoder } from "../model/prompt-encoder.js";
import { TokenizerPool } from "../model/tokenizer-pool.js";
import { Engine, type EngineObserver, type Runner } from "./engine.js";

export { DEFAULT_ENGINE_CONFIG, type EngineConfig };

export interface LoadedModel {
  id: string;
  dir: string;
  checkpoint: Checkpoint;
  tokenizer: TextTokenizer | null;
  /** Templating and tokenization, large inputs off the event loop. */
  encoder: PromptEncoder;
  runner: ModelRunner;
  engine: Engine;
  lastUsed: number;
}

/** Bytes one KV block takes across all layers (K and V), with `elementBytes` per value (4: fp32, 2: bf16/f16). */
export function kvBytesPerBlock(c: Checkpoint["config"], blockSize: number, elementBytes: 2 | 4 = 4): number {
  return c.layers * blockSize * c.kvHeads * c.headDim * elementBytes * 2;
}

export interface KvPlan {
  device: Device;
  dtype: ComputeDtype;
  /** The context length served. */
  maxModelLen: number;
  numBlocks: number;
  /** The cache's element, --kv-cache-dtype with auto resolved. */
  kvCacheDtype: KvCacheDtype;
  bytesPerBlock: number;
}

/**
 * The KV pool's bytes: --kv-cache-memory, or on CUDA with --gpu-memory-utilization, what that share
 * of the GPU leaves after memory others hold, the weights (`weightBytes`, as stored: an upper bound
 * for their bf16 copy) and the step's activations.
 */
function kvBudget(c: Checkpoint["config"], cfg: EngineConfig, device: Device, weightBytes: number): number {
  if (device !== "cuda" || cfg.gpuMemoryUtilization <= 0) return cfg.kvCacheMemory;
  const gpu = loadNative().cudaDevices()[0]!;
  const rowBytes = 4 * (3 * c.hidden + 3 * c.intermediate + (c.heads + 2 * c.kvHeads) * c.headDim);
  const activations = 512 * 2 ** 20 + cfg.maxNumBatchedTokens * rowBytes + cfg.maxNumSeqs * c.vocab * 4;
  const budget = cfg.gpuMemoryUtilization * gpu.totalBytes - (gpu.totalBytes - gpu.freeBytes) - weightBytes - activations;
  if (budget <= 0) {
    throw new Error(`--gpu-memory-utilization ${cfg.gpuMemoryUtilization} leaves no room for the KV cache on ${gpu.name} ` +
      `(${(gpu.freeBytes / 2 ** 30).toFixed(1)} GiB free of ${(gpu.totalBytes / 2 ** 30).toFixed(1)}, weights ${(weightBytes / 2 ** 30).toFixed(1)} GiB)`);
  }
  return budget;
}

/**
 * The device, the context length served and the KV pool's size in blocks, from the config alone
 * (logged at start); `weightBytes` sizes the pool under --gpu-memory-utilization.
 */
export function planKv(c: Checkpoint["config"], cfg: EngineConfig, weightBytes = 0): KvPlan {
  const device = resolveDevice(cfg.device);
  const dtype = resolveDtype(cfg.dtype, device);
  const kvCacheDtype = resolveKvCacheDtype(cfg.kvCacheDtype, dtype);
  const bytesPerBlock = kvBytesPerBlock(c, cfg.blockSize, kvElementBytes(kvCacheDtype));
  const wanted = cfg.maxModelLen > 0 ? Math.min(cfg.maxModelLen, c.maxPositions) : c.maxPositions;
  // More blocks than every sequence at full length can use would only be prefix cache; cap there.
  const useful = Math.ceil(wanted / cfg.blockSize) * cfg.maxNumSeqs;
  const numBlocks = Math.max(1, Math.min(useful, Math.floor(kvBudget(c, cfg, device, weightBytes) / bytesPerBlock)));
  // A context the pool cannot hold even for one request is not served (a chat request's default
  // max_tokens is the rest of the context, so it must fit).
  return { device, dtype, maxModelLen: Math.min(wanted, numBlocks * cfg.blockSize), numBlocks, kvCacheDtype, bytesPerBlock };
}

/** Loads a model directory and builds its engine; the weights are mapped and packed off the event loop. */
export async function createModel(id: string, dir: string, cfg: EngineConfig, hooks: ManagerHooks = {}, pool = new TokenizerPool(),
  tokenizer = loadTokenizer(dir)): Promise<LoadedModel> {
  const checkpoint = loadCheckpoint(dir);
  const c = checkpoint.config;
  const { device, dtype, maxModelLen, numBlocks, kvCacheDtype } = planKv(c, cfg, checkpoint.weightBytes);
  const runner = await ModelRunner.create(checkpoint, { numBlocks, blockSize: cfg.blockSize, dtype: kvCacheDtype }, dtype, device);
  const eos = [...c.eosTokenIds];
  const eosTok = tokenizer?.eosToken ? tokenizer.tokenId(tokenizer.eosToken) : undefined;
  if (eosTok !== undefined && !eos.includes(eosTok)) eos.push(eosTok);
  const limits: ModelLimits = { maxModelLen, numBlocks, vocabSize: c.vocab, eosTokenIds: eos };
  const engine = new Engine(hooks.wrapRunner?.(runner, id) ?? runner, cfg, limits, tokenizer, undefined, hooks.observer?.(id) ?? {});
  const info = runner.info();
  hooks.log?.(`model ${id}: ${c.architecture}, ${c.layers} layers, hidden ${c.hidden}, vocab ${c.vocab}, ` +
    `${(checkpoint.weightBytes / 1e9).toFixed(2)} GB weights${checkpoint.quantization ? ` (${checkpoint.quantization})` : ""}; KV cache ${numBlocks} blocks × ${cfg.blockSize} tokens ` +
    `(${(info.kvCacheBytes / 2 ** 20).toFixed(0)} MiB, ${info.kvCacheDtype}); dtype ${info.dtype}, ` +
    (info.device === "cuda" ? `device cuda (${info.deviceName})` : `kernels ${info.isa}, ${info.threads} threads, device cpu`));
  return { id, dir, checkpoint, tokenizer, encoder: new PromptEncoder(dir, tokenizer, pool, maxModelLen), runner, engine, lastUsed: Date.now() };
}

/** The model directory's (or GGUF file's) tokenizer, or null when it has none. Takes about half a second for a 150k vocabulary. */
export function loadTokenizer(dir: string): TextTokenizer | null {
  return dir.endsWith(".gguf") || fs.existsSync(path.join(dir, "tokenizer.json")) ? TextTokenizer.fromDir(dir) : null;
}

/** Stops a model's engine (ending what it still runs) and frees its native memory now. */
export async function unloadModel(m: LoadedModel): Promise<void> {
  await m.engine.shutdown(0);
  await m.runner.dispose();
  m.encoder.close();
}

/** What the manager reports about one configured model. */
export type ModelState = { state: "unloaded" } | { state: "loading" } | { state: "ready"; model: LoadedModel } | { state: "failed"; at: number };

/** A model that failed to load is retried after this long. */
const LOAD_RETRY_MS = 30_000;

export interface ManagerHooks {
  observer?: (modelId: string) => EngineObserver;
  /** A model is about to be unloaded (metrics take its last totals). */
  onUnload?: (m: LoadedModel) => void;
  log?: (msg: string) => void;
  /** A load failure, with its full detail (paths included): for the server log only. */
  logLoadFailure?: (modelId: string, requestId: string, error: unknown) => void;
  /** Wraps each model's runner (tracing; tests inject faults here). */
  wrapRunner?: (runner: Runner, modelId: string) => Runner;
}

export class EngineManager {
  private readonly loaded = new Map<string, LoadedModel>();
  private readonly loading = new Map<string, Promise<LoadedModel>>();
  private readonly failed = new Map<string, number>();
  /** Worker threads shared by every model's prompt encoder. */
  readonly tokenizerPool = new TokenizerPool();
  /**
   * Tokenizers by model id, kept across unload and reload: building one blocks the event loop
   * (about 0.5 s for a 150k vocabulary), so it happens once per model, at start with `prepare`.
   */
  private readonly tokenizers = new Map<string, TextTokenizer | null>();

  constructor(
    /** Model id → directory. */
    readonly models: ReadonlyMap<string, string>,
    readonly config: EngineConfig,
    readonly maxLoadedModels = 4,
    private readonly hooks: ManagerHooks = {},
  ) {}

  has(id: string): boolean {
    return this.models.has(id);
  }

  /**
   * Builds every model's tokenizer now (at start, before serving), so no later load blocks the event
   * loop on it, and loads it in the tokenizer pool's workers too, so a first large prompt does not wait.
   */
  async prepare(): Promise<void> {
    for (const id of this.models.keys()) {
      const tok = this.tokenizer(id);
      if (tok) await this.tokenizerPool.warm(tok);
    }
  }

  private tokenizer(id: string): TextTokenizer | null {
    if (!this.tokenizers.has(id)) this.tokenizers.set(id, loadTokenizer(this.models.get(id)!));
    return this.tokenizers.get(id) ?? null;
  }

  /** The loaded engines (for metrics). */
  get engines(): LoadedModel[] {
    return [...this.loaded.values()];
  }

  state(id: string): ModelState {
    const m = this.loaded.get(id);
    if (m) return { state: "ready", model: m };
    if (this.loading.has(id)) return { state: "loading" };
    const at = this.failed.get(id);
    return at !== undefined ? { state: "failed", at } : { state: "unloaded" };
  }

  /** The model's engine, loading it if needed. A load failure's detail goes to `logLoadFailure`, never to the caller. */
  async acquire(id: string, requestId: string): Promise<LoadedModel> {
    const dir = this.models.get(id);
    if (dir === undefined) throw notFound(id);
    const m = this.loaded.get(id) ?? await this.load(id, dir, requestId);
    m.lastUsed = Date.now();
    return m;
  }

  /** The OpenAI model object for /v1/models, with Weft's load state. */
  card(id: string): Record<string, unknown> {
    if (!this.models.has(id)) throw notFound(id);
    const s = this.state(id);
    return {
      id, object: "model", created: 0, owned_by: "weft", status: s.state,
      ...this.placement(s),
      ...(s.state === "ready" ? { max_model_len: s.model.engine.limits.maxModelLen } : {}),
      ...(s.state === "ready" && s.model.checkpoint.quantization ? { quantization: s.model.checkpoint.quantization } : {}),
    };
  }

  /** Where a model runs and in which compute mode: as loaded, or as it would load now. */
  private placement(s: ModelState): { device: Device; dtype: ComputeDtype } {
    if (s.state === "ready") {
      const info = s.model.runner.info();
      return { device: info.device, dtype: info.dtype };
    }
    const device = resolveDevice(this.config.device);
    return { device, dtype: resolveDtype(this.config.dtype, device) };
  }

  async shutdown(timeoutMs: number): Promise<void> {
    await Promise.allSettled(this.loading.values());
    await Promise.all([...this.loaded.values()].map(async (m) => {
      await m.engine.shutdown(timeoutMs);
      await unloadModel(m);
    }));
    this.loaded.clear();
    await this.tokenizerPool.close();
  }

  private load(id: string, dir: string, requestId: string): Promise<LoadedModel> {
    const failedAt = this.failed.get(id);
    if (failedAt !== undefined && Date.now() - failedAt < LOAD_RETRY_MS) {
      return Promise.reject(loadFailed(id, Math.ceil((failedAt + LOAD_RETRY_MS - Date.now()) / 1000)));
    }
    let p = this.loading.get(id);
    if (!p) {
      p = this.startLoad(id, dir).finally(() => this.loading.delete(id));
      this.loading.set(id, p);
    }
    return p.catch((e: unknown) => {
      this.hooks.logLoadFailure?.(id, requestId, e);
      throw loadFailed(id, Math.ceil(LOAD_RETRY_MS / 1000));
    });
  }

  private async startLoad(id: string, dir: string): Promise<LoadedModel> {
    await this.evictIdle(id);
    try {
      const m = await createModel(id, dir, this.config, this.hooks, this.tokenizerPool, this.tokenizer(id));
      this.failed.delete(id);
      this.loaded.set(id, m);
      return m;
    } catch (e) {
      this.failed.set(id, Date.now());
      throw e;
    }
  }

  /** Makes room for `loadingId` (itself counted among the loading). */
  private async evictIdle(loadingId: string): Promise<void> {
    const others = (): number => [...this.loading.keys()].filter((k) => k !== loadingId).length;
    while (this.loaded.size + others() >= this.maxLoadedModels) {
      const idle = [...this.loaded.values()].filter((m) => m.engine.idle).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!idle) return; // all busy: go over the limit rather than fail
      this.hooks.log?.(`unloading idle model ${idle.id}`);
      this.loaded.delete(idle.id);
      this.hooks.onUnload?.(idle);
      await unloadModel(idle);
    }
  }
}

function notFound(id: string): EngineError {
  return new EngineError("model_not_found", `the model '${id}' does not exist`, "model", undefined, id);
}

function loadFailed(id: string, retryAfter: number): EngineError {
  return new EngineError("model_load_failed", `the model '${id}' could not be loaded`, "model", retryAfter, id);
}
