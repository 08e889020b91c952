/**
 * The one configuration object of an engine, from CLI flag to scheduler.
 * A knob is added here (field, default, flag) and read where it is used;
 * `weft serve` builds its flags from ENGINE_FLAGS, and the manager, engine
 * and scheduler all take this same object.
 */
export interface EngineConfig {
  /** Tokens per KV block. */
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
  /**
   * Prompt tokens per step for LOW-priority (batch) requests, all of them together. 32: a
   * step in flight when interactive work arrives is then about one decode step long, not a
   * long prefill chunk; decode rows are not capped, so batch throughput barely changes.
   */
  lowPriorityPrefillTokens: number;
  /**
   * LOW-priority rows per step while interactive (HIGH/NORMAL) work is about: running, waiting,
   * or finished less than interactiveWindowMs ago (0: no cap). 2: on a CPU a step's length grows
   * with its rows, and a newcomer's first token waits for the step in flight; a few batch rows
   * cost little more than the weights' one read, so interactive TTFT stays near its idle value
   * while the batch still moves (the oldest running lines first).
   */
  lowPriorityRowsWhileInteractive: number;
  /** How long after interactive work the LOW row cap stays on: a chat's next turn comes within seconds. */
  interactiveWindowMs: number;
  enablePrefixCaching: boolean;
  /** Priority gained per second of waiting. */
  agingRate: number;
  /** Fair share between tenants: a tenant's own backlog delays its later requests (fair-share.ts). */
  fairShare: boolean;
  /** Waiting sequences beyond this are refused (queue_full). */
  maxWaitingRequests: number;
  /** Waiting sequences one tenant may hold (0: no cap beyond the tier's share). */
  maxWaitingPerTenant: number;
  /** Caps the model's context length (0: the model's own). */
  maxModelLen: number;
  /**
   * Compute mode of the forward pass (vLLM's --dtype). float32: the exact reference path.
   * bfloat16: linear-layer inputs rounded to bf16, fp32 accumulation, as transformers in bf16.
   * auto (the default): bfloat16 where the CPU has AVX512_BF16 or AMX-BF16, else float32.
   */
  dtype: "auto" | "float32" | "bfloat16";
  /**
   * The KV cache's element (vLLM's --kv-cache-dtype). bfloat16 and float16 hold twice the
   * tokens in the same kvCacheMemory; auto (the default) follows the resolved dtype.
   */
  kvCacheDtype: "auto" | "float32" | "bfloat16" | "float16";
  /** Where the model runs: auto (the default) is CUDA when the addon has it and a GPU is visible, else the CPU. */
  device: "auto" | "cpu" | "cuda";
  /**
   * On CUDA, the share of the GPU's memory this process may fill (vLLM's flag): weights, activations
   * and the KV pool, which gets what is left. 0 (the default): the pool is --kv-cache-memory bytes.
   */
  gpuMemoryUtilization: number;
  /**
   * Decode steps run back to back in one native call while every running request is decoding
   * (vLLM's --num-scheduler-steps, multi-step scheduling): each step's token feeds the next
   * without a return to the event loop, so the host's share of a step (building it, the call,
   * the hand-back) is paid once per run. 1 (the default): one step a call. A request that
   * arrives meanwhile waits for the run to end, and a run's steps past a request's stop are
   * computed and dropped.
   */
  numSchedulerSteps: number;
}

export const DEFAULT_ENGINE_CONFIG: EngineConfig = {
  blockSize: 32,
  kvCacheMemory: 2 * 1024 ** 3,
  maxNumSeqs: 32,
  maxNumBatchedTokens: 256,
  lowPriorityPrefillTokens: 32,
  lowPriorityRowsWhileInteractive: 2,
  interactiveWindowMs: 2000,
  enablePrefixCaching: true,
  agingRate: 0.1,
  fairShare: true,
  maxWaitingRequests: 1024,
  maxWaitingPerTenant: 256,
  maxModelLen: 0,
  dtype: "auto",
  kvCacheDtype: "auto",
  device: "auto",
  gpuMemoryUtilization: 0,
  numSchedulerSteps: 1,
};

/** What an engine learns from its model and KV plan, as opposed to what it is configured with. */
export interface ModelLimits {
  /** The context length served (the model's, capped by config and by what the KV pool holds). */
  maxModelLen: number;
  numBlocks: number;
  vocabSize: number;
  eosTokenIds: readonly number[];
}

