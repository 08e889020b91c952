/**
 * MLX-quantized checkpoints (mlx-community's affine 4- and 8-bit safetensors), kept quantized:
 * the fixture against its float32 references, greedy continuations, batch invariance; the matmul
 * for bits 4 and 8 × groups 32, 64 and 128 against a TypeScript dequantize-then-fp64 product, with
 * every kernel set forced in turn; tied and untied quantized embeddings; per-layer overrides;
 * clear errors; and the model served. Kernel sets are fixed per process (WEFT_ISA), so each runs
 * in a child: this file itself, with WEFT_MLX_DUMP naming the folder its logits go to.
 *
 * The matmul is probed through a real model: one layer whose matrices are zero, so the logits are
 * exactly lm_head · rmsnorm(embedding row), with the MLX matrix under test as lm_head.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { FIXTURES, readReference, readReferenceLogits, tempDir, tokenizerPackageDir } from "./helpers.js";
import { mlxDequantize, mlxQuantize, writeMlxCopy } from "./support/mlx-quantize.js";
import { nativeRmsnorm } from "./support/native-rmsnorm.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { exportGguf } from "../src/model/gguf-export.js";
import { readSafetensors, readTensorBytes, writeSafetensors, type TensorToWrite } from "../src/model/safetensors.js";
import { ModelRunner, type RunnerSequence } from "../src/runtime/model-runner.js";
import { loadNative, type ComputeDtype, type KernelSet } from "../src/runtime/native.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

const MLX = "tiny-qwen3-mlx-4bit";
const MLX_DIR = path.join(FIXTURES, MLX);
const BLOCK = 16;
const blocks = (n: number, offset = 1): number[] => Array.from({ length: Math.ceil(n / BLOCK) }, (_, i) => offset + i * 2);
const seq = (ids: number[], offset = 1): RunnerSequence => ({ tokenIds: ids, startPosition: 0, blockTable: blocks(ids.length, offset), sample: null, allLogits: true });

// ---- the matmul probe: K inputs, ROWS outputs = activation rows ----

// K = 1536: one whole and one partial chunk of the AVX-512 kernel's 1024 dequantized inputs;
// ROWS = 42: a partial panel of 4 columns and a partial tile of rows in every kernel set.
const K = 1536, ROWS = 42, RMS_EPS = Math.fround(1e-6);
/**
 * Steps the probe's tokens are run in: alone, 2 and 3 (dequantized in registers), 5 (a buffered
 * tile and a tail), all at once, and 130 (each token about three times: three blocks of rows).
 */
const STEP_SIZES = [1, 2, 3, 5, 130, ROWS];
const SHAPES = [4, 8].flatMap((bits) => [32, 64, 128].map((group) => ({ bits: bits as 4 | 8, group })));

/** Deterministic gaussian-ish values with a few outliers, as weights and activations have. */
function gaussian(n: number, seed: number, scale = 1): Float32Array {
  let s = seed >>> 0;
  const rand = (): number => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
  return new Float32Array(n).map(() => Math.sqrt(-2 * Math.log(rand() + 1e-12)) * Math.cos(2 * Math.PI * rand()) * scale * (rand() < 0.01 ? 8 : 1));
}

const bytes = (a: ArrayBufferView): Uint8Array => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);

interface Probe { dir: string; weights: Float32Array; embed: Float32Array }

