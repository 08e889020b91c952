/** What a benchmark ran on: stated with every result. */
import fs from "node:fs";
import os from "node:os";
import { loadNative, type ComputeDtype, type NativeModelInfo, type NativeTensor } from "../runtime/native.js";
import type { Checkpoint } from "../model/checkpoint.js";

export interface MachineInfo {
  cpu: string;
  cores: number;
  memory_gb: number;
  node: string;
  kernels: string;
  flags: string[];
}

/** The cores this process may run on (its CPU affinity, e.g. under `taskset`), which both engines use. */
export const usableCores = (): number => os.availableParallelism();

export function machineInfo(): MachineInfo {
  let flags: string[] = [];
  try {
    const line = fs.readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => l.startsWith("flags")) ?? "";
    flags = line.split(":")[1]?.trim().split(/\s+/).filter((f) => /^(avx2|avx512f|avx512bw|avx512_bf16|amx_bf16|amx_tile|amx_int8|fma|f16c)$/.test(f)) ?? [];
  } catch {
    // not Linux
  }
  return {
    cpu: os.cpus()[0]?.model ?? "unknown", cores: usableCores(), memory_gb: Math.round(os.totalmem() / 2 ** 30),
    node: process.version, kernels: loadNative().isa(), flags,
  };
}

export interface ModelInfo {
  dir: string;
  architecture: string;
  layers: number;
  hidden: number;
  heads: number;
  kv_heads: number;
  vocab: number;
  weight_dtype: string;
  weight_gb: number;
}

export function modelInfo(c: Checkpoint): ModelInfo {
  const cfg = c.config;
  return {
    dir: c.dir, architecture: cfg.architecture, layers: cfg.layers, hidden: cfg.hidden, heads: cfg.heads, kv_heads: cfg.kvHeads,
    vocab: cfg.vocab, weight_dtype: c.weights.layers[0]?.wq.dtype ?? c.weights.embed.dtype, weight_gb: Math.round(c.weightBytes / 1e7) / 100,
  };
}

/** The machine's limits, measured at the start of each benchmark run (0: the CPU lacks the unit). */
export interface Rooflines {
  read_gb_s: number;
  fp32_gflops: number;
  bf16_dot_gflops: number;
  amx_gflops: number;
}

export async function measureRooflines(): Promise<Rooflines> {
  const r = await loadNative().measureRooflines();
  const round = (x: number): number => Math.round(x / 1e8) / 10;
  return { read_gb_s: round(r.readBytesPerSecond), fp32_gflops: round(r.fp32Flops), bf16_dot_gflops: round(r.bf16DotFlops), amx_gflops: round(r.amxFlops) };
}

/** The matrices a decode step reads: the output projection and every layer's linear layers. */
export function stepMatrices(c: Checkpoint): NativeTensor[] {
  return [c.weights.lmHead, ...c.weights.layers.flatMap((l) => [l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down])];
}

/** Multiply-adds per token in the linear layers and the output projection. */
export function matmulParams(c: Checkpoint): number {
  return stepMatrices(c).reduce((n, t) => n + t.shape[0]! * t.shape[1]!, 0);
}

/** The matrices' bytes as the file stores them: what a peer reading the file in place streams a step. */
export function fileMatrixBytes(c: Checkpoint): number {
  return stepMatrices(c).reduce((n, t) => n + t.byteLength, 0);
}

/** The compute peak that binds a matmul: the unit the kernels use in this mode. */
export function computePeakGflops(r: Rooflines, dtype: ComputeDtype, kernels: string): number {
  if (dtype === "bfloat16" && kernels === "amx") return r.amx_gflops;
  if (dtype === "bfloat16" && kernels === "avx512bf16") return r.bf16_dot_gflops;
  return r.fp32_gflops;
}

/** Each result as a fraction of the roofline that binds it. */
export interface RooflineShare {
  concurrency: number;
  /** One sequence: weight bytes streamed per token against read bandwidth. */
  decode_bandwidth_pct: number | null;
  /** Batches: matmul FLOPs per second against the compute peak. */
  decode_compute_pct: number | null;
  prefill_compute_pct: number | null;
}

/**
 * `held`: the loaded model's mode, kernel set and weight bytes as it holds them (its info()),
 * the bytes one decode step reads.
 */
export function rooflineShare(r: Rooflines, c: Checkpoint, held: Pick<NativeModelInfo, "dtype" | "isa" | "weightBytes">,
  res: { concurrency: number; decode_tokens_per_second: number | null; prefill_tokens_per_second: number | null }): RooflineShare {
  const params = matmulParams(c);
  const bytesPerStep = held.weightBytes;
  const peak = computePeakGflops(r, held.dtype, held.isa) * 1e9;
  const pct = (x: number | null, limit: number): number | null => (x === null || limit <= 0 ? null : Math.round((x / limit) * 1000) / 10);
  const decode = res.decode_tokens_per_second;
  return {
    concurrency: res.concurrency,
    decode_bandwidth_pct: res.concurrency === 1 ? pct(decode === null ? null : decode * bytesPerStep, r.read_gb_s * 1e9) : null,
    decode_compute_pct: res.concurrency > 1 ? pct(decode === null ? null : decode * 2 * params, peak) : null,
    prefill_compute_pct: pct(res.prefill_tokens_per_second === null ? null : res.prefill_tokens_per_second * 2 * params, peak),
  };
}
