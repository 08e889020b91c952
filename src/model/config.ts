/**
 * config.json → the model's shape. Accepts the transformers-5 form
 * (`rope_parameters`) and the older one (`rope_theta` / `rope_scaling` at top level).
 */
import fs from "node:fs";
import path from "node:path";
import type { RunnerModelConfig } from "../runtime/model-runner.js";
import type { RopeScaling } from "../runtime/rope.js";
import { CheckpointError } from "./errors.js";

export const ARCHITECTURES = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"] as const;
export type Architecture = (typeof ARCHITECTURES)[number];

export type { RopeScaling };

/** A checkpoint's shape: what the runner needs (RunnerModelConfig), and what the loader and engine need besides. */
export interface ModelConfig extends RunnerModelConfig {
  architecture: Architecture;
  maxPositions: number;
  tieEmbeddings: boolean;
  /** q/k/v projections carry biases (Qwen2, or `attention_bias`). */
  qkvBias: boolean;
  /** per-head RMSNorm on q and k before rope (Qwen3). */
  qkNorm: boolean;
  bosTokenId: number | null;
  eosTokenIds: number[];
}

type Json = Record<string, unknown>;

function readJson(file: string): Json {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch {
    throw new CheckpointError(file, "file not found");
  }
  try {
    const v: unknown = JSON.parse(text);
    if (typeof v === "object" && v !== null && !Array.isArray(v)) return v as Json;
  } catch {
    // fall through
  }
  throw new CheckpointError(file, "not a JSON object");
}

export function readJsonIfExists(file: string): Json | undefined {
  return fs.existsSync(file) ? readJson(file) : undefined;
}

function int(cfg: Json, key: string, file: string, fallback?: number): number {
  const v = cfg[key] ?? fallback;
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v <= 0) {
    throw new CheckpointError(file, `"${key}" must be a positive integer (got ${JSON.stringify(v)})`);
  }
  return v;
}

function num(v: unknown, key: string, file: string): number {
  if (typeof v !== "number" || !Number.isFinite(v)) throw new CheckpointError(file, `"${key}" must be a number`);
  return v;
}

function idList(v: unknown): number[] {
  if (typeof v === "number") return [v];
  if (Array.isArray(v)) return v.filter((x): x is number => typeof x === "number");
  return [];
}

function parseRope(cfg: Json, file: string): { theta: number; scaling: RopeScaling } {
  // transformers 5 nests everything under rope_parameters; older configs use top-level keys.
  const params = (cfg.rope_parameters ?? cfg.rope_scaling ?? {}) as Json;
  const theta = num(params.rope_theta ?? cfg.rope_theta ?? 10000, "rope_theta", file);
  const type = (params.rope_type ?? params.type ?? "default") as unknown;
  if (type === "default") return { theta, scaling: { type: "default" } };
  if (type === "llama3") {
    return {
      theta,
      scaling: {
        type: "llama3",
        factor: num(params.factor, "rope factor", file),
        lowFreqFactor: num(params.low_freq_factor, "low_freq_factor", file),
        highFreqFactor: num(params.high_freq_factor, "high_freq_factor", file),
        originalMaxPositions: num(params.original_max_position_embeddings, "original_max_position_embeddings", file),
      },
    };
  }
  throw new CheckpointError(file, `unsupported rope type "${String(type)}" (supported: default, llama3)`);
}

/** Reads `dir/config.json` (and `generation_config.json` for the EOS list). */
export function readModelConfig(dir: string): ModelConfig {
  const file = path.join(dir, "config.json");
  const cfg = readJson(file);
  const archs = Array.isArray(cfg.architectures) ? cfg.architectures : [];
  const architecture = archs.find((a): a is Architecture => (ARCHITECTURES as readonly unknown[]).includes(a));
  if (!architecture) {
    throw new CheckpointError(file, `unsupported architecture ${JSON.stringify(archs)} (supported: ${ARCHITECTURES.join(", ")})`);
  }
  const hidden = int(cfg, "hidden_size", file);
  const heads = int(cfg, "num_attention_heads", file);
  const kvHeads = int(cfg, "num_key_value_heads", file, heads);
  if (heads % kvHeads !== 0) throw new CheckpointError(file, `num_attention_heads ${heads} is not a multiple of num_key_value_heads ${kvHeads}`);
  const headDim = int(cfg, "head_dim", file, Math.floor(hidden / heads));
  if (headDim % 2 !== 0) throw new CheckpointError(file, `head_dim ${headDim} must be even for rope`);
  const rope = parseRope(cfg, file);
  const gen = readJsonIfExists(path.join(dir, "generation_config.json")) ?? {};
  const eos = [...new Set([...idList(cfg.eos_token_id), ...idList(gen.eos_token_id)])];
  const bos = typeof cfg.bos_token_id === "number" ? cfg.bos_token_id : typeof gen.bos_token_id === "number" ? gen.bos_token_id : null;
  return {
    architecture,
    hidden,
    intermediate: int(cfg, "intermediate_size", file),
    layers: int(cfg, "num_hidden_layers", file),
    heads,
    kvHeads,
    headDim,
    vocab: int(cfg, "vocab_size", file),
    rmsEps: num(cfg.rms_norm_eps ?? 1e-6, "rms_norm_eps", file),
    ropeTheta: rope.theta,
    ropeScaling: rope.scaling,
    maxPositions: int(cfg, "max_position_embeddings", file, 4096),
    tieEmbeddings: cfg.tie_word_embeddings === true,
    qkvBias: architecture === "Qwen2ForCausalLM" || cfg.attention_bias === true,
    qkNorm: architecture === "Qwen3ForCausalLM",
    bosTokenId: bos,
    eosTokenIds: eos,
  };
}
