/**
 * `npm run bench:peer`: Weft against llama.cpp (node-llama-cpp, CPU build,
 * all cores) on the same random Qwen3-0.6B checkpoint, the same prompts and
 * output lengths, N sequences decoded together, both in one invocation.
 * llama.cpp is driven in lockstep — every sequence asks for its next token in
 * the same tick — so it batches them into one decode call; the tokens of each
 * call are counted to prove it. It loads with useMmap: false and runs the
 * faster of an F16 and a BF16 GGUF.
 */
import fs from "node:fs";
import path from "node:path";
import { createModel, DEFAULT_ENGINE_CONFIG, kvBytesPerBlock } from "../engine/engine-manager.js";
import { readModelConfig as checkpointConfig } from "../model/config.js";
import { exportGguf, type GgufDType } from "../model/gguf-export.js";
import { makeModel } from "../model/make-model.js";
import { machineInfo, modelInfo, usableCores } from "./machine.js";
import { runLevel } from "./offline.js";
import { attributeStep, summarize, table, type StepTotals } from "./stats.js";
import { syntheticPrompts } from "./workload.js";

export interface PeerOptions {
  preset: string;
  dir: string;
  concurrency: number[];
  promptLen: number;
  outputLen: number;
  prefillLen: number;
  json?: string;
}

interface PeerRun {
  decodeTokensPerSecond: number;
  /** Tokens in each llama.cpp decode call during the decode phase (all equal to N when it batches). */
  tokensPerDecodeCall: number[];
}

/** node-llama-cpp's context keeps its native handle here; wrapping it lets us count the tokens of each decode call. */
interface LlamaContextInternals {
  _ctx: Record<string | symbol, unknown> & { initBatch(size: number): void };
}

async function loadPeer(gguf: string): Promise<{ llama: import("node-llama-cpp").Llama; model: import("node-llama-cpp").LlamaModel }> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, maxThreads: usableCores() });
  const model = await llama.loadModel({ modelPath: gguf, useMmap: false, gpuLayers: 0 });
  return { llama, model };
}

type PeerToken = import("node-llama-cpp").Token;

