/**
 * `npm run bench:peer`: Weft against llama.cpp (node-llama-cpp, CPU build,
 * all cores) on the same random Qwen3-0.6B checkpoint, the same prompts and
 * output lengths, N sequences decoded together, both in one invocation.
 * llama.cpp is driven in lockstep — every sequence asks for its next token in
 * the same tick — so it batches them into one decode call; the tokens of each
 * call are counted to prove it. It loads with useMmap: false and runs the
 * faster of an F16 and a BF16 GGUF. With `--quant`, both run the same GGUF
 * file, quantized by llama.cpp's own quantizer.
 */
import fs from "node:fs";
import path from "node:path";
import { createModel, DEFAULT_ENGINE_CONFIG, kvBytesPerBlock, unloadModel, type LoadedModel } from "../engine/engine-manager.js";
import { readModelConfig as checkpointConfig } from "../model/config.js";
import { exportGguf, type GgufDType } from "../model/gguf-export.js";
import { readGguf } from "../model/gguf.js";
import { ggufModelConfig } from "../model/gguf-model.js";
import { makeModel } from "../model/make-model.js";
import { llamaQuantized, type LlamaQuantType } from "./llama-quantize.js";
import { fileMatrixBytes, machineInfo, measureRooflines, modelInfo, rooflineShare, usableCores } from "./machine.js";
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
  /** llama.cpp file types: run both engines on the same quantized GGUF of each (instead of Weft's checkpoint against F16/BF16 GGUFs). */
  quant?: LlamaQuantType[];
  /** Weft's decode steps a call (--num-scheduler-steps; default: the engine's, 1). */
  numSchedulerSteps?: number;
  json?: string;
}

export interface PeerRun {
  decodeTokensPerSecond: number;
  /** Every sequence's output tokens over the whole run, the prompts' evaluation included. */
  outputTokensPerSecond: number;
  /** Tokens in each llama.cpp decode call during the decode phase (all equal to N when it batches). */
  tokensPerDecodeCall: number[];
}

/** node-llama-cpp's context keeps its native handle here; wrapping it lets us count the tokens of each decode call. */
interface LlamaContextInternals {
  _ctx: Record<string | symbol, unknown> & { initBatch(size: number): void };
}

/** Where llama.cpp runs: its CPU build on every core here, or its CUDA build with every layer on the GPU. */
export type PeerDevice = "cpu" | "cuda";

async function loadPeer(gguf: string, device: PeerDevice): Promise<{ llama: import("node-llama-cpp").Llama; model: import("node-llama-cpp").LlamaModel }> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const gpu = device === "cuda" ? "cuda" : false;
  // The prebuilt binaries only; a CUDA build that does not load fails here rather than falling back to the CPU.
  const llama = await getLlama({ gpu, ...(gpu ? { build: "never" as const } : {}), logLevel: LlamaLogLevel.error, maxThreads: usableCores() });
  const model = await llama.loadModel({ modelPath: gguf, useMmap: false, gpuLayers: gpu ? "max" : 0 });
  return { llama, model };
}

type PeerToken = import("node-llama-cpp").Token;

/** llama.cpp decode throughput with `n` sequences in lockstep. */
export async function llamaDecode(gguf: string, prompts: number[][], outputLen: number, device: PeerDevice = "cpu"): Promise<PeerRun> {
  const { llama, model } = await loadPeer(gguf, device);
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
    const start = performance.now();
    const gens = prompts.map((p) => ctx.getSequence().evaluate(p as PeerToken[], { temperature: 0 })[Symbol.asyncIterator]());
    await Promise.all(gens.map((g) => g.next())); // prompts, and each sequence's first token
    const decodeStart = sizes.length;
    const t0 = performance.now();
    for (let step = 1; step < outputLen; step++) await Promise.all(gens.map((g) => g.next()));
    const end = performance.now();
    await Promise.all(gens.map((g) => g.return?.()));
    return {
      decodeTokensPerSecond: (n * (outputLen - 1)) / ((end - t0) / 1000), outputTokensPerSecond: (n * outputLen) / ((end - start) / 1000),
      tokensPerDecodeCall: sizes.slice(decodeStart),
    };
  } finally {
    await ctx.dispose();
    await model.dispose();
    await llama.dispose();
  }
}

