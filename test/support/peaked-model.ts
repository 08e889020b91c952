/**
 * Small random checkpoints whose next-token distributions are peaked, as a
 * trained model's are: `weft make-model`'s weights (std 0.02) give logits with
 * a spread of about 0.3 over 150k tokens, where nearly every greedy choice is a
 * near-tie and top-k log-probs say little. Here each projection keeps its
 * output at unit scale (std 1/√fan-in) and the output projection spreads the
 * logits by about 4, so top-2 gaps are mostly well above quantization noise.
 * Every matrix row is 256 wide: whole K-quant blocks, so llama.cpp's Q4_K_M
 * quantizes every matrix (the fixtures' 48- and 64-wide rows fall back to
 * other types or stay F16).
 */
import fs from "node:fs";
import path from "node:path";
import { writeSafetensors, type TensorToWrite } from "../../src/model/safetensors.js";
import { tokenizerPackageDir } from "../../src/model/tokenizer-packages.js";

export type PeakedFamily = "qwen3" | "llama";

const SHAPE = { hidden: 256, intermediate: 768, layers: 4, heads: 4, kvHeads: 2, headDim: 64 };
/** Logit spread: the output projection's std times √hidden. */
const LOGIT_SPREAD = 4;

function configOf(family: PeakedFamily): Record<string, unknown> {
  const s = SHAPE;
  const common = {
    hidden_size: s.hidden, intermediate_size: s.intermediate, num_hidden_layers: s.layers, num_attention_heads: s.heads,
    num_key_value_heads: s.kvHeads, head_dim: s.headDim, hidden_act: "silu", torch_dtype: "float32",
  };
  return family === "qwen3"
    ? { ...common, architectures: ["Qwen3ForCausalLM"], model_type: "qwen3", vocab_size: 151936, rms_norm_eps: 1e-6, rope_theta: 1000000,
      tie_word_embeddings: true, attention_bias: false, bos_token_id: 151643, eos_token_id: 151645, max_position_embeddings: 4096 }
    : { ...common, architectures: ["LlamaForCausalLM"], model_type: "llama", vocab_size: 32000, rms_norm_eps: 1e-5, rope_theta: 10000,
      tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, max_position_embeddings: 4096 };
}

/** Seeded standard normals (xorshift32 + Box-Muller, both outputs used): the same on every machine. */
function normals(seed: number): () => number {
  let s = seed >>> 0 || 1, spare: number | null = null;
  const u = (): number => {
    s ^= s << 13; s >>>= 0; s ^= s >>> 17; s ^= s << 5; s >>>= 0;
    return (s + 0.5) / 4294967296;
  };
  return () => {
    if (spare !== null) {
      const v = spare;
      spare = null;
      return v;
    }
    const r = Math.sqrt(-2 * Math.log(u())), a = 2 * Math.PI * u();
    spare = r * Math.sin(a);
    return r * Math.cos(a);
  };
}

/** Writes the checkpoint (F32 safetensors, the family's tokenizer) to `out`. */
export function makePeakedModel(family: PeakedFamily, out: string, seed = 1): string {
  const c = configOf(family);
  const { hidden: H, intermediate: I, heads, kvHeads: kv, headDim: hd } = SHAPE;
  const V = c.vocab_size as number;
  const rand = normals(seed);
  const t = (name: string, shape: number[], std: number, mean = 0): TensorToWrite => ({
    name, dtype: "F32", shape,
    data: () => {
      const a = new Float32Array(shape.reduce((m, n) => m * n, 1));
      for (let i = 0; i < a.length; i++) a[i] = mean + std * rand();
      return new Uint8Array(a.buffer);
    },
  });
  const outStd = LOGIT_SPREAD / Math.sqrt(H);
  const tensors: TensorToWrite[] = [t("model.embed_tokens.weight", [V, H], family === "qwen3" ? outStd : 1), t("model.norm.weight", [H], 0.05, 1)];
  if (family !== "qwen3") tensors.push(t("lm_head.weight", [V, H], outStd));
  for (let l = 0; l < SHAPE.layers; l++) {
    const p = `model.layers.${l}.`;
    tensors.push(
      t(`${p}input_layernorm.weight`, [H], 0.05, 1), t(`${p}post_attention_layernorm.weight`, [H], 0.05, 1),
      t(`${p}self_attn.q_proj.weight`, [heads * hd, H], 1 / Math.sqrt(H)), t(`${p}self_attn.k_proj.weight`, [kv * hd, H], 1 / Math.sqrt(H)),
      t(`${p}self_attn.v_proj.weight`, [kv * hd, H], 1 / Math.sqrt(H)), t(`${p}self_attn.o_proj.weight`, [H, heads * hd], 1 / Math.sqrt(heads * hd)),
      t(`${p}mlp.gate_proj.weight`, [I, H], 1 / Math.sqrt(H)), t(`${p}mlp.up_proj.weight`, [I, H], 1 / Math.sqrt(H)),
      t(`${p}mlp.down_proj.weight`, [H, I], 1 / Math.sqrt(I)),
    );
    if (family === "qwen3") tensors.push(t(`${p}self_attn.q_norm.weight`, [hd], 0.05, 1), t(`${p}self_attn.k_norm.weight`, [hd], 0.05, 1));
  }
  fs.mkdirSync(out, { recursive: true });
  fs.writeFileSync(path.join(out, "config.json"), JSON.stringify(c, null, 2));
  fs.writeFileSync(path.join(out, "generation_config.json"), JSON.stringify({ bos_token_id: c.bos_token_id, eos_token_id: c.eos_token_id }));
  const tokDir = tokenizerPackageDir(family === "qwen3" ? "qwen3" : "llama2");
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(tokDir, f), path.join(out, f));
  writeSafetensors(path.join(out, "model.safetensors"), tensors);
  return out;
}
