/**
 * Prometheus metrics under vLLM's names where they exist, so gateways that
 * route on vLLM's metrics can route to Weft; weft_* for the rest.
 */
import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { EngineObserver } from "../engine/engine.js";
import type { EngineManager } from "../engine/engine-manager.js";

const LATENCY_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320];

export class Metrics {
  readonly registry = new Registry();
  private readonly ttft: Histogram;
  private readonly itl: Histogram;
  private readonly e2e: Histogram;
  private readonly queue: Histogram;
  private readonly stepTime: Histogram;
  private readonly promptTokens: Counter;
  private readonly generationTokens: Counter;
  private readonly requestSuccess: Counter;
  /** Last counter totals seen per model, so engine totals can be exported as counters. */
  private readonly seen = new Map<string, { queries: number; hits: number; preemptions: number; promotions: number }>();

  constructor(engines: () => EngineManager | null) {
    const r = [this.registry];
    const model = ["model_name"];
    const hist = (name: string, help: string, labels = model): Histogram => new Histogram({ name, help, labelNames: labels, buckets: LATENCY_BUCKETS, registers: r });
    this.ttft = hist("vllm:time_to_first_token_seconds", "Time to first token");
    this.itl = hist("vllm:inter_token_latency_seconds", "Time between consecutive output tokens");
    this.e2e = hist("vllm:e2e_request_latency_seconds", "End-to-end request latency");
    this.queue = hist("vllm:request_queue_time_seconds", "Time from arrival to first scheduling");
    this.stepTime = hist("weft_step_duration_seconds", "Duration of one engine step (one forward pass)");
    this.promptTokens = new Counter({ name: "vllm:prompt_tokens_total", help: "Prompt tokens processed", labelNames: model, registers: r });
    this.generationTokens = new Counter({ name: "vllm:generation_tokens_total", help: "Tokens generated", labelNames: model, registers: r });
    this.requestSuccess = new Counter({ name: "vllm:request_success_total", help: "Finished requests by finish reason", labelNames: ["model_name", "finished_reason"], registers: r });

    const queries = new Counter({ name: "vllm:prefix_cache_queries", help: "Prompt tokens looked up in the prefix cache", labelNames: model, registers: r });
    const hits = new Counter({ name: "vllm:prefix_cache_hits", help: "Prompt tokens found in the prefix cache", labelNames: model, registers: r });
    const preemptions = new Counter({ name: "weft_preemptions_total", help: "Running requests preempted for lack of KV blocks", labelNames: model, registers: r });
    const promotions = new Counter({ name: "weft_aging_promotions_total", help: "Requests admitted ahead of a waiting request of better base priority, by aging", labelNames: model, registers: r });
    const running = new Gauge({ name: "vllm:num_requests_running", help: "Requests in the running batch", labelNames: model, registers: r });
    const waiting = new Gauge({ name: "vllm:num_requests_waiting", help: "Requests waiting to be scheduled", labelNames: model, registers: r });
    const byPriority = new Gauge({ name: "weft_waiting_requests", help: "Waiting requests by base priority", labelNames: ["model_name", "priority"], registers: r });
    const usage = new Gauge({ name: "vllm:kv_cache_usage_perc", help: "Fraction of KV blocks held by requests (cached free blocks do not count)", labelNames: model, registers: r });
    const cacheInfo = new Gauge({ name: "vllm:cache_config_info", help: "KV cache configuration", labelNames: ["model_name", "block_size", "num_gpu_blocks"], registers: r });

    const loaded = new Gauge({ name: "weft_loaded_models", help: "Models with a live engine", registers: r });
    // Engine state is read at scrape time.
    this.refresh = () => {
      const list = engines()?.engines ?? [];
      for (const m of list) {
        const s = m.engine.stats();
        const l = { model_name: m.id };
        running.set(l, s.running);
        waiting.set(l, s.waiting);
        for (const [p, n] of Object.entries(s.waitingByPriority)) byPriority.set({ ...l, priority: p }, n);
        usage.set(l, s.blocksTotal ? s.blocksUsed / s.blocksTotal : 0);
        cacheInfo.set({ ...l, block_size: String(m.engine.options.blockSize), num_gpu_blocks: String(s.blocksTotal) }, 1);
        const prev = this.seen.get(m.id) ?? { queries: 0, hits: 0, preemptions: 0, promotions: 0 };
        queries.inc(l, s.prefixCacheQueries - prev.queries);
        hits.inc(l, s.prefixCacheHits - prev.hits);
        preemptions.inc(l, s.preemptions - prev.preemptions);
        promotions.inc(l, s.agingPromotions - prev.promotions);
        this.seen.set(m.id, { queries: s.prefixCacheQueries, hits: s.prefixCacheHits, preemptions: s.preemptions, promotions: s.agingPromotions });
      }
      loaded.set(list.length);
    };
  }

  private readonly refresh: () => void;

  /** The exposition text, with engine gauges read now. */
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
      step: (s) => this.stepTime.observe(l, s),
      finished: (r) => {
        this.promptTokens.inc(l, r.promptTokenIds.length);
        this.generationTokens.inc(l, r.outputTokenIds.length);
        const reason = ["stop", "length", "abort", "error"][r.status - 3] ?? "error";
        this.requestSuccess.inc({ ...l, finished_reason: reason });
      },
    };
  }
}
