/**
 * Named model shapes for `weft make-model`: the real architectures and
 * tokenizers of public checkpoints, with random weights.
 */
import type { TokenizerFamily } from "./tokenizer-packages.js";

export interface Preset {
  description: string;
  tokenizer: TokenizerFamily;
  /** config.json as transformers writes it (older, top-level rope form). */
  config: Record<string, unknown>;
  generationEos: number[];
}

const qwen3 = (over: Record<string, unknown>): Record<string, unknown> => ({
  architectures: ["Qwen3ForCausalLM"], model_type: "qwen3", hidden_act: "silu", vocab_size: 151936,
  rms_norm_eps: 1e-6, rope_theta: 1000000, rope_scaling: null, tie_word_embeddings: true, attention_bias: false,
  bos_token_id: 151643, eos_token_id: 151645, max_position_embeddings: 40960, ...over,
});

export const PRESETS: Record<string, Preset> = {
  tiny: {
    description: "2-layer Qwen3 shape (hidden 64) with the Qwen3 tokenizer: for tests and demos",
    tokenizer: "qwen3",
    config: qwen3({ hidden_size: 64, intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 16, max_position_embeddings: 4096 }),
    generationEos: [151645, 151643],
  },
  small: {
    description: "4-layer Qwen3 shape (hidden 256) with the Qwen3 tokenizer: big enough for timing tests, quick to make",
    tokenizer: "qwen3",
    config: qwen3({ hidden_size: 256, intermediate_size: 768, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, head_dim: 64, max_position_embeddings: 8192 }),
    generationEos: [151645, 151643],
  },
  "tiny-llama": {
    description: "2-layer Llama shape (hidden 64) with the Llama 2 tokenizer",
    tokenizer: "llama2",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_act: "silu", vocab_size: 32000, hidden_size: 64,
      intermediate_size: 128, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1e-5,
      rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, max_position_embeddings: 2048,
    },
    generationEos: [2],
  },
  "small-llama": {
    description: "2-layer Llama shape (hidden 256: rows of whole K-quant blocks) with the Llama 2 tokenizer, untied output: for quantization tests",
    tokenizer: "llama2",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_act: "silu", vocab_size: 32000, hidden_size: 256,
      intermediate_size: 512, num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, rms_norm_eps: 1e-5,
      rope_theta: 10000, tie_word_embeddings: false, bos_token_id: 1, eos_token_id: 2, max_position_embeddings: 2048,
    },
    generationEos: [2],
  },
  "qwen3-0.6b": {
    description: "Qwen/Qwen3-0.6B shape: 28 layers, hidden 1024, 16 q / 8 kv heads of 128, tied embeddings",
    tokenizer: "qwen3",
    config: qwen3({ hidden_size: 1024, intermediate_size: 3072, num_hidden_layers: 28, num_attention_heads: 16, num_key_value_heads: 8, head_dim: 128 }),
    generationEos: [151645, 151643],
  },
  "qwen2.5-0.5b": {
    description: "Qwen/Qwen2.5-0.5B-Instruct shape: 24 layers, hidden 896, 14 q / 2 kv heads, q/k/v biases (Qwen3 tokenizer: same vocabulary)",
    tokenizer: "qwen3",
    config: {
      architectures: ["Qwen2ForCausalLM"], model_type: "qwen2", hidden_act: "silu", vocab_size: 151936, hidden_size: 896,
      intermediate_size: 4864, num_hidden_layers: 24, num_attention_heads: 14, num_key_value_heads: 2, rms_norm_eps: 1e-6,
      rope_theta: 1000000, tie_word_embeddings: true, bos_token_id: 151643, eos_token_id: 151645, max_position_embeddings: 32768,
    },
    generationEos: [151645, 151643],
  },
  "llama-3.2-1b": {
    description: "meta-llama/Llama-3.2-1B shape: 16 layers, hidden 2048, 32 q / 8 kv heads, llama3 rope scaling",
    tokenizer: "llama3_1",
    config: {
      architectures: ["LlamaForCausalLM"], model_type: "llama", hidden_act: "silu", vocab_size: 128256, hidden_size: 2048,
      intermediate_size: 8192, num_hidden_layers: 16, num_attention_heads: 32, num_key_value_heads: 8, head_dim: 64,
      rms_norm_eps: 1e-5, rope_theta: 500000, tie_word_embeddings: true, bos_token_id: 128000, eos_token_id: 128001,
      rope_scaling: { rope_type: "llama3", factor: 32, low_freq_factor: 1, high_freq_factor: 4, original_max_position_embeddings: 8192 },
      max_position_embeddings: 131072,
    },
    generationEos: [128001, 128008, 128009],
  },
};