/** A one-layer Llama MLX checkpoint whose logits are lm_head (ROWS × K, quantized) · rmsnorm(embedding row). */
function probe(bits: 4 | 8, group: number, seed: number): Probe {
  const dir = tempDir(`weft-mlx-probe-${bits}-${group}-`);
  const q = mlxQuantize(gaussian(ROWS * K, 101 + seed, 0.05), ROWS, K, bits, group);
  const embed = gaussian(ROWS * K, 7 + seed);
  const inter = 32, heads = 2, hd = 8;  // a small attention and MLP: they only add exact zeros
  const f32 = (name: string, shape: number[], fill = 0): TensorToWrite =>
    ({ name, dtype: "F32", shape, data: bytes(new Float32Array(shape.reduce((a, b) => a * b, 1)).fill(fill)) });
  // The layer's matrices are zero: quantized (every word, scale and bias 0) where the group divides their inputs.
  const zeros = (module: string, rows: number, cols: number): TensorToWrite[] => cols % group !== 0 ? [f32(`${module}.weight`, [rows, cols])] : [
    { name: `${module}.weight`, dtype: "U32", shape: [rows, (cols * bits) / 32], data: new Uint8Array((rows * cols * bits) / 8) },
    ...["scales", "biases"].map((p): TensorToWrite => ({ name: `${module}.${p}`, dtype: "BF16", shape: [rows, cols / group], data: new Uint8Array((rows * cols * 2) / group) })),
  ];
  writeSafetensors(path.join(dir, "model.safetensors"), [
    { name: "model.embed_tokens.weight", dtype: "F32", shape: [ROWS, K], data: bytes(embed) },
    { name: "lm_head.weight", dtype: "U32", shape: [ROWS, (K * bits) / 32], data: bytes(q.words) },
    { name: "lm_head.scales", dtype: "BF16", shape: [ROWS, K / group], data: bytes(q.scales) },
    { name: "lm_head.biases", dtype: "BF16", shape: [ROWS, K / group], data: bytes(q.biases) },
    f32("model.norm.weight", [K], 1), f32("model.layers.0.input_layernorm.weight", [K], 1), f32("model.layers.0.post_attention_layernorm.weight", [K], 1),
    ...["q_proj", "k_proj", "v_proj"].flatMap((n) => zeros(`model.layers.0.self_attn.${n}`, heads * hd, K)), ...zeros("model.layers.0.self_attn.o_proj", K, heads * hd),
    ...zeros("model.layers.0.mlp.gate_proj", inter, K), ...zeros("model.layers.0.mlp.up_proj", inter, K), ...zeros("model.layers.0.mlp.down_proj", K, inter),
  ]);
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({
    architectures: ["LlamaForCausalLM"], hidden_size: K, intermediate_size: inter, num_hidden_layers: 1, num_attention_heads: heads,
    num_key_value_heads: heads, head_dim: hd, vocab_size: ROWS, rms_norm_eps: 1e-6, max_position_embeddings: 256, tie_word_embeddings: false,
    eos_token_id: 0, quantization: { group_size: group, bits },
  }));
  return { dir, weights: mlxDequantize(q, ROWS, K, bits, group), embed };
}

/** Each token's logits, the ROWS tokens run as single-token sequences `step` at a time (a step beyond ROWS repeats them). */
async function probeLogits(dir: string, step: number): Promise<Float32Array[]> {
  const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 160, blockSize: BLOCK });
  try {
    const req = (t: number, i: number): RunnerSequence => ({ tokenIds: [t], startPosition: 0, blockTable: [i], sample: null, allLogits: true });
    const out: Float32Array[] = [];
    for (let t = 0; t < ROWS; t += step) {
      const tokens = Array.from({ length: step > ROWS ? step : Math.min(step, ROWS - t) }, (_, i) => (t + i) % ROWS);
      const logits = (await runner.execute(tokens.map(req))).logits!.map((l) => l!);
      // A longer step: every repeat of a token must give the same bits; keep the first.
      logits.forEach((l, i) => assert.ok(i < ROWS || Buffer.compare(Buffer.from(bytes(l)), Buffer.from(bytes(logits[i % ROWS]!))) === 0, `row ${i} of a step of ${step}`));
      out.push(...logits.slice(0, ROWS));
    }
    return out;
  } finally {
    await runner.dispose();
  }
}

// ---- child: the probes' logits (and the fixture's) under a forced kernel set ----

async function dump(dir: string, probes: string[]): Promise<void> {
  for (const [i, p] of probes.entries()) {
    const logits = await probeLogits(p, ROWS);
    fs.writeFileSync(path.join(dir, `probe-${i}.bin`), Buffer.concat(logits.map((l) => bytes(l))));
  }
  fs.writeFileSync(path.join(dir, "isa.txt"), loadNative().isa());
}

if (process.env.WEFT_MLX_DUMP) {
  await dump(process.env.WEFT_MLX_DUMP, JSON.parse(process.env.WEFT_MLX_PROBES!) as string[]);
  process.exit(0);
}

// ---- the fixture ----

async function fixtureLogits(dtype: ComputeDtype): Promise<Float32Array[]> {
  const runner = await ModelRunner.create(loadCheckpoint(MLX_DIR), { numBlocks: 64, blockSize: BLOCK }, dtype);
  try {
    const out: Float32Array[] = [];
    for (const ref of readReference(MLX)) out.push((await runner.execute([seq(ref.input_ids)])).logits![0]!);
    return out;
  } finally {
    await runner.dispose();
  }
}

