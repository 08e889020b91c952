/**
 * Engines per model, created on first use; the least recently used idle one
 * is unloaded past `maxLoadedModels`; shutdown drains them all.
 */
import fs from "node:fs";
import path from "node:path";
import { loadCheckpoint, type Checkpoint } from "../model/checkpoint.js";
import { TextTokenizer } from "../model/tokenizer.js";
import { ModelRunner } from "../runtime/model-runner.js";
import { Engine, type EngineObserver } from "./engine.js";

export interface EngineConfig {
  blockSize: number;
  /** Bytes of KV cache per model; sets the number of blocks. */
  kvCacheMemory: number;
  /**
   * Sequences per step. 32: on a CPU a decode step is compute-bound well before
   * this, and more only lengthens every step.
   */
  maxNumSeqs: number;
  /**
   * Tokens per step. 256: a prefill chunk this size takes a few hundred ms on a
   * small model, which bounds how long running streams stall behind a long prompt.
   */
  maxNumBatchedTokens: number;
  enablePrefixCaching: boolean;
  agingRate: number;
  maxWaitingRequests: number;
  /** Caps the model's context length (0: the model's own). */
  maxModelLen: number;
}

export const DEFAULT_ENGINE_CONFIG: EngineConfig = {
  blockSize: 32,
  kvCacheMemory: 2 * 1024 ** 3,
  maxNumSeqs: 32,
  maxNumBatchedTokens: 256,
  enablePrefixCaching: true,
  agingRate: 0.1,
  maxWaitingRequests: 1024,
  maxModelLen: 0,
};

export interface LoadedModel {
  id: string;
  dir: string;
  checkpoint: Checkpoint;
  tokenizer: TextTokenizer | null;
  runner: ModelRunner;
  engine: Engine;
  numBlocks: number;
  lastUsed: number;
}

/** Bytes one KV block takes across all layers (K and V, fp32). */
export function kvBytesPerBlock(c: Checkpoint["config"], blockSize: number): number {
  return c.layers * blockSize * c.kvHeads * c.headDim * 4 * 2;
}

/** The context length served and the KV pool's size in blocks, from the config alone (logged at start). */
export function planKv(c: Checkpoint["config"], cfg: EngineConfig): { maxModelLen: number; numBlocks: number } {
  const wanted = cfg.maxModelLen > 0 ? Math.min(cfg.maxModelLen, c.maxPositions) : c.maxPositions;
  // More blocks than every sequence at full length can use would only be prefix cache; cap there.
  const useful = Math.ceil(wanted / cfg.blockSize) * cfg.maxNumSeqs;
  const numBlocks = Math.max(1, Math.min(useful, Math.floor(cfg.kvCacheMemory / kvBytesPerBlock(c, cfg.blockSize))));
  // A context the pool cannot hold even for one request is not served (a chat request's default
  // max_tokens is the rest of the context, so it must fit).
  return { maxModelLen: Math.min(wanted, numBlocks * cfg.blockSize), numBlocks };
}

/** Loads a model directory and builds its engine. */
export function createModel(id: string, dir: string, cfg: EngineConfig, observer: EngineObserver = {}, log: (msg: string) => void = () => {}): LoadedModel {
  const checkpoint = loadCheckpoint(dir);
  const c = checkpoint.config;
  const tokenizer = fs.existsSync(path.join(dir, "tokenizer.json")) ? TextTokenizer.fromDir(dir) : null;
  const { maxModelLen, numBlocks } = planKv(c, cfg);
  const runner = new ModelRunner(checkpoint, { numBlocks, blockSize: cfg.blockSize });
  const eos = [...c.eosTokenIds];
  const eosTok = tokenizer?.eosToken ? tokenizer.tokenId(tokenizer.eosToken) : undefined;
  if (eosTok !== undefined && !eos.includes(eosTok)) eos.push(eosTok);
  const engine = new Engine(runner, {
    numBlocks, blockSize: cfg.blockSize, maxNumSeqs: cfg.maxNumSeqs, maxNumBatchedTokens: cfg.maxNumBatchedTokens,
    maxModelLen, vocabSize: c.vocab, eosTokenIds: eos, enablePrefixCaching: cfg.enablePrefixCaching,
    agingRate: cfg.agingRate, maxWaitingRequests: cfg.maxWaitingRequests,
  }, tokenizer, undefined, observer);
  const info = runner.info();
  log(`model ${id}: ${c.architecture}, ${c.layers} layers, hidden ${c.hidden}, vocab ${c.vocab}, ` +
    `${(checkpoint.weightBytes / 1e9).toFixed(2)} GB weights; KV cache ${numBlocks} blocks × ${cfg.blockSize} tokens ` +
    `(${(info.kvCacheBytes / 2 ** 20).toFixed(0)} MiB); kernels ${info.isa}, ${info.threads} threads`);
  return { id, dir, checkpoint, tokenizer, runner, engine, numBlocks, lastUsed: Date.now() };
}

export class EngineManager {
  private readonly loaded = new Map<string, LoadedModel>();

  constructor(
    /** Model id → directory. */
    readonly models: ReadonlyMap<string, string>,
    readonly config: EngineConfig,
    readonly maxLoadedModels = 4,
    private readonly observer: (modelId: string) => EngineObserver = () => ({}),
    private readonly log: (msg: string) => void = () => {},
  ) {}

  has(id: string): boolean {
    return this.models.has(id);
  }

  /** The loaded engines (for metrics). */
  get engines(): LoadedModel[] {
    return [...this.loaded.values()];
  }

  /** The model's engine, loading it if needed. */
  get(id: string): LoadedModel {
    let m = this.loaded.get(id);
    if (!m) {
      const dir = this.models.get(id);
      if (!dir) throw new Error(`unknown model ${id}`);
      this.evictIdle();
      m = createModel(id, dir, this.config, this.observer(id), this.log);
      this.loaded.set(id, m);
    }
    m.lastUsed = Date.now();
    return m;
  }

  async shutdown(timeoutMs: number): Promise<void> {
    await Promise.all([...this.loaded.values()].map((m) => m.engine.shutdown(timeoutMs)));
    this.loaded.clear();
  }

  private evictIdle(): void {
    while (this.loaded.size >= this.maxLoadedModels) {
      const idle = [...this.loaded.values()].filter((m) => m.engine.idle).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (!idle) return; // all busy: go over the limit rather than fail
      this.log(`unloading idle model ${idle.id}`);
      this.loaded.delete(idle.id);
    }
  }
}