async function llamaPrefill(gguf: string, prompt: number[]): Promise<number> {
  const { llama, model } = await loadPeer(gguf, "cpu");
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

type Say = (s: string) => void;

/** The random checkpoint of the preset and its F16 GGUF (and BF16 when asked), made once in `o.dir`. */
function benchFiles(o: PeerOptions, say: Say, dtypes: readonly GgufDType[]): { modelDir: string; ggufs: Partial<Record<GgufDType, string>> } {
  const modelDir = path.join(o.dir, `${o.preset}-random`);
  if (!fs.existsSync(path.join(modelDir, "model.safetensors"))) {
    say(`making ${o.preset} (random bf16 weights) in ${modelDir}…`);
    makeModel({ preset: o.preset, out: modelDir });
  }
  const ggufs: Partial<Record<GgufDType, string>> = {};
  for (const dtype of dtypes) {
    const file = (ggufs[dtype] = path.join(o.dir, `${o.preset}-${dtype}.gguf`));
    if (!fs.existsSync(file)) {
      say(`exporting ${file}…`);
      exportGguf(modelDir, file, dtype);
    }
  }
  return { modelDir, ggufs };
}

/** What the engine's observer hears of each step: its seconds and its rows. */
type StepObserver = (seconds: number, rows: { prefill: number; decode: number }) => void;

/**
 * Weft's engine on `model` (a checkpoint directory or GGUF file), sized for the bench's sequences and
 * prefill, on the CPU as llama.cpp is here (`auto` would pick a GPU on a CUDA build); `step` hears of
 * each step (scripts/engine-split.mjs runs the same engine).
 */
export async function loadWeft(model: string, o: Pick<PeerOptions, "concurrency" | "promptLen" | "outputLen" | "prefillLen" | "numSchedulerSteps">, step: StepObserver,
  say: Say): Promise<LoadedModel> {
  const config = model.endsWith(".gguf") ? ggufModelConfig(readGguf(model)) : checkpointConfig(model);
  const maxN = Math.max(...o.concurrency);
  return createModel("weft", model, {
    ...DEFAULT_ENGINE_CONFIG, device: "cpu", maxNumSeqs: maxN, maxNumBatchedTokens: Math.max(o.prefillLen, DEFAULT_ENGINE_CONFIG.maxNumBatchedTokens),
    kvCacheMemory: kvBytesPerBlock(config, 32) * (Math.ceil((o.promptLen + o.outputLen) / 32) * maxN + Math.ceil(o.prefillLen / 32) + 2),
    enablePrefixCaching: false, numSchedulerSteps: o.numSchedulerSteps ?? DEFAULT_ENGINE_CONFIG.numSchedulerSteps,
  }, { observer: () => ({ step }), log: say });
}

const round2 = (x: number): number => Math.round(x * 100) / 100;

/** Weft's decode tok/s at `n` sequences, and the prompts used (llama.cpp gets the same). */
async function weftDecode(m: LoadedModel, n: number, o: PeerOptions, steps: StepTotals): Promise<{ tokS: number; prompts: number[][]; outputTokS: number }> {
  const prompts = syntheticPrompts({ numPrompts: n, promptLen: o.promptLen, vocab: m.checkpoint.config.vocab, seed: n });
  const { timings, wall } = await runLevel(m, prompts, o.outputLen, n, steps);
  const r = summarize(n, timings, wall, steps, 0);
  return { tokS: r.decode_tokens_per_second ?? 0, prompts, outputTokS: r.output_tokens_per_second };
}

async function weftPrefill(m: LoadedModel, prompt: number[], steps: StepTotals): Promise<number> {
  const pre = await runLevel(m, [prompt], 1, 1, steps);
  return summarize(1, pre.timings, pre.wall, steps, 0).prefill_tokens_per_second ?? 0;
}

export async function peerBench(o: PeerOptions): Promise<void> {
  if (o.quant?.length) return peerBenchQuantized(o, o.quant);
  const say: Say = (s) => void process.stderr.write(`${s}\n`);
  const { modelDir, ggufs: files } = benchFiles(o, say, ["f16", "bf16"]);
  const ggufs = files as Record<GgufDType, string>;
  say("measuring the machine's rooflines…");
  const rooflines = await measureRooflines();
  const steps: StepTotals = { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 };
  const m = await loadWeft(modelDir, o, (sec, rows) => attributeStep(steps, sec, rows), say);
  const prefillPrompt = syntheticPrompts({ numPrompts: 1, promptLen: o.prefillLen, vocab: m.checkpoint.config.vocab, seed: 99 })[0]!;
  await runLevel(m, [prefillPrompt.slice(0, 16)], 2, 1, steps); // warm-up

  const rows: Record<string, unknown>[] = [];
  const held = m.runner.info();
  const { dtype } = held;
  // Weft's share of the roofline that binds it: read bandwidth for one sequence, the compute peak of its unit otherwise.
  const weftShare = (n: number, decode: number | null, prefill: number | null): Record<string, number | null> => {
    const share = rooflineShare(rooflines, m.checkpoint, held, { concurrency: n, decode_tokens_per_second: decode, prefill_tokens_per_second: prefill });
    return n === 1 && prefill === null ? { weft_bandwidth_pct: share.decode_bandwidth_pct } : prefill === null ? { weft_compute_pct: share.decode_compute_pct } : { weft_compute_pct: share.prefill_compute_pct };
  };
  for (const n of o.concurrency) {
    say(`concurrency ${n}: Weft…`);
    const weft = await weftDecode(m, n, o, steps);
    const peer: Partial<Record<GgufDType, PeerRun>> = {};
    for (const dtype of ["f16", "bf16"] as const) {
      say(`concurrency ${n}: llama.cpp ${dtype}…`);
      peer[dtype] = await llamaDecode(ggufs[dtype], weft.prompts, o.outputLen);
    }
    const best = (peer.f16!.decodeTokensPerSecond >= peer.bf16!.decodeTokensPerSecond ? "f16" : "bf16") as GgufDType;
    const calls = peer[best]!.tokensPerDecodeCall;
    const row = {
      concurrency: n, weft_decode_tok_s: weft.tokS, llama_cpp_decode_tok_s: round2(peer[best]!.decodeTokensPerSecond),
      llama_cpp_gguf: best, llama_cpp_f16_tok_s: round2(peer.f16!.decodeTokensPerSecond),
      llama_cpp_bf16_tok_s: round2(peer.bf16!.decodeTokensPerSecond),
      llama_cpp_tokens_per_decode_call: `${Math.min(...calls)}–${Math.max(...calls)}`,
      ratio: round2(weft.tokS / peer[best]!.decodeTokensPerSecond),
      weft_output_tok_s: weft.outputTokS,
      ...weftShare(n, weft.tokS, null),
    };
    rows.push(row);
    say(JSON.stringify(row));
  }
  say(`prefill ${o.prefillLen} tokens: Weft…`);
  const weftPre = await weftPrefill(m, prefillPrompt, steps);
  const peerPrefill = { f16: 0, bf16: 0 };
  for (const dtype of ["f16", "bf16"] as const) {
    say(`prefill ${o.prefillLen} tokens: llama.cpp ${dtype}…`);
    peerPrefill[dtype] = await llamaPrefill(ggufs[dtype], prefillPrompt);
  }
  const bestPrefill = Math.max(peerPrefill.f16, peerPrefill.bf16);
  const report = {
    machine: machineInfo(), rooflines, model: modelInfo(m.checkpoint), dtype,
    workload: { prompt_len: o.promptLen, output_len: o.outputLen, prefill_len: o.prefillLen, num_scheduler_steps: o.numSchedulerSteps ?? DEFAULT_ENGINE_CONFIG.numSchedulerSteps, note: "decode tok/s = tokens after each sequence's first / decode-phase time" },
    decode: rows,
    prefill: { weft_tok_s: weftPre, llama_cpp_f16_tok_s: round2(peerPrefill.f16), llama_cpp_bf16_tok_s: round2(peerPrefill.bf16), ratio: round2(weftPre / bestPrefill), ...weftShare(1, null, weftPre) },
  };
  await unloadModel(m);
  console.log(`machine: ${report.machine.cpu}, ${report.machine.cores} cores; Weft kernels ${report.machine.kernels}, dtype ${report.dtype}; rooflines ${JSON.stringify(rooflines)}`);
  console.log(`model: ${o.preset} (random weights), ${report.model.weight_dtype}, ${report.model.weight_gb} GB; prompts ${o.promptLen} tokens, ${o.outputLen} generated each`);
  console.log(table(rows, Object.keys(rows[0]!)));
  console.log(`prefill of one ${o.prefillLen}-token prompt: Weft ${weftPre} tok/s, llama.cpp f16 ${report.prefill.llama_cpp_f16_tok_s} / bf16 ${report.prefill.llama_cpp_bf16_tok_s} tok/s, ratio ${report.prefill.ratio}`);
  if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 2));
}