/** Largest |Δlogit| against the fixture's float32 references, absolute and relative to each position's largest logit. */
function referenceError(logits: Float32Array[]): { maxAbs: number; maxRel: number } {
  const ref = readReferenceLogits(MLX), V = loadCheckpoint(MLX_DIR).config.vocab;
  let maxAbs = 0, maxRel = 0;
  logits.forEach((got, i) => {
    const expected = ref.get(`logits_${i}`)!.data as Float32Array;
    (ref.get(`positions_${i}`)!.data as BigInt64Array).forEach((p, j) => {
      let scale = 0;
      for (let v = 0; v < V; v++) scale = Math.max(scale, Math.abs(expected[j * V + v]!));
      for (let v = 0; v < V; v++) {
        const d = Math.abs(got[Number(p) * V + v]! - expected[j * V + v]!);
        maxAbs = Math.max(maxAbs, d);
        maxRel = Math.max(maxRel, d / scale);
      }
    });
  });
  return { maxAbs, maxRel };
}

test("fixture: loads with every matrix MLX 4-bit (group 64) and the quantized embedding as the tied lm_head", () => {
  const ck = loadCheckpoint(MLX_DIR);
  assert.equal(ck.quantization, "mlx-4bit-g64");
  const w = ck.weights;
  assert.equal(w.lmHead, w.embed);
  for (const t of [w.embed, ...w.layers.flatMap((l) => [l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down])]) {
    assert.equal(t.dtype, "mlx4");
    assert.equal(t.mlx?.groupSize, 64);
  }
  assert.deepEqual(w.embed.shape, [151936, 128]);
  // Weight bytes: the words and the bf16 scales and biases, not a dequantized copy.
  const words = w.embed.byteLength + w.layers.reduce((s, l) => s + [l.wq, l.wk, l.wv, l.wo, l.gate, l.up, l.down].reduce((a, t) => a + t.byteLength, 0), 0);
  assert.ok(ck.weightBytes < words * 1.2, `${ck.weightBytes} bytes for ${words} bytes of words`);
});

for (const dtype of ["float32", "bfloat16"] as const) {
  test(`fixture (${dtype}): logits match the float32 references (dequantized weights) at every reference position`, async () => {
    const { maxAbs, maxRel } = referenceError(await fixtureLogits(dtype));
    console.log(`NOTICE: ${MLX} ${dtype}: max |Δlogit| ${maxAbs.toExponential(3)}, relative to the logit scale ${maxRel.toExponential(3)}`);
    // float32 noise: what the float fixtures give in test/fidelity.test.ts (MLX matrices compute in fp32 in either mode).
    assert.ok(maxRel < 1e-4, `relative error ${maxRel}`);
  });
}

test("fixture: greedy continuations equal the references'", async () => {
  const runner = await ModelRunner.create(loadCheckpoint(MLX_DIR), { numBlocks: 64, blockSize: BLOCK });
  try {
    for (const ref of readReference(MLX)) {
      const ids = [...ref.input_ids], table = blocks(ids.length + ref.greedy_continuation.length);
      const params = defaultSamplingParams({ temperature: 0 }), generated: number[] = [];
      let start = 0;
      while (generated.length < ref.greedy_continuation.length) {
        const out = await runner.execute([{ tokenIds: ids.slice(start), startPosition: start, blockTable: table,
          sample: { params, counter: generated.length, promptIds: ref.input_ids, outputIds: generated } }]);
        start = ids.length;
        generated.push(out.samples[0]!.tokenId);
        ids.push(out.samples[0]!.tokenId);
      }
      assert.deepEqual(generated, ref.greedy_continuation);
    }
  } finally {
    await runner.dispose();
  }
});

test("fixture: a prompt's logits are bit-identical alone and behind other sequences", async () => {
  const runner = await ModelRunner.create(loadCheckpoint(MLX_DIR), { numBlocks: 64, blockSize: BLOCK });
  try {
    const [a, b] = readReference(MLX).map((r) => r.input_ids) as [number[], number[]];
    const alone = (await runner.execute([seq(b, 1)])).logits![0]!;
    const others = [seq(a, 20), seq([5, 6, 7], 30), seq(a.slice(0, 3), 34)];
    const batched = (await runner.execute([...others, seq(b, 1)])).logits![3]!;
    assert.equal(Buffer.compare(Buffer.from(bytes(alone)), Buffer.from(bytes(batched))), 0);
  } finally {
    await runner.dispose();
  }
});

