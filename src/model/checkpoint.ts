/**
 * A Hugging Face model directory → config + validated tensor map → the
 * addon's weight spec. Single-file and sharded checkpoints both load.
 */
import fs from "node:fs";
import path from "node:path";
import { CheckpointError } from "./errors.js";
import { readModelConfig, type ModelConfig } from "./config.js";
import { readSafetensors } from "./safetensors.js";
import { loadGgufCheckpoint } from "./gguf-model.js";
import { describeMlx, mlxMatrix, readMlxQuantization, type MlxQuantization } from "./mlx-quant.js";
import type { NativeLayerWeights, NativeTensor, NativeWeights } from "../runtime/native.js";

export interface Checkpoint {
  dir: string;
  config: ModelConfig;
  weights: NativeWeights;
  /** Bytes of weights read per forward step (for rooflines and logs). */
  weightBytes: number;
  /** How the weights are quantized ("mlx-4bit-g64", ...), for logs and /v1/models; absent for float checkpoints. */
  quantization?: string;
}

/** The shard files of a checkpoint: `model.safetensors`, or those named by the sharded index. */
function shardFiles(dir: string): string[] {
  const single = path.join(dir, "model.safetensors");
  if (fs.existsSync(single)) return [single];
  const indexFile = path.join(dir, "model.safetensors.index.json");
  if (!fs.existsSync(indexFile)) {
    throw new CheckpointError(dir, "no model.safetensors or model.safetensors.index.json");
  }
  let index: { weight_map?: Record<string, string> };
  try {
    index = JSON.parse(fs.readFileSync(indexFile, "utf8")) as typeof index;
  } catch {
    throw new CheckpointError(indexFile, "not valid JSON");
  }
  if (!index.weight_map || typeof index.weight_map !== "object") throw new CheckpointError(indexFile, "missing weight_map");
  const files = [...new Set(Object.values(index.weight_map))];
  for (const f of files) {
    if (typeof f !== "string" || f.includes("/") || f.includes("\\")) throw new CheckpointError(indexFile, `bad shard name ${JSON.stringify(f)}`);
    if (!fs.existsSync(path.join(dir, f))) throw new CheckpointError(path.join(dir, f), "shard named by the index is missing");
  }
  return files.map((f) => path.join(dir, f));
}

function collectTensors(files: string[]): Map<string, NativeTensor> {
  const all = new Map<string, NativeTensor>();
  for (const f of files) {
    for (const [name, t] of readSafetensors(f)) {
      if (all.has(name)) throw new CheckpointError(f, "tensor appears in two shards", name);
      all.set(name, t);
    }
  }
  return all;
}

class TensorPicker {
  constructor(
    private readonly dir: string,
    private readonly tensors: Map<string, NativeTensor>,
    private readonly mlx: MlxQuantization | null,
  ) {}

  get(name: string, shape: number[]): NativeTensor {
    const t = this.tensors.get(name);
    if (!t) throw new CheckpointError(this.dir, "missing tensor", name);
    if (t.dtype === "u32") {
      throw new CheckpointError(t.file, this.mlx ? "U32 tensor where a float one belongs" : "U32 tensor, but config.json has no MLX \"quantization\"", name);
    }
    if (t.shape.length !== shape.length || t.shape.some((d, i) => d !== shape[i])) {
      throw new CheckpointError(t.file, `wrong shape [${t.shape.join(", ")}], expected [${shape.join(", ")}]`, name);
    }
    return t;
  }

  /** The weight of linear layer (or embedding) `module`, MLX-quantized where the checkpoint is. */
  matrix(module: string, shape: [number, number]): NativeTensor {
    return this.mlx ? mlxMatrix(this.dir, this.tensors, this.mlx, module, shape) : this.get(`${module}.weight`, shape);
  }

  has(name: string): boolean {
    return this.tensors.has(name);
  }
}

function layerWeights(p: TensorPicker, c: ModelConfig, i: number): NativeLayerWeights {
  const pre = `model.layers.${i}.`;
  const q = c.heads * c.headDim, kv = c.kvHeads * c.headDim;
  const w: NativeLayerWeights = {
    attnNorm: p.get(`${pre}input_layernorm.weight`, [c.hidden]),
    wq: p.matrix(`${pre}self_attn.q_proj`, [q, c.hidden]),
    wk: p.matrix(`${pre}self_attn.k_proj`, [kv, c.hidden]),
    wv: p.matrix(`${pre}self_attn.v_proj`, [kv, c.hidden]),
    wo: p.matrix(`${pre}self_attn.o_proj`, [c.hidden, q]),
    mlpNorm: p.get(`${pre}post_attention_layernorm.weight`, [c.hidden]),
    gate: p.matrix(`${pre}mlp.gate_proj`, [c.intermediate, c.hidden]),
    up: p.matrix(`${pre}mlp.up_proj`, [c.intermediate, c.hidden]),
    down: p.matrix(`${pre}mlp.down_proj`, [c.hidden, c.intermediate]),
  };
  if (c.qkvBias) {
    w.bq = p.get(`${pre}self_attn.q_proj.bias`, [q]);
    w.bk = p.get(`${pre}self_attn.k_proj.bias`, [kv]);
    w.bv = p.get(`${pre}self_attn.v_proj.bias`, [kv]);
  }
  if (c.qkNorm) {
    w.qNorm = p.get(`${pre}self_attn.q_norm.weight`, [c.headDim]);
    w.kNorm = p.get(`${pre}self_attn.k_norm.weight`, [c.headDim]);
  }
  return w;
}

/** Loads and validates `dir` (or a `.gguf` file); tensor data stays in the files (the addon maps them). */
export function loadCheckpoint(dir: string): Checkpoint {
  if (dir.endsWith(".gguf") && fs.statSync(dir, { throwIfNoEntry: false })?.isFile()) return loadGgufCheckpoint(dir);
  const config = readModelConfig(dir);
  const tensors = collectTensors(shardFiles(dir));
  const mlx = readMlxQuantization(dir);
  const p = new TensorPicker(dir, tensors, mlx);
  const embed = p.matrix("model.embed_tokens", [config.vocab, config.hidden]);
  const tied = config.tieEmbeddings && !p.has("lm_head.weight");
  const weights: NativeWeights = {
    embed,
    finalNorm: p.get("model.norm.weight", [config.hidden]),
    lmHead: tied ? embed : p.matrix("lm_head", [config.vocab, config.hidden]),
    layers: Array.from({ length: config.layers }, (_, i) => layerWeights(p, config, i)),
  };
  const weightBytes = [...new Set([weights.lmHead, ...weights.layers.flatMap((l) => Object.values(l) as NativeTensor[])])]
    .reduce((sum, t) => sum + t.byteLength + (t.mlx ? t.mlx.scales.byteLength + t.mlx.biases.byteLength : 0), 0);
  return { dir, config, weights, weightBytes, ...(mlx ? { quantization: describeMlx(mlx) } : {}) };
}
