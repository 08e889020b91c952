/**
 * `weft bench structured`: the cost of constrained decoding. N requests at once
 * under a JSON schema, then the same N unconstrained, in-process; both decode the
 * same prompt to the same token counts (each unconstrained request is held to the
 * length its constrained twin reached, EOS ignored), so only the grammar differs.
 * Reports each side's output throughput, best of the rounds, and their ratio (the target:
 * ≥ 85 %); also per CPU second, which a machine shared with other work disturbs less.
 */
import fs from "node:fs";
import { createModel, DEFAULT_ENGINE_CONFIG, unloadModel, type EngineConfig, type LoadedModel } from "../engine/engine-manager.js";
import { grammarCompiler, type Grammar } from "../engine/grammar.js";
import { defaultSamplingParams } from "../engine/sampling-params.js";
import { machineInfo, modelInfo } from "./machine.js";
import { table } from "./stats.js";

export interface StructuredBenchOptions {
  model: string;
  /** Requests decoded together. */
  concurrency: number;
  /** Most tokens per request; a constrained request may end sooner by completing its schema. */
  outputLen: number;
  /** Alternating constrained / unconstrained rounds; each side reports its best. */
  rounds: number;
  /** Sampling temperature of both sides (0: greedy, where the grammar's share of a step is largest). */
  temperature: number;
  /** A JSON schema file; absent: the built-in one. */
  schema?: string;
  dtype?: EngineConfig["dtype"];
  json?: string;
  quiet?: boolean;
}

/** A record list whose items must keep coming: long enough to reach outputLen on random weights. */
export const BUILTIN_SCHEMA = {
  type: "object",
  properties: {
    title: { type: "string" },
    people: {
      type: "array", minItems: 8,
      items: {
        type: "object",
        properties: { name: { type: "string" }, age: { type: "integer", minimum: 0, maximum: 150 }, role: { enum: ["admin", "user", "guest"] }, tags: { type: "array", items: { type: "string" } } },
        required: ["name", "age", "role", "tags"],
      },
    },
  },
  required: ["title", "people"],
};

const PROMPT = "List the people in the team as JSON: each with name, age, role and tags.";

interface Side {
  side: "json_schema" | "unconstrained";
  requests: number;
  completion_tokens: number;
  wall_seconds: number;
  output_tokens_per_second: number;
  /** The process's CPU time (every thread), which a busy machine disturbs less than wall time. */
  cpu_seconds: number;
  tokens_per_cpu_second: number;
}

/** Runs one request per entry of `lengths` at once; a grammar constrains them when given. Returns each one's token count. */
async function runSide(m: LoadedModel, prompt: number[], lengths: number[], grammar: Grammar | null, temperature: number): Promise<{ counts: number[]; wall: number; cpu: number }> {
  const start = performance.now(), cpuStart = process.cpuUsage();
  const streams = m.engine.addGroup(lengths.map((n, i) => ({
    promptTokenIds: prompt,
    // Unconstrained twins are held to the constrained length: EOS ignored, min_tokens = max_tokens.
    params: defaultSamplingParams({ temperature, seed: i, maxTokens: n, ...(grammar ? {} : { ignoreEos: true, minTokens: n }) }),
    ...(grammar ? { grammar } : {}),
  })));
  const outs = await Promise.all(streams.map((s) => s.collect()));
  const wall = (performance.now() - start) / 1000;
  const cpuUsed = process.cpuUsage(cpuStart);
  const cpu = (cpuUsed.user + cpuUsed.system) / 1e6;
  const failed = outs.find((o) => o.finishReason === "error" || o.finishReason === "abort");
  if (failed) throw new Error(`a bench request failed: ${failed.error ?? failed.finishReason}`);
  return { counts: outs.map((o) => o.tokenIds.length), wall, cpu };
}

function side(name: Side["side"], r: { counts: number[]; wall: number; cpu: number }): Side {
  const tokens = r.counts.reduce((a, b) => a + b, 0);
  const round = (x: number, digits: number): number => Math.round(x * 10 ** digits) / 10 ** digits;
  return {
    side: name, requests: r.counts.length, completion_tokens: tokens, wall_seconds: round(r.wall, 3), output_tokens_per_second: round(tokens / r.wall, 1),
    cpu_seconds: round(r.cpu, 3), tokens_per_cpu_second: round(tokens / r.cpu, 1),
  };
}