// ---- the matmul, bits × group sizes, every kernel set ----

const probes = SHAPES.map(({ bits, group }, i) => ({ bits, group, ...probe(bits, group, i) }));

const features = loadNative().cpuFeatures();
/** The kernel sets with their own MLX matmul: AVX-512 (amx and avx512bf16 share it), AVX2, scalar. */
const SETS: { isa: KernelSet; ok: boolean }[] = [{ isa: "avx512", ok: features.avx512 }, { isa: "avx2", ok: features.avx2 }, { isa: "scalar", ok: true }];
const dumps = new Map<KernelSet, string>();
function dumpFor(isa: KernelSet): string {
  let dir = dumps.get(isa);
  if (!dir) {
    dir = tempDir("weft-mlx-isa-");
    execFileSync(process.execPath, [fileURLToPath(import.meta.url)],
      { env: { ...process.env, WEFT_ISA: isa, WEFT_MLX_DUMP: dir, WEFT_MLX_PROBES: JSON.stringify(probes.map((p) => p.dir)) } });
    assert.equal(fs.readFileSync(path.join(dir, "isa.txt"), "utf8"), isa);
    dumps.set(isa, dir);
  }
  return dir;
}

for (const [i, p] of probes.entries()) {
  test(`matmul ${p.bits}-bit, group ${p.group}: against dequantize + fp64 product, batch-invariant, every kernel set the same bits`, async () => {
    const batched = await probeLogits(p.dir, ROWS);
    const alone = await probeLogits(p.dir, 1);
    for (const step of STEP_SIZES.slice(1, -1)) {
      const got = await probeLogits(p.dir, step);
      for (let t = 0; t < ROWS; t++) assert.ok(got[t]!.every((v, j) => Object.is(v, batched[t]![j])), `token ${t} differs in steps of ${step} and of ${ROWS}`);
    }
    let worst = 0;
    for (let t = 0; t < ROWS; t++) {
      assert.ok(alone[t]!.every((v, j) => Object.is(v, batched[t]![j])), `token ${t} differs alone and in a batch of ${ROWS}`);
      const x = nativeRmsnorm(p.embed.subarray(t * K, (t + 1) * K), RMS_EPS);
      for (let n = 0; n < ROWS; n++) {
        let exact = 0, mag = 0;
        for (let k = 0; k < K; k++) {
          exact += p.weights[n * K + k]! * x[k]!;
          mag += Math.abs(p.weights[n * K + k]! * x[k]!);
        }
        // fp32 FMAs over 16 lanes of K/16 terms, then 4 additions: a few ulps of Σ|w·x|.
        worst = Math.max(worst, Math.abs(alone[t]![n]! - exact) / (1e-5 * mag + 1e-30));
      }
    }
    console.log(`NOTICE: mlx ${p.bits}-bit g${p.group}: worst error ${worst.toFixed(4)} of the fp32 tolerance (1e-5 · Σ|w·x|)`);
    assert.ok(worst <= 1, `${worst} of the fp32 tolerance`);

    const flat = Buffer.concat(batched.map((l) => bytes(l)));
    for (const { isa, ok } of SETS) {
      if (!ok) {
        console.log(`NOTICE: this CPU lacks ${isa} (CPU features ${JSON.stringify(features)}): its MLX matmul is not tested here`);
        continue;
      }
      const got = fs.readFileSync(path.join(dumpFor(isa), `probe-${i}.bin`));
      assert.equal(Buffer.compare(got, flat), 0, `WEFT_ISA=${isa} differs from ${loadNative().isa()}`);
    }
  });
}

// ---- untied quantized embeddings and per-layer overrides: an MLX copy of tiny-llama against its dequantized float32 twin ----

/** Weft's float32 logits of every reference prompt of tiny-llama, on `dir`. */
async function llamaLogits(dir: string): Promise<Float32Array[]> {
  const runner = await ModelRunner.create(loadCheckpoint(dir), { numBlocks: 64, blockSize: BLOCK });
  try {
    const out: Float32Array[] = [];
    for (const ref of readReference("tiny-llama")) out.push((await runner.execute([seq(ref.input_ids)])).logits![0]!);
    return out;
  } finally {
    await runner.dispose();
  }
}

