/**
 * `weft bench`: the engine in-process, driven at fixed concurrency levels.
 * Every request generates exactly `outputLen` tokens (EOS ignored).
 */
import fs from "node:fs";
import { createModel, DEFAULT_ENGINE_CONFIG, type EngineConfig, type LoadedModel } from "../engine/engine-manager.js";
import { defaultSamplingParams } from "../engine/sampling-params.js";
import { QUEUE_SHARES } from "../engine/admission.js";
import { Priority } from "../engine/request.js";
import { machineInfo, measureRooflines, modelInfo, rooflineShare, type RooflineShare, type Rooflines } from "./machine.js";
import { attributeStep, speedup, summarize, table, type BenchResult, type RequestTiming, type StepTotals } from "./stats.js";
import type { ComputeDtype, Device } from "../runtime/native.js";
import { builtinPrompts, syntheticPrompts } from "./workload.js";
import { resolveModelSource } from "../model/registry.js";

export interface OfflineBenchOptions {
  model: string;
  concurrency: number[];
  numPrompts: number;
  promptLen?: number;
  outputLen: number;
  prefixLen?: number;
  mode: "sweep" | "compare";
  json?: string;
  kvCacheMemory?: number;
  maxNumBatchedTokens?: number;
  /** Compute mode (default: the engine's default, auto). */
  dtype?: EngineConfig["dtype"];
  /** Where the model runs (default: the engine's default, auto). */
  device?: EngineConfig["device"];
  /** Decode steps a call (--num-scheduler-steps; default: the engine's, 1). */
  numSchedulerSteps?: number;
  /** Print progress and tables (off in tests). */
  quiet?: boolean;
}

export const RESULT_COLUMNS = ["concurrency", "requests", "prompt_tokens", "completion_tokens", "wall_seconds", "decode_tokens_per_second",
  "prefill_tokens_per_second", "output_tokens_per_second", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_mean_ms",
  "e2e_p50_ms", "e2e_p99_ms", "peak_rss_mb"] as const;

/** Runs `prompts` through the engine, at most `concurrency` at a time. */
export async function runLevel(m: LoadedModel, prompts: number[][], outputLen: number, concurrency: number, steps: StepTotals): Promise<{ timings: RequestTiming[]; wall: number }> {
  const timings: RequestTiming[] = [];
  let next = 0;
  const start = performance.now() / 1000;
  const worker = async (): Promise<void> => {
    while (next < prompts.length) {
      const prompt = prompts[next++]!;
      const t: RequestTiming = { sent: performance.now() / 1000, tokenTimes: [], promptTokens: prompt.length, completionTokens: 0 };
      const params = defaultSamplingParams({ temperature: 0, maxTokens: outputLen, ignoreEos: true });
      for await (const o of m.engine.add({ promptTokenIds: prompt, params })) {
        const now = performance.now() / 1000;
        for (let i = 0; i < o.tokenIds.length; i++) t.tokenTimes.push(now);
        t.completionTokens += o.tokenIds.length;
        if (o.finished && o.finishReason !== "length") throw new Error(`bench request ended with ${o.finishReason}: ${o.error ?? ""}`);
      }
      timings.push(t);
    }
  };
  Object.assign(steps, { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 });
  await Promise.all(Array.from({ length: Math.min(concurrency, prompts.length) }, worker));
  return { timings, wall: performance.now() / 1000 - start };
}

export interface OfflineBenchReport {
  machine: ReturnType<typeof machineInfo>;
  model: ReturnType<typeof modelInfo>;
  /** The compute mode the model ran in (`auto` resolved). */
  dtype: ComputeDtype;
  /** Where the model ran. */
  device: Device;
  /**
   * The CPU's limits, measured in this run, and each result's share of the one that binds it
   * (null and empty on cuda: these are CPU rooflines).
   */
  rooflines: Rooflines | null;
  roofline_share: RooflineShare[];
  workload: Record<string, unknown>;
  results: BenchResult[];
  speedup?: number;
}

