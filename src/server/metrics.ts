/**
 * Prometheus metrics under vLLM's names on the wire (counters end in _total),
 * so vLLM dashboards and the Gateway API inference extension's endpoint picker
 * read Weft unchanged; weft_* for the rest. Every series carries model_name.
 * Counters only ever go up: engine totals are exported as deltas per engine
 * instance, so a model unloaded and loaded again continues its counters.
 * Gauges are re-read at scrape time, so an unloaded model's gauges are gone.
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EngineObserver, EngineStats } from "../engine/engine.js";
import type { EngineManager, LoadedModel } from "../engine/engine-manager.js";
import { finishReason } from "../engine/request.js";

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320];
const ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

type EngineTotals = Pick<EngineStats, "prefixCacheQueries" | "prefixCacheHits" | "preemptions" | "agingPromotions">;
const TOTALS: readonly (keyof EngineTotals)[] = ["prefixCacheQueries", "prefixCacheHits", "preemptions", "agingPromotions"];

export class Metrics {
  readonly registry = new Registry();
  private readonly ttft: Histogram;
  private readonly itl: Histogram;
  private readonly e2e: Histogram;
  private readonly queue: Histogram;
  private readonly iterationTokens: Histogram;
  private readonly stepTime: Histogram;
  private readonly promptTokens: Counter;
  private readonly generationTokens: Counter;
  private readonly requestSuccess: Counter;
  private readonly totals: Record<keyof EngineTotals, Counter>;
  private readonly gauges: { running: Gauge; waiting: Gauge; byPriority: Gauge; usage: Gauge; cacheInfo: Gauge; loaded: Gauge };
  /** Engine totals already exported, per engine instance (a reloaded model is a new instance starting at 0). */
  private readonly exported = new WeakMap<object, EngineTotals>();

  constructor(private readonly engines: () => EngineManager | null) {
    const registers = [this.registry];
    const labelNames = ["model_name"];
    const hist = (name: string, help: string, buckets = LATENCY_BUCKETS): Histogram => new Histogram({ name, help, labelNames, buckets, registers });
    const counter = (name: string, help: string, extra: string[] = []): Counter => new Counter({ name, help, labelNames: [...labelNames, ...extra], registers });
    const gauge = (name: string, help: string, extra: string[] = []): Gauge => new Gauge({ name, help, labelNames: [...labelNames, ...extra], registers });
    this.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token");
    this.itl = hist("vllm:inter_token_latency_seconds", "Time between consecutive output tokens");
    this.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency");
    this.queue = hist("vllm:request_queue_time_seconds", "Time from arrival to first scheduling");
    this.iterationTokens = hist("vllm:iteration_tokens_total", "Tokens computed per engine step", ITERATION_TOKEN_BUCKETS);
    this.stepTime = hist("weft_step_duration_seconds", "Duration of one engine step (one forward pass)");
    this.promptTokens = counter("vllm:prompt_tokens_total", "Prompt tokens processed");
    this.generationTokens = counter("vllm:generation_tokens_total", "Tokens generated");
    this.requestSuccess = counter("vllm:request_success_total", "Finished requests by finish reason", ["finished_reason"]);
    this.totals = {
      prefixCacheQueries: counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache"),
      prefixCacheHits: counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache"),
      preemptions: counter("vllm:num_preemptions_total", "Running requests preempted for lack of KV blocks"),
      agingPromotions: counter("weft_aging_promotions_total", "Requests admitted ahead of a waiting request of better base priority, by aging"),
    };
    this.gauges = {
      running: gauge("vllm:num_requests_running", "Requests in the running batch"),
      waiting: gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled"),
      byPriority: gauge("weft_waiting_requests", "Waiting requests by base priority", ["priority"]),
      usage: gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks held by requests (cached free blocks do not count)"),
      cacheInfo: gauge("vllm:cache_config_info", "KV cache configuration", ["block_size", "num_gpu_blocks", "cache_dtype"]),
      loaded: new Gauge({ name: "weft_loaded_models", help: "Models with a live engine", registers }),
    };
  }

  /** The exposition text, with engine state read now. */
  async render(): Promise<string> {
    this.refresh();
    return this.registry.metrics();
  }

  /** The engine observer for one model. */
  observer(modelId: string): EngineObserver {
    const l = { model_name: modelId };
    return {
      timeToFirstToken: (s) => this.ttft.observe(l, s),
      interTokenLatency: (s) => this.itl.observe(l, s),
      e2eLatency: (s) => this.e2e.observe(l, s),
      queueTime: (s) => this.queue.observe(l, s),
      step: (s, rows) => {
        this.stepTime.observe(l, s);
        this.iterationTokens.observe(l, rows.prefill + rows.decode);
      },
      finished: (r) => {
        this.promptTokens.inc(l, r.promptTokenIds.length);
        this.generationTokens.inc(l, r.outputTokenIds.length);
        this.requestSuccess.inc({ ...l, finished_reason: finishReason(r.status) ?? "error" });
      },
    };
  }

  /** Exports an unloading model's last counter deltas, so its totals carry over to its next load. */
  unloaded(m: LoadedModel): void {
    this.exportTotals(m, m.engine.stats());
  }

  private exportTotals(m: LoadedModel, s: EngineStats): void {
    const l = { model_name: m.id };
    const before = this.exported.get(m.engine) ?? { prefixCacheQueries: 0, prefixCacheHits: 0, preemptions: 0, agingPromotions: 0 };
    for (const k of TOTALS) this.totals[k].inc(l, s[k] - before[k]);
    this.exported.set(m.engine, { prefixCacheQueries: s.prefixCacheQueries, prefixCacheHits: s.prefixCacheHits, preemptions: s.preemptions, agingPromotions: s.agingPromotions });
  }

  private refresh(): void {
    const g = this.gauges;
    for (const gauge of [g.running, g.waiting, g.byPriority, g.usage, g.cacheInfo]) gauge.reset();
    const list = this.engines()?.engines ?? [];
    for (const m of list) {
      const s = m.engine.stats();
      const l = { model_name: m.id };
      g.running.set(l, s.running);
      g.waiting.set(l, s.waiting);
      for (const [priority, n] of Object.entries(s.waitingByPriority)) g.byPriority.set({ ...l, priority }, n);
      g.usage.set(l, s.blocksTotal ? s.blocksUsed / s.blocksTotal : 0);
      g.cacheInfo.set({ ...l, block_size: String(m.engine.config.blockSize), num_gpu_blocks: String(s.blocksTotal), cache_dtype: m.runner.kvCacheDtype }, 1);
      this.exportTotals(m, s);
    }
    g.loaded.set(list.length);
  }
}
