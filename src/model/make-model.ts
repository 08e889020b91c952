/** `weft make-model`: a random-weight checkpoint with a preset's real shapes and tokenizer. */
import fs from "node:fs";
import path from "node:path";
import { PRESETS } from "./presets.js";
import { writeSafetensors, type TensorToWrite } from "./safetensors.js";
import { tokenizerPackageDir } from "./tokenizer-packages.js";

export type WeightDType = "bf16" | "f16" | "f32";

/** xorshift128+-style generator: fast, seeded, and the same on every machine. */
function uniformSource(seed: number): () => number {
  let a = (seed ^ 0x9e3779b9) >>> 0 || 1, b = (seed * 2654435761) >>> 0 || 2;
  return () => {
    let t = a ^ (a << 11);
    a = b;
    b = (b ^ (b >>> 19) ^ t ^ (t >>> 8)) >>> 0;
    t = 0;
    return b / 4294967296 - 0.5; // uniform in [-0.5, 0.5)
  };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

function f16Bits(x: number): number {
  f32[0] = x;
  const v = u32[0]!;
  const sign = (v >>> 16) & 0x8000, exp = ((v >>> 23) & 0xff) - 112, mant = v & 0x7fffff;
  if (exp <= 0) return sign; // tiny values flush to zero: random weights do not need subnormals
  if (exp >= 31) return sign | 0x7c00;
  return sign | (exp << 10) | (mant >> 13);
}

/** `count` values, uniform with standard deviation `std` around `mean`, encoded as `dtype`. */
function randomBytes(count: number, dtype: WeightDType, rand: () => number, mean: number, std: number): Uint8Array {
  const width = std * Math.sqrt(12);
  if (dtype === "f32") {
    const out = new Float32Array(count);
    for (let i = 0; i < count; i++) out[i] = mean + rand() * width;
    return new Uint8Array(out.buffer);
  }
  const out = new Uint16Array(count);
  for (let i = 0; i < count; i++) {
    const x = mean + rand() * width;
    if (dtype === "f16") out[i] = f16Bits(x);
    else {
      f32[0] = x;
      out[i] = (u32[0]! + 0x8000) >>> 16; // round to nearest bf16
    }
  }
  return new Uint8Array(out.buffer);
}

export interface MakeModelOptions {
  preset: string;
  out: string;
  dtype?: WeightDType;
  seed?: number;
}

export function makeModel(opts: MakeModelOptions): string {
  const preset = PRESETS[opts.preset];
  if (!preset) throw new Error(`unknown preset "${opts.preset}" (have: ${Object.keys(PRESETS).join(", ")})`);
  const dtype = opts.dtype ?? "bf16";
  const rand = uniformSource(opts.seed ?? 0);
  const c = preset.config as Record<string, number | boolean>;
  const H = c.hidden_size as number, I = c.intermediate_size as number, V = c.vocab_size as number;
  const heads = c.num_attention_heads as number, kv = c.num_key_value_heads as number;
  const hd = (c.head_dim as number | undefined) ?? H / heads;
  const qwen2 = (preset.config.architectures as string[])[0] === "Qwen2ForCausalLM";
  const qwen3 = (preset.config.architectures as string[])[0] === "Qwen3ForCausalLM";
  const st = dtype.toUpperCase() as TensorToWrite["dtype"];
  const t = (name: string, shape: number[], mean = 0, std = 0.02): TensorToWrite => ({
    name, dtype: st, shape, data: () => randomBytes(shape.reduce((a, b) => a * b, 1), dtype, rand, mean, std),
  });
  const tensors: TensorToWrite[] = [t("model.embed_tokens.weight", [V, H]), t("model.norm.weight", [H], 1, 0.05)];
  if (!c.tie_word_embeddings) tensors.push(t("lm_head.weight", [V, H]));
  for (let l = 0; l < (c.num_hidden_layers as number); l++) {
    const p = `model.layers.${l}.`;
    tensors.push(
      t(`${p}input_layernorm.weight`, [H], 1, 0.05), t(`${p}post_attention_layernorm.weight`, [H], 1, 0.05),
      t(`${p}self_attn.q_proj.weight`, [heads * hd, H]), t(`${p}self_attn.k_proj.weight`, [kv * hd, H]),
      t(`${p}self_attn.v_proj.weight`, [kv * hd, H]), t(`${p}self_attn.o_proj.weight`, [H, heads * hd]),
      t(`${p}mlp.gate_proj.weight`, [I, H]), t(`${p}mlp.up_proj.weight`, [I, H]), t(`${p}mlp.down_proj.weight`, [H, I]),
    );
    if (qwen2) tensors.push(t(`${p}self_attn.q_proj.bias`, [heads * hd]), t(`${p}self_attn.k_proj.bias`, [kv * hd]), t(`${p}self_attn.v_proj.bias`, [kv * hd]));
    if (qwen3) tensors.push(t(`${p}self_attn.q_norm.weight`, [hd], 1, 0.05), t(`${p}self_attn.k_norm.weight`, [hd], 1, 0.05));
  }
  fs.mkdirSync(opts.out, { recursive: true });
  const config = { ...preset.config, torch_dtype: { bf16: "bfloat16", f16: "float16", f32: "float32" }[dtype], weft_random_weights: true };
  fs.writeFileSync(path.join(opts.out, "config.json"), JSON.stringify(config, null, 2));
  fs.writeFileSync(path.join(opts.out, "generation_config.json"),
    JSON.stringify({ bos_token_id: c.bos_token_id, eos_token_id: preset.generationEos }, null, 2));
  const tokDir = tokenizerPackageDir(preset.tokenizer);
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(tokDir, f), path.join(opts.out, f));
  writeSafetensors(path.join(opts.out, "model.safetensors"), tensors);
  return opts.out;
}