export interface EngineFlag {
  key: keyof EngineConfig;
  /** Commander flag syntax. */
  flag: string;
  description: string;
  kind: "int" | "number" | "negatable" | "choice";
  /** Smallest accepted value (int and number flags). */
  min?: number;
  /** Largest accepted value (int and number flags). */
  max?: number;
  /** The accepted values (choice flags). */
  choices?: readonly string[];
}

export const ENGINE_FLAGS: readonly EngineFlag[] = [
  { key: "blockSize", flag: "--block-size <n>", description: "tokens per KV block", kind: "int", min: 1 },
  { key: "kvCacheMemory", flag: "--kv-cache-memory <bytes>", description: "KV cache bytes per model", kind: "int", min: 1 },
  { key: "maxNumSeqs", flag: "--max-num-seqs <n>", description: "sequences per step", kind: "int", min: 1 },
  { key: "maxNumBatchedTokens", flag: "--max-num-batched-tokens <n>", description: "tokens per step", kind: "int", min: 1 },
  { key: "lowPriorityPrefillTokens", flag: "--low-priority-prefill-tokens <n>", description: "prompt tokens per step for LOW-priority (batch) requests together", kind: "int", min: 1 },
  { key: "lowPriorityRowsWhileInteractive", flag: "--low-priority-rows-while-interactive <n>", description: "LOW-priority (batch) rows per step while HIGH/NORMAL work is about (0: no cap)", kind: "int", min: 0 },
  { key: "interactiveWindowMs", flag: "--interactive-window-ms <ms>", description: "how long after HIGH/NORMAL work the LOW row cap stays on", kind: "int", min: 0 },
  { key: "enablePrefixCaching", flag: "--no-enable-prefix-caching", description: "turn prefix caching off", kind: "negatable" },
  { key: "agingRate", flag: "--priority-aging-rate <r>", description: "priority gained per second of waiting", kind: "number" },
  { key: "fairShare", flag: "--no-fair-share", description: "turn fair share between tenants of one tier off (first come, first served by aging key)", kind: "negatable" },
  { key: "maxWaitingRequests", flag: "--max-waiting-requests <n>", description: "waiting sequences beyond which requests get 429", kind: "int", min: 1 },
  { key: "maxWaitingPerTenant", flag: "--max-waiting-per-tenant <n>", description: "waiting sequences one API key may hold (0: no cap)", kind: "int", min: 0 },
  { key: "maxModelLen", flag: "--max-model-len <n>", description: "cap the context length (0: the model's)", kind: "int", min: 0 },
  { key: "dtype", flag: "--dtype <dtype>", description: "compute mode: bfloat16 is fast, float32 exact; auto picks bfloat16 on CPUs with AVX512_BF16 or AMX", kind: "choice", choices: ["auto", "float32", "bfloat16"] },
  { key: "device", flag: "--device <device>", description: "where the model runs: auto is cuda when a GPU is visible (and the addon was built with CUDA), else cpu", kind: "choice", choices: ["auto", "cpu", "cuda"] },
  { key: "gpuMemoryUtilization", flag: "--gpu-memory-utilization <fraction>", description: "on cuda, the share of GPU memory to fill, the KV pool taking what weights and activations leave (0: use --kv-cache-memory)", kind: "number", min: 0, max: 1 },
  { key: "numSchedulerSteps", flag: "--num-scheduler-steps <n>", description: "decode steps run back to back in one call while every request decodes (1: one a call)", kind: "int", min: 1, max: 64 },
  { key: "kvCacheDtype", flag: "--kv-cache-dtype <dtype>", description: "KV cache element: bfloat16/float16 hold twice the tokens, float32 is exact; auto follows --dtype", kind: "choice", choices: ["auto", "float32", "bfloat16", "float16"] },
];

/** The commander option name (camelCase) a flag's value lands under. */
export function optionName(f: EngineFlag): string {
  const long = f.flag.split(" ")[0]!.replace(/^--(no-)?/, "");
  return long.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());
}

/** The engine config from parsed CLI options (commander's names), defaults for the rest. */
export function engineConfigFromOptions(opts: Record<string, unknown>): EngineConfig {
  const config: Record<string, unknown> = { ...DEFAULT_ENGINE_CONFIG };
  for (const f of ENGINE_FLAGS) if (opts[optionName(f)] !== undefined) config[f.key] = opts[optionName(f)];
  return config as unknown as EngineConfig;
}
