/**
 * MLX-quantized checkpoints (mlx-community's 4- and 8-bit safetensors): config.json's
 * `quantization` and the tensors it describes. A quantized linear layer NAME is stored as
 * `NAME.weight` (U32 words, [out, in·bits/32], element j of a word at bits [bits·j, bits·(j+1)),
 * lowest first), `NAME.scales` and `NAME.biases` ([out, in/group_size]); its weight is
 * scale·q + bias per group. The addon keeps them quantized (native/mlx_quant.h).
 */
import path from "node:path";
import { CheckpointError } from "./errors.js";
import { readJsonIfExists } from "./config.js";
import type { NativeTensor } from "../runtime/native.js";

export const MLX_BITS = [4, 8] as const;
export const MLX_GROUP_SIZES = [32, 64, 128] as const;

export interface MlxParams {
  bits: 4 | 8;
  groupSize: number;
}

export interface MlxQuantization {
  /** The default for every quantized layer. */
  defaults: MlxParams;
  /** Per-layer entries of `quantization` by module path: other params, or null for a layer left unquantized. */
  overrides: Map<string, MlxParams | null>;
}

type Json = Record<string, unknown>;

function params(file: string, where: string, v: Json): MlxParams {
  const bits = v.bits, groupSize = v.group_size;
  if (!(MLX_BITS as readonly unknown[]).includes(bits)) {
    throw new CheckpointError(file, `${where}: unsupported bits ${JSON.stringify(bits)} (supported: ${MLX_BITS.join(", ")})`);
  }
  if (!(MLX_GROUP_SIZES as readonly unknown[]).includes(groupSize)) {
    throw new CheckpointError(file, `${where}: unsupported group_size ${JSON.stringify(groupSize)} (supported: ${MLX_GROUP_SIZES.join(", ")})`);
  }
  if (v.mode !== undefined && v.mode !== "affine") {
    throw new CheckpointError(file, `${where}: unsupported quantization mode ${JSON.stringify(v.mode)} (supported: affine)`);
  }
  return { bits: bits as 4 | 8, groupSize: groupSize as number };
}

/**
 * config.json's MLX quantization, or null for an unquantized checkpoint. mlx-lm writes it as
 * `quantization` (and a copy as `quantization_config`); besides group_size, bits and mode it may
 * hold per-layer entries: `{group_size, bits}` or `false` (left in float).
 */
export function readMlxQuantization(dir: string): MlxQuantization | null {
  const file = path.join(dir, "config.json");
  const cfg = readJsonIfExists(file) ?? {};
  // quantization_config with a quant_method is another format (GPTQ, AWQ, ...), not MLX's.
  const copy = cfg.quantization_config;
  const q = cfg.quantization ?? (typeof copy === "object" && copy !== null && !("quant_method" in copy) ? copy : undefined);
  if (q === undefined) return null;
  if (typeof q !== "object" || q === null || Array.isArray(q)) throw new CheckpointError(file, "\"quantization\" must be an object");
  const raw = q as Json;
  const overrides = new Map<string, MlxParams | null>();
  for (const [key, v] of Object.entries(raw)) {
    if (key === "group_size" || key === "bits" || key === "mode") continue;
    if (v === false) overrides.set(key, null);
    else if (typeof v === "object" && v !== null && !Array.isArray(v)) overrides.set(key, params(file, `quantization.${key}`, v as Json));
    else throw new CheckpointError(file, `quantization.${key}: expected a per-layer {group_size, bits} or false, got ${JSON.stringify(v)}`);
  }
  return { defaults: params(file, "quantization", raw), overrides };
}

/** The quantization a checkpoint is served with, for logs and /v1/models: "mlx-4bit-g64" (plus per-layer overrides). */
export function describeMlx(q: MlxQuantization): string {
  const extra = q.overrides.size > 0 ? ` (+${q.overrides.size} per-layer overrides)` : "";
  return `mlx-${q.defaults.bits}bit-g${q.defaults.groupSize}${extra}`;
}

function checkShape(t: NativeTensor, name: string, shape: number[], what = ""): void {
  if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
    throw new CheckpointError(t.file, `wrong shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]${what}`, name);
  }
}

/**
 * The linear layer `module` ([rows, cols]) of an MLX checkpoint: quantized when `module.scales`
 * is stored (checked against its params), else a float weight as in any checkpoint.
 */
export function mlxMatrix(dir: string, tensors: Map<string, NativeTensor>, q: MlxQuantization, module: string, shape: [number, number]): NativeTensor {
  const name = `${module}.weight`;
  const weight = tensors.get(name);
  if (!weight) throw new CheckpointError(dir, "missing tensor", name);
  const scales = tensors.get(`${module}.scales`), biases = tensors.get(`${module}.biases`);
  const p = q.overrides.has(module) ? q.overrides.get(module)! : q.defaults;
  if (!scales && !biases) {
    if (weight.dtype === "u32") throw new CheckpointError(weight.file, `U32 (MLX-quantized) weight without ${module}.scales and ${module}.biases`, name);
    checkShape(weight, name, shape);
    return weight;
  }
  if (!scales || !biases) throw new CheckpointError(dir, "missing tensor (an MLX-quantized layer needs both scales and biases)", `${module}.${scales ? "biases" : "scales"}`);
  if (!p) throw new CheckpointError(weight.file, `config.json leaves ${module} unquantized (quantization.${module} = false) but it has scales and biases`, name);
  const [rows, cols] = shape;
  if (weight.dtype !== "u32") throw new CheckpointError(weight.file, `an MLX-quantized weight must be U32, got ${weight.dtype}`, name);
  if (cols % p.groupSize !== 0) throw new CheckpointError(weight.file, `input dimension ${cols} is not a multiple of group_size ${p.groupSize}`, name);
  checkShape(weight, name, [rows, (cols * p.bits) / 32], ` (${p.bits}-bit words of [${rows}, ${cols}])`);
  for (const [t, n] of [[scales, `${module}.scales`], [biases, `${module}.biases`]] as const) {
    if (t.dtype !== "bf16" && t.dtype !== "f16" && t.dtype !== "f32") throw new CheckpointError(t.file, `MLX scales and biases must be BF16, F16 or F32, got ${t.dtype}`, n);
    checkShape(t, n, [rows, cols / p.groupSize], ` (one per group of ${p.groupSize})`);
  }
  if (scales.dtype !== biases.dtype) throw new CheckpointError(biases.file, `dtype ${biases.dtype} differs from the scales' ${scales.dtype}`, `${module}.biases`);
  return { ...weight, dtype: p.bits === 4 ? "mlx4" : "mlx8", shape: [rows, cols], mlx: { groupSize: p.groupSize, scales, biases } };
}
