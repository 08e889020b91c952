/** What a benchmark ran on: stated with every result. */
import fs from "node:fs";
import os from "node:os";
import { loadNative } from "../runtime/native.js";
import type { Checkpoint } from "../model/checkpoint.js";

export interface MachineInfo {
  cpu: string;
  cores: number;
  memory_gb: number;
  node: string;
  kernels: string;
  flags: string[];
}

export function machineInfo(): MachineInfo {
  let flags: string[] = [];
  try {
    const line = fs.readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => l.startsWith("flags")) ?? "";
    flags = line.split(":")[1]?.trim().split(/\s+/).filter((f) => /^(avx2|avx512f|avx512bw|avx512_bf16|fma|f16c)$/.test(f)) ?? [];
  } catch {
    // not Linux
  }
  return {
    cpu: os.cpus()[0]?.model ?? "unknown", cores: os.cpus().length, memory_gb: Math.round(os.totalmem() / 2 ** 30),
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