const LLAMA_CASES = [
  { name: "4-bit group 64", bits: 4, groupSize: 64 },
  { name: "8-bit group 32", bits: 8, groupSize: 32 },
  // hidden 64: only down_proj (input 128) divides by 128; the rest stays float, as mlx-lm leaves it
  { name: "4-bit group 128 (only down_proj divides)", bits: 4, groupSize: 128 },
  { name: "per-layer overrides (lm_head float, one down_proj 8-bit group 32)", bits: 4, groupSize: 64,
    overrides: { lm_head: false, "model.layers.0.mlp.down_proj": { bits: 8, group_size: 32 } } },
] as const;

for (const c of LLAMA_CASES) {
  test(`untied embeddings, ${c.name}: quantized embedding and lm_head, logits equal the dequantized float32 model's`, async () => {
    const root = tempDir("weft-mlx-llama-"), mlxDir = path.join(root, "mlx"), f32Dir = path.join(root, "f32");
    writeMlxCopy(path.join(FIXTURES, "tiny-llama"), mlxDir, f32Dir, c);
    const ck = loadCheckpoint(mlxDir), w = ck.weights;
    assert.notEqual(w.lmHead, w.embed);
    if (c.groupSize === 128) {
      assert.deepEqual(w.layers.map((l) => [l.wq.dtype, l.down.dtype, l.down.mlx?.groupSize]), [["f32", "mlx4", 128], ["f32", "mlx4", 128]]);
    } else {
      assert.equal(w.embed.dtype, `mlx${c.bits}`);
      assert.equal(w.layers[1]!.down.dtype, `mlx${c.bits}`);
      assert.equal(w.lmHead.dtype, "overrides" in c ? "f32" : `mlx${c.bits}`);
      assert.deepEqual([w.layers[0]!.down.dtype, w.layers[0]!.down.mlx?.groupSize], "overrides" in c ? ["mlx8", 32] : [`mlx${c.bits}`, c.groupSize]);
    }
    const [got, want] = [await llamaLogits(mlxDir), await llamaLogits(f32Dir)];
    let maxRel = 0;
    got.forEach((g, i) => {
      const V = ck.config.vocab;
      for (let r = 0; r < g.length / V; r++) {
        let scale = 0, d = 0;
        for (let v = 0; v < V; v++) scale = Math.max(scale, Math.abs(want[i]![r * V + v]!));
        for (let v = 0; v < V; v++) d = Math.max(d, Math.abs(g[r * V + v]! - want[i]![r * V + v]!));
        maxRel = Math.max(maxRel, d / scale);
      }
    });
    console.log(`NOTICE: tiny-llama MLX ${c.name}: max |Δlogit| against the dequantized f32 model ${maxRel.toExponential(3)} of the logit scale`);
    assert.ok(maxRel < 1e-4, `relative error ${maxRel}`);
  });
}

// ---- clear errors ----

/** The fixture with `config` changes and tensors dropped or replaced (by name). */
function brokenFixture(config: Record<string, unknown>, edit: (name: string, t: TensorToWrite) => TensorToWrite | null = (_, t) => t): string {
  const dir = tempDir("weft-mlx-bad-");
  const cfg = JSON.parse(fs.readFileSync(path.join(MLX_DIR, "config.json"), "utf8")) as Record<string, unknown>;
  fs.writeFileSync(path.join(dir, "config.json"), JSON.stringify({ ...cfg, ...config }));
  const list: TensorToWrite[] = [];
  for (const [name, t] of readSafetensors(path.join(MLX_DIR, "model.safetensors"))) {
    const dtype = ({ u32: "U32", bf16: "BF16", f16: "F16", f32: "F32" } as const)[t.dtype as "u32" | "bf16" | "f16" | "f32"];
    const out = edit(name, { name, dtype, shape: t.shape, data: () => readTensorBytes(t) });
    if (out) list.push(out);
  }
  writeSafetensors(path.join(dir, "model.safetensors"), list);
  return dir;
}