export async function offlineBench(o: OfflineBenchOptions): Promise<OfflineBenchReport> {
  const say = (s: string): void => void (o.quiet || process.stderr.write(`${s}\n`));
  const steps: StepTotals = { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 };
  const levels = o.mode === "compare" ? [1, o.numPrompts] : o.concurrency;
  const maxSeqs = Math.max(...levels);
  const m = await createModel("bench", await resolveModelSource(o.model, { log: say }), {
    ...DEFAULT_ENGINE_CONFIG, maxNumSeqs: maxSeqs, kvCacheMemory: o.kvCacheMemory ?? DEFAULT_ENGINE_CONFIG.kvCacheMemory,
    maxNumBatchedTokens: o.maxNumBatchedTokens ?? DEFAULT_ENGINE_CONFIG.maxNumBatchedTokens,
    // Compare mode queues every prompt at once, from one tenant at NORMAL priority.
    maxWaitingPerTenant: 0,
    maxWaitingRequests: Math.max(DEFAULT_ENGINE_CONFIG.maxWaitingRequests, Math.ceil(o.numPrompts / QUEUE_SHARES[Priority.NORMAL]!)),
    // Every level reruns the same prompts: caching would turn later levels' prefill into cache hits.
    // Only a prefix workload (--prefix-len) measures the cache, within each level.
    enablePrefixCaching: (o.prefixLen ?? 0) > 0,
    dtype: o.dtype ?? DEFAULT_ENGINE_CONFIG.dtype,
    device: o.device ?? DEFAULT_ENGINE_CONFIG.device,
    numSchedulerSteps: o.numSchedulerSteps ?? DEFAULT_ENGINE_CONFIG.numSchedulerSteps,
  }, { observer: () => ({ step: (s, rows) => attributeStep(steps, s, rows) }), log: say });
  const vocab = m.checkpoint.config.vocab;
  const prompts = o.promptLen
    ? syntheticPrompts({ numPrompts: o.numPrompts, promptLen: o.promptLen, prefixLen: o.prefixLen ?? 0, vocab })
    : builtinPrompts(o.numPrompts, (t) => (m.tokenizer ? m.tokenizer.encodeChat([{ role: "user", content: t }]) : syntheticPrompts({ numPrompts: 1, promptLen: 16, vocab })[0]!));
  // One warm-up request as long as the first prompt (other tokens: no prefix-cache hit for the timed
  // ones), outside the timings: it pages the weights in, sizes the buffers and loads the kernels a
  // prefill of that length runs (on CUDA an 8-token warm-up left cuBLAS's first GEMM, about 60 ms,
  // to the first timed prefill once 3- to 16-row GEMMs stopped going to cuBLAS).
  await runLevel(m, [syntheticPrompts({ numPrompts: 1, promptLen: prompts[0]!.length, vocab, seed: 7 })[0]!], 2, 1, steps);
  const device = m.runner.info().device;
  if (device === "cpu") say("measuring the machine's rooflines…");
  const rooflines = device === "cpu" ? await measureRooflines() : null;
  const results: BenchResult[] = [];
  for (const c of levels) {
    say(`concurrency ${c}: ${prompts.length} requests × ${o.outputLen} tokens…`);
    const { timings, wall } = await runLevel(m, prompts, o.outputLen, c, steps);
    results.push(summarize(c, timings, wall, steps, process.resourceUsage().maxRSS * 1024));
  }
  const dtype = m.runner.info().dtype;
  const report: OfflineBenchReport = {
    machine: machineInfo(), model: modelInfo(m.checkpoint), dtype, device, rooflines,
    roofline_share: rooflines ? results.map((r) => rooflineShare(rooflines, m.checkpoint, m.runner.info(), r)) : [],
    workload: { num_prompts: o.numPrompts, prompt_len: o.promptLen ?? "builtin", output_len: o.outputLen, prefix_len: o.prefixLen ?? 0, mode: o.mode,
      num_scheduler_steps: o.numSchedulerSteps ?? DEFAULT_ENGINE_CONFIG.numSchedulerSteps },
    results,
  };
  if (o.mode === "compare") report.speedup = speedup(results[0]!, results[1]!);
  if (!o.quiet) {
    const info = m.runner.info();
    console.log(`machine: ${report.machine.cpu}, ${report.machine.cores} cores, ` +
      (device === "cuda" ? `device cuda (${info.deviceName})` : `kernels ${report.machine.kernels}`) + `, dtype ${report.dtype}`);
    console.log(`model: ${report.model.architecture} ${report.model.layers} layers, hidden ${report.model.hidden}, ${report.model.weight_dtype}, ${report.model.weight_gb} GB`);
    if (rooflines) console.log(`rooflines: read ${rooflines.read_gb_s} GB/s, fp32 FMA ${rooflines.fp32_gflops} GFLOP/s, bf16 dot ${rooflines.bf16_dot_gflops} GFLOP/s, AMX ${rooflines.amx_gflops} GFLOP/s`);
    console.log(`workload: ${JSON.stringify(report.workload)}`);
    console.log(table(results as unknown as Record<string, unknown>[], RESULT_COLUMNS));
    if (rooflines) console.log(table(report.roofline_share as unknown as Record<string, unknown>[], ["concurrency", "decode_bandwidth_pct", "decode_compute_pct", "prefill_compute_pct"]));
    if (report.speedup !== undefined) console.log(`speedup (all ${o.numPrompts} together vs one at a time, output tok/s): ${report.speedup}×`);
  }
  if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 2));
  return report;
}