export interface StructuredBenchReport {
  machine: ReturnType<typeof machineInfo>;
  model: ReturnType<typeof modelInfo>;
  dtype: string;
  workload: Record<string, unknown>;
  results: Side[];
  /** Constrained throughput / unconstrained throughput. */
  ratio: number;
  /** The same, in tokens per CPU second. */
  cpu_ratio: number;
}

export async function structuredBench(o: StructuredBenchOptions): Promise<StructuredBenchReport> {
  const say = (s: string): void => void (o.quiet || process.stderr.write(`${s}\n`));
  const m = await createModel("bench", o.model, {
    ...DEFAULT_ENGINE_CONFIG, maxNumSeqs: o.concurrency, enablePrefixCaching: false, maxWaitingPerTenant: 0,
    dtype: o.dtype ?? DEFAULT_ENGINE_CONFIG.dtype,
  }, { log: say });
  try {
    if (!m.tokenizer) throw new Error(`${o.model} has no tokenizer, which constrained decoding needs`);
    const schema = o.schema ? fs.readFileSync(o.schema, "utf8") : JSON.stringify(BUILTIN_SCHEMA);
    const grammar = await grammarCompiler(m.tokenizer, m.engine.limits.vocabSize, m.engine.limits.eosTokenIds).compile({ type: "json_schema", schema });
    const prompt = m.tokenizer.hasChatTemplate ? m.tokenizer.encodeChat([{ role: "user", content: PROMPT }]) : m.tokenizer.encode(PROMPT);
    const full = Array.from({ length: o.concurrency }, () => o.outputLen);
    await runSide(m, prompt, full.map(() => 4), grammar, o.temperature); // warm-up: pages, buffers, the matcher's first use
    const constrained: Side[] = [], free: Side[] = [];
    for (let round = 0; round < o.rounds; round++) {
      say(`round ${round + 1}/${o.rounds}: ${o.concurrency} JSON-schema requests, then ${o.concurrency} unconstrained…`);
      const c = await runSide(m, prompt, full, grammar, o.temperature);
      const f = await runSide(m, prompt, c.counts, null, o.temperature);
      constrained.push(side("json_schema", c));
      free.push(side("unconstrained", f));
    }
    const best = (xs: Side[]): Side => xs.reduce((a, b) => (b.output_tokens_per_second > a.output_tokens_per_second ? b : a));
    const results = [best(constrained), best(free)];
    const share = (k: "output_tokens_per_second" | "tokens_per_cpu_second", of: Side[]): number => Math.max(...of.map((x) => x[k]));
    const ratio = Math.round((share("output_tokens_per_second", constrained) / share("output_tokens_per_second", free)) * 1000) / 1000;
    const cpuRatio = Math.round((share("tokens_per_cpu_second", constrained) / share("tokens_per_cpu_second", free)) * 1000) / 1000;
    const report: StructuredBenchReport = {
      machine: machineInfo(), model: modelInfo(m.checkpoint), dtype: m.runner.info().dtype,
      workload: { concurrency: o.concurrency, output_len: o.outputLen, rounds: o.rounds, prompt_tokens: prompt.length, schema: o.schema ?? "builtin", temperature: o.temperature },
      results, ratio, cpu_ratio: cpuRatio,
    };
    if (!o.quiet) {
      console.log(`machine: ${report.machine.cpu}, ${report.machine.cores} cores, kernels ${report.machine.kernels}, dtype ${report.dtype}`);
      console.log(`model: ${report.model.architecture} ${report.model.layers} layers, hidden ${report.model.hidden}, vocab ${report.model.vocab}`);
      console.log(`workload: ${JSON.stringify(report.workload)}`);
      console.log(table(results as unknown as Record<string, unknown>[], ["side", "requests", "completion_tokens", "wall_seconds", "output_tokens_per_second", "cpu_seconds", "tokens_per_cpu_second"]));
      console.log(`constrained / unconstrained throughput: ${(ratio * 100).toFixed(1)} % (target ≥ 85 %); per CPU second: ${(cpuRatio * 100).toFixed(1)} %`);
    }
    if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 2));
    return report;
  } finally {
    await unloadModel(m);
  }
}