/** llama.cpp decode throughput with `n` sequences in lockstep. */
async function llamaDecode(gguf: string, prompts: number[][], outputLen: number): Promise<PeerRun> {
  const { llama, model } = await loadPeer(gguf);
  const n = prompts.length;
  const ctx = await model.createContext({
    // The context size is per sequence here: llama.cpp allocates it for each of the n sequences.
    sequences: n, contextSize: prompts[0]!.length + outputLen + 8, batchSize: Math.max(512, n), threads: usableCores(),
  });
  const sizes: number[] = [];
  const internals = ctx as unknown as LlamaContextInternals;
  const inner = internals._ctx;
  internals._ctx = new Proxy(inner, {
    get(target, prop) {
      if (prop === "initBatch") return (size: number) => (sizes.push(size), target.initBatch(size));
      const v = target[prop];
      return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
  try {
    const gens = prompts.map((p) => ctx.getSequence().evaluate(p as PeerToken[], { temperature: 0 })[Symbol.asyncIterator]());
    await Promise.all(gens.map((g) => g.next())); // prompts, and each sequence's first token
    const decodeStart = sizes.length;
    const t0 = performance.now();
    for (let step = 1; step < outputLen; step++) await Promise.all(gens.map((g) => g.next()));
    const seconds = (performance.now() - t0) / 1000;
    await Promise.all(gens.map((g) => g.return?.()));
    return { decodeTokensPerSecond: (n * (outputLen - 1)) / seconds, tokensPerDecodeCall: sizes.slice(decodeStart) };
  } finally {
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
  }
}

async function llamaPrefill(gguf: string, prompt: number[]): Promise<number> {
  const { llama, model } = await loadPeer(gguf);
  const ctx = await model.createContext({ sequences: 1, contextSize: prompt.length + 16, batchSize: prompt.length, threads: usableCores() });
  try {
    const it = ctx.getSequence().evaluate(prompt as PeerToken[], { temperature: 0 })[Symbol.asyncIterator]();
    const t0 = performance.now();
    await it.next();
    const tps = prompt.length / ((performance.now() - t0) / 1000);
    await it.return?.();
    return tps;
  } finally {
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
  }
}

export async function peerBench(o: PeerOptions): Promise<void> {
  const say = (s: string): void => void process.stderr.write(`${s}\n`);
  const modelDir = path.join(o.dir, `${o.preset}-random`);
  if (!fs.existsSync(path.join(modelDir, "model.safetensors"))) {
    say(`making ${o.preset} (random bf16 weights) in ${modelDir}…`);
    makeModel({ preset: o.preset, out: modelDir });
  }
  const ggufs: Record<GgufDType, string> = { f16: path.join(o.dir, `${o.preset}-f16.gguf`), bf16: path.join(o.dir, `${o.preset}-bf16.gguf`) };
  for (const [dtype, file] of Object.entries(ggufs) as [GgufDType, string][]) {
    if (!fs.existsSync(file)) {
      say(`exporting ${file}…`);
      exportGguf(modelDir, file, dtype);
    }
  }
  const steps: StepTotals = { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 };
  const maxN = Math.max(...o.concurrency);
  const m = await createModel("weft", modelDir, {
    ...DEFAULT_ENGINE_CONFIG, maxNumSeqs: maxN, maxNumBatchedTokens: Math.max(o.prefillLen, DEFAULT_ENGINE_CONFIG.maxNumBatchedTokens),
    kvCacheMemory: kvBytesPerBlock(checkpointConfig(modelDir), 32) * (Math.ceil((o.promptLen + o.outputLen) / 32) * maxN + Math.ceil(o.prefillLen / 32) + 2),
    enablePrefixCaching: false,
  }, { observer: () => ({ step: (s, rows) => attributeStep(steps, s, rows) }), log: say });
  const vocab = m.checkpoint.config.vocab;
  const prefillPrompt = syntheticPrompts({ numPrompts: 1, promptLen: o.prefillLen, vocab, seed: 99 })[0]!;
  await runLevel(m, [prefillPrompt.slice(0, 16)], 2, 1, steps); // warm-up

  const rows: Record<string, unknown>[] = [];
  for (const n of o.concurrency) {
    const prompts = syntheticPrompts({ numPrompts: n, promptLen: o.promptLen, vocab, seed: n });
    say(`concurrency ${n}: Weft…`);
    const { timings, wall } = await runLevel(m, prompts, o.outputLen, n, steps);
    const weft = summarize(n, timings, wall, steps, process.resourceUsage().maxRSS * 1024);
    const peer: Partial<Record<GgufDType, PeerRun>> = {};
    for (const dtype of ["f16", "bf16"] as const) {
      say(`concurrency ${n}: llama.cpp ${dtype}…`);
      peer[dtype] = await llamaDecode(ggufs[dtype], prompts, o.outputLen);
    }
    const best = (peer.f16!.decodeTokensPerSecond >= peer.bf16!.decodeTokensPerSecond ? "f16" : "bf16") as GgufDType;
    const calls = peer[best]!.tokensPerDecodeCall;
    const row = {
      concurrency: n, weft_decode_tok_s: weft.decode_tokens_per_second, llama_cpp_decode_tok_s: Math.round(peer[best]!.decodeTokensPerSecond * 100) / 100,
      llama_cpp_gguf: best, llama_cpp_f16_tok_s: Math.round(peer.f16!.decodeTokensPerSecond * 100) / 100,
      llama_cpp_bf16_tok_s: Math.round(peer.bf16!.decodeTokensPerSecond * 100) / 100,
      llama_cpp_tokens_per_decode_call: `${Math.min(...calls)}–${Math.max(...calls)}`,
      ratio: Math.round(((weft.decode_tokens_per_second ?? 0) / peer[best]!.decodeTokensPerSecond) * 100) / 100,
      weft_output_tok_s: weft.output_tokens_per_second,
    };
    rows.push(row);
    say(JSON.stringify(row));
  }
  say(`prefill ${o.prefillLen} tokens: Weft…`);
  const pre = await runLevel(m, [prefillPrompt], 1, 1, steps);
  const weftPrefill = summarize(1, pre.timings, pre.wall, steps, 0).prefill_tokens_per_second ?? 0;
  const peerPrefill = { f16: 0, bf16: 0 };
  for (const dtype of ["f16", "bf16"] as const) {
    say(`prefill ${o.prefillLen} tokens: llama.cpp ${dtype}…`);
    peerPrefill[dtype] = await llamaPrefill(ggufs[dtype], prefillPrompt);
  }
  const bestPrefill = Math.max(peerPrefill.f16, peerPrefill.bf16);
  const report = {
    machine: machineInfo(), model: modelInfo(m.checkpoint), dtype: m.runner.info().dtype,
    workload: { prompt_len: o.promptLen, output_len: o.outputLen, prefill_len: o.prefillLen, note: "decode tok/s = tokens after each sequence's first / decode-phase time" },
    decode: rows,
    prefill: { weft_tok_s: weftPrefill, llama_cpp_f16_tok_s: Math.round(peerPrefill.f16 * 100) / 100, llama_cpp_bf16_tok_s: Math.round(peerPrefill.bf16 * 100) / 100, ratio: Math.round((weftPrefill / bestPrefill) * 100) / 100 },
  };
  console.log(`machine: ${report.machine.cpu}, ${report.machine.cores} cores; Weft kernels ${report.machine.kernels}, dtype ${report.dtype}`);
  console.log(`model: ${o.preset} (random weights), ${report.model.weight_dtype}, ${report.model.weight_gb} GB; prompts ${o.promptLen} tokens, ${o.outputLen} generated each`);
  console.log(table(rows, Object.keys(rows[0]!)));
  console.log(`prefill of one ${o.prefillLen}-token prompt: Weft ${weftPrefill} tok/s, llama.cpp f16 ${report.prefill.llama_cpp_f16_tok_s} / bf16 ${report.prefill.llama_cpp_bf16_tok_s} tok/s, ratio ${report.prefill.ratio}`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 2));
}