/**
 * `--quant`: for each type, the preset's F16 GGUF quantized by llama.cpp's own
 * `llama_model_quantize` (made once, kept in `o.dir`), then Weft and llama.cpp
 * on that same file: decode at each concurrency and one prefill. Single-sequence
 * decode is also stated as a share of the machine's read bandwidth (measured at
 * the start): the weights a step reads × tok/s.
 */
async function peerBenchQuantized(o: PeerOptions, types: readonly LlamaQuantType[]): Promise<void> {
  const say: Say = (s) => void process.stderr.write(`${s}\n`);
  const { ggufs } = benchFiles(o, say, ["f16"]);
  const files = types.map((type) => {
    say(`quantizing to ${type} with llama.cpp's llama_model_quantize (once; kept in ${o.dir})…`);
    return llamaQuantized(ggufs.f16!, type);
  });
  say("measuring the machine's rooflines…");
  const rooflines = await measureRooflines();
  const steps: StepTotals = { prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 };
  const decode: Record<string, unknown>[] = [], prefill: Record<string, unknown>[] = [];
  let dtype = "", modelDesc: ReturnType<typeof modelInfo> | undefined;
  for (const [i, type] of types.entries()) {
    const file = files[i]!;
    const m = await loadWeft(file, o, (sec, rows) => attributeStep(steps, sec, rows), say);
    dtype = m.runner.info().dtype;
    modelDesc = modelInfo(m.checkpoint);
    // Bytes a step reads: Weft's as it holds them (the amx set widens Q6_K), llama.cpp's as the file stores them.
    const bytes = m.runner.info().weightBytes, fileBytes = fileMatrixBytes(m.checkpoint);
    const bandwidthPct = (tokS: number, b: number): number => Math.round(((tokS * b) / (rooflines.read_gb_s * 1e9)) * 1000) / 10;
    const prefillPrompt = syntheticPrompts({ numPrompts: 1, promptLen: o.prefillLen, vocab: m.checkpoint.config.vocab, seed: 99 })[0]!;
    await runLevel(m, [prefillPrompt.slice(0, 16)], 2, 1, steps); // warm-up
    for (const n of o.concurrency) {
      say(`${type}, ${n} sequences: Weft…`);
      const weft = await weftDecode(m, n, o, steps);
      say(`${type}, ${n} sequences: llama.cpp…`);
      const peer = await llamaDecode(file, weft.prompts, o.outputLen);
      const calls = peer.tokensPerDecodeCall;
      const row = {
        quant: type, concurrency: n, weft_tok_s: weft.tokS, llama_cpp_tok_s: round2(peer.decodeTokensPerSecond),
        ratio: round2(weft.tokS / peer.decodeTokensPerSecond),
        weft_weight_mb_per_step: Math.round(bytes / 1e5) / 10, file_weight_mb_per_step: Math.round(fileBytes / 1e5) / 10,
        weft_bandwidth_pct: n === 1 ? bandwidthPct(weft.tokS, bytes) : null,
        llama_cpp_bandwidth_pct: n === 1 ? bandwidthPct(peer.decodeTokensPerSecond, fileBytes) : null,
        llama_cpp_tokens_per_decode_call: `${Math.min(...calls)}–${Math.max(...calls)}`,
      };
      decode.push(row);
      say(JSON.stringify(row));
    }
    say(`${type}, prefill ${o.prefillLen} tokens: Weft, then llama.cpp…`);
    const weftPre = await weftPrefill(m, prefillPrompt, steps);
    await unloadModel(m);
    const peerPre = await llamaPrefill(file, prefillPrompt);
    prefill.push({ quant: type, prefill_tokens: o.prefillLen, weft_tok_s: weftPre, llama_cpp_tok_s: round2(peerPre), ratio: round2(weftPre / peerPre) });
  }
  const report = {
    machine: machineInfo(), rooflines, model: { preset: o.preset, ...modelDesc! }, dtype, files: Object.fromEntries(types.map((t, i) => [t, files[i]])),
    workload: {
      prompt_len: o.promptLen, output_len: o.outputLen, prefill_len: o.prefillLen, num_scheduler_steps: o.numSchedulerSteps ?? DEFAULT_ENGINE_CONFIG.numSchedulerSteps,
      note: "decode tok/s = tokens after each sequence's first / decode-phase time; bandwidth % = one sequence's tok/s × weight bytes per step (Weft's as it holds them, llama.cpp's as the file stores them) / measured read bandwidth",
    },
    decode, prefill,
  };
  console.log(`machine: ${report.machine.cpu}, ${report.machine.cores} cores; Weft kernels ${report.machine.kernels}, dtype ${dtype}; read bandwidth ${rooflines.read_gb_s} GB/s`);
  console.log(`model: ${o.preset} (random weights), the same llama.cpp-quantized file for both; prompts ${o.promptLen} tokens, ${o.outputLen} generated each`);
  console.log(table(decode, Object.keys(decode[0]!)));
  console.log(table(prefill, Object.keys(prefill[0]!)));
  if (o.json) fs.writeFileSync(o.json, JSON.stringify(report, null, 2));
}