const ERRORS: { name: string; dir: () => string; error: RegExp }[] = [
  { name: "unsupported bits", dir: () => brokenFixture({ quantization: { group_size: 64, bits: 3 } }), error: /quantization: unsupported bits 3 \(supported: 4, 8\)/ },
  { name: "unsupported group size", dir: () => brokenFixture({ quantization: { group_size: 16, bits: 4 } }), error: /quantization: unsupported group_size 16 \(supported: 32, 64, 128\)/ },
  { name: "unsupported mode", dir: () => brokenFixture({ quantization: { group_size: 32, bits: 4, mode: "mxfp4" } }), error: /unsupported quantization mode "mxfp4" \(supported: affine\)/ },
  { name: "bad per-layer entry", dir: () => brokenFixture({ quantization: { group_size: 64, bits: 4, "model.layers.0.mlp.up_proj": 7 } }), error: /quantization\.model\.layers\.0\.mlp\.up_proj: expected a per-layer \{group_size, bits\} or false/ },
  { name: "missing scales", dir: () => brokenFixture({}, (n, t) => (n === "model.layers.1.self_attn.q_proj.scales" ? null : t)), error: /tensor model\.layers\.1\.self_attn\.q_proj\.scales\): missing tensor/ },
  { name: "missing biases", dir: () => brokenFixture({}, (n, t) => (n === "model.layers.0.mlp.down_proj.biases" ? null : t)), error: /tensor model\.layers\.0\.mlp\.down_proj\.biases\): missing tensor/ },
  { name: "words of another width (config says 8 bits, stored 4)", dir: () => brokenFixture({ quantization: { group_size: 64, bits: 8 } }), error: /tensor model\.embed_tokens\.weight\): wrong shape \[151936, 16\], expected \[151936, 32\] \(8-bit words of \[151936, 128\]\)/ },
  { name: "scales of another group size (config says 32, stored 64)", dir: () => brokenFixture({ quantization: { group_size: 32, bits: 4 } }), error: /tensor model\.embed_tokens\.scales\): wrong shape \[151936, 2\], expected \[151936, 4\] \(one per group of 32\)/ },
  { name: "scales and biases of different dtypes", dir: () => brokenFixture({}, (n, t) => (n === "model.norm.weight" ? t : n === "model.layers.0.self_attn.o_proj.biases" ? { ...t, dtype: "F16" } : t)), error: /tensor model\.layers\.0\.self_attn\.o_proj\.biases\): dtype f16 differs from the scales' bf16/ },
  { name: "U32 weights without quantization in config.json", dir: () => brokenFixture({ quantization: undefined, quantization_config: undefined }), error: /tensor model\.embed_tokens\.weight\): U32 tensor, but config\.json has no MLX "quantization"/ },
  { name: "a layer the config leaves float but stored quantized", dir: () => brokenFixture({ quantization: { group_size: 64, bits: 4, lm_head: false, "model.layers.0.mlp.up_proj": false } }), error: /config\.json leaves model\.layers\.0\.mlp\.up_proj unquantized/ },
];

for (const e of ERRORS) {
  test(`clear error: ${e.name}`, () => {
    assert.throws(() => loadCheckpoint(e.dir()), e.error);
  });
}

test("clear error: export-gguf refuses an MLX checkpoint rather than misreading its words", () => {
  assert.throws(() => exportGguf(MLX_DIR, path.join(tempDir(), "out.gguf")), /export-gguf reads float checkpoints; this one is quantized \(mlx-4bit-g64\)/);
});

// ---- served ----

test("served: weft serve's model loads, /v1/models shows the quantization, greedy text is reproducible", async () => {
  const dir = tempDir("weft-mlx-served-");
  fs.copyFileSync(path.join(MLX_DIR, "config.json"), path.join(dir, "config.json"));
  fs.symlinkSync(path.join(MLX_DIR, "model.safetensors"), path.join(dir, "model.safetensors"));
  for (const f of ["tokenizer.json", "tokenizer_config.json"]) fs.copyFileSync(path.join(tokenizerPackageDir("qwen3"), f), path.join(dir, f));
  const { startServer, greedyCompletion } = await import("./support/server.js");
  const s = await startServer({ models: { mlx: dir } });
  try {
    const ask = (): ReturnType<typeof greedyCompletion> => greedyCompletion(s.url, "mlx", 8);
    const a = await ask();
    assert.equal(a.tokens, 8);
    assert.deepEqual(await ask(), a);
    const card = (await (await fetch(`${s.url}/v1/models/mlx`)).json()) as Record<string, unknown>;
    assert.equal(card.quantization, "mlx-4bit-g64");
    assert.ok(s.logs.some((l) => l.includes("model mlx") && l.includes("(mlx-4bit-g64)")), "the start-up log names the quantization");
  } finally {
    await s.close();
  }
});
