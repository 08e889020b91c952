/**
 * bfloat16 mode: every kernel set, forced in turn, against transformers' own bf16 error band; the
 * sets against each other; batch invariance per set; greedy tokens; `auto`; the mode on /v1/models.
 * Kernel sets are fixed per process (WEFT_ISA), so each runs in a child: this file itself, with
 * WEFT_BF16_DUMP naming the folder it writes its logits to.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { FIXTURES, readReference, tempDir } from "./helpers.js";
import { argmax, band, bandError, tieGap } from "./support/bf16-band.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner, resolveDtype, type RunnerSequence } from "../src/runtime/model-runner.js";
import { loadNative, type KernelSet } from "../src/runtime/native.js";
import { fixtureModelDir, startServer } from "./support/server.js";
import { offlineBench } from "../src/bench/offline.js";

const MODELS = ["tiny-llama", "tiny-qwen3"] as const;
const BLOCK = 16;
/** Kernel sets in pair order (bit-identical to one another); AMX reduces in tile order. */
const PAIR_ORDER: KernelSet[] = ["avx512bf16", "avx512", "avx2", "scalar"];
const ALL: KernelSet[] = ["amx", ...PAIR_ORDER];

const blocks = (n: number, offset = 1): number[] => Array.from({ length: Math.ceil(n / BLOCK) }, (_, i) => offset + i * 2);

/** Child: every reference prompt's logits at every position, and whether a prompt's rows are the same alone and in a batch. */
async function dumpLogits(dir: string): Promise<void> {
  const result: Record<string, unknown> = { isa: loadNative().isa() };
  for (const model of MODELS) {
    const ckpt = loadCheckpoint(path.join(FIXTURES, model));
    const runner = await ModelRunner.create(ckpt, { numBlocks: 128, blockSize: BLOCK }, "bfloat16");
    const refs = readReference(model);
    for (const [i, ref] of refs.entries()) {
      const out = await runner.execute([{ tokenIds: ref.input_ids, startPosition: 0, blockTable: blocks(ref.input_ids.length), sample: null, allLogits: true }]);
      fs.writeFileSync(path.join(dir, `${model}-${i}.bin`), out.logits![0]!);
    }
    // The longest prompt alone, then behind 40 rows of other prompts (its rows cross AMX's 16- and 32-row tiles).
    const target = refs.reduce((a, b) => (b.input_ids.length > a.input_ids.length ? b : a)).input_ids;
    const seq = (ids: number[], offset: number): RunnerSequence => ({ tokenIds: ids, startPosition: 0, blockTable: blocks(ids.length, offset), sample: null, allLogits: true });
    const alone = (await runner.execute([seq(target, 1)])).logits![0]!;
    const others = Array.from({ length: 40 }, (_, j) => (j * 7919 + 13) % ckpt.config.vocab);
    const batched = (await runner.execute([seq(others, 64), seq(target, 1)])).logits![1]!;
    result[`${model}-invariant`] = Buffer.compare(Buffer.from(alone.buffer), Buffer.from(batched.buffer)) === 0;
    await runner.dispose();
  }
  fs.writeFileSync(path.join(dir, "result.json"), JSON.stringify(result));
}

if (process.env.WEFT_BF16_DUMP) {
  await dumpLogits(process.env.WEFT_BF16_DUMP);
  process.exit(0);
}

interface Dump {
  isa: string;
  invariant: Record<string, boolean>;
  logits: (model: string, prompt: number) => Float32Array;
}

const features = loadNative().cpuFeatures();
const available: Record<KernelSet, boolean> = {
  amx: features.amx, avx512bf16: features.avx512bf16, avx512: features.avx512, avx2: features.avx2, scalar: true,
};

const dumps = new Map<KernelSet, Dump>();
function dumpFor(isa: KernelSet): Dump {
  const cached = dumps.get(isa);
  if (cached) return cached;
  const dir = tempDir("weft-bf16-");
  execFileSync(process.execPath, [fileURLToPath(import.meta.url)], { env: { ...process.env, WEFT_ISA: isa, WEFT_BF16_DUMP: dir } });
  const result = JSON.parse(fs.readFileSync(path.join(dir, "result.json"), "utf8")) as Record<string, unknown>;
  const dump: Dump = {
    isa: result.isa as string,
    invariant: Object.fromEntries(MODELS.map((m) => [m, result[`${m}-invariant`] as boolean])),
    logits: (model, i) => {
      const b = fs.readFileSync(path.join(dir, `${model}-${i}.bin`));
      return new Float32Array(b.buffer, b.byteOffset, b.byteLength / 4);
    },
  };
  dumps.set(isa, dump);
  return dump;
}

function skipNotice(isa: KernelSet): string | null {
  if (available[isa]) return null;
  const notice = `NOTICE: this CPU lacks ${isa} (CPU features ${JSON.stringify(features)}): its bfloat16 path is not tested here`;
  console.log(notice);
  return notice;
}

for (const isa of ALL) {
  test(`bfloat16 on ${isa}: within transformers' bf16 band on every reference position, and batch-invariant`, (t) => {
    const notice = skipNotice(isa);
    if (notice) return t.skip(notice);
    const dump = dumpFor(isa);
    assert.equal(dump.isa, isa);
    for (const model of MODELS) {
      const err = bandError(model, (i) => dump.logits(model, i));
      const b = band(model);
      console.log(`${isa} ${model}: max |Δ log-prob| on the top-20 ${err.toFixed(4)} (transformers bf16: CPU ${b.cpu.toFixed(4)}, CUDA ${b.cuda.toFixed(4)})`);
      assert.ok(err <= b.cpu, `${isa} ${model}: ${err} exceeds transformers' CPU bf16 band ${b.cpu}`);
      assert.ok(dump.invariant[model], `${isa} ${model}: a prompt's logits differ alone and in a batch`);
    }
  });
}

test("bfloat16 kernel sets agree: pair-order sets bit for bit, AMX within a bf16 rounding of them", (t) => {
  const present = ALL.filter((isa) => !skipNotice(isa));
  const pair = present.filter((isa) => PAIR_ORDER.includes(isa));
  if (pair.length < 2 && present.length < 2) return t.skip("NOTICE: fewer than two bfloat16 kernel sets on this CPU");
  for (const model of MODELS) {
    readReference(model).forEach((_, i) => {
      const base = dumpFor(pair[0]!).logits(model, i);
      for (const isa of pair.slice(1)) {
        assert.equal(Buffer.compare(Buffer.from(dumpFor(isa).logits(model, i).buffer), Buffer.from(base.buffer)), 0, `${isa} vs ${pair[0]} on ${model} prompt ${i}`);
      }
      if (present.includes("amx")) {
        const amx = dumpFor("amx").logits(model, i);
        let diff = 0, scale = 0;
        amx.forEach((v, j) => {
          diff = Math.max(diff, Math.abs(v - base[j]!));
          scale = Math.max(scale, Math.abs(base[j]!));
        });
        console.log(`amx vs ${pair[0]} ${model} prompt ${i}: max |Δlogit| ${diff.toExponential(3)} (logit scale ${scale.toFixed(3)})`);
        assert.ok(diff / scale < 1e-3, `amx differs from ${pair[0]} by ${diff}`);
      }
    });
  }
});

for (const model of MODELS) {
  test(`${model}: bfloat16 greedy continuations equal the reference's except at near-ties`, async () => {
    const ckpt = loadCheckpoint(path.join(FIXTURES, model));
    const fp32 = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: BLOCK }, "float32");
    const bf16 = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: BLOCK }, "bfloat16");
    const V = ckpt.config.vocab;
    const nearTie = tieGap(model);
    for (const ref of readReference(model)) {
      const ids = [...ref.input_ids];
      const table = blocks(ids.length + ref.greedy_continuation.length);
      for (let step = 0; step < ref.greedy_continuation.length; step++) {
        const seq: RunnerSequence = { tokenIds: ids, startPosition: 0, blockTable: table, sample: null, allLogits: true };
        const last = (r: ModelRunner): Promise<Float32Array> => r.execute([seq]).then((o) => o.logits![0]!.subarray((ids.length - 1) * V));
        const [exact, fast] = [await last(fp32), await last(bf16)];
        const want = ref.greedy_continuation[step]!, got = argmax(fast);
        assert.equal(argmax(exact), want, "float32 follows the reference");
        if (got !== want) {
          const gap = exact[want]! - exact[got]!;
          console.log(`${model}: bfloat16 leaves the reference at step ${step}, where float32's gap is ${gap.toFixed(4)} (near-tie below ${nearTie.toFixed(4)})`);
          assert.ok(gap < nearTie, `bfloat16 picked ${got} over ${want} with a float32 gap of ${gap}`);
          break;
        }
        ids.push(want);
      }
    }
    await Promise.all([fp32.dispose(), bf16.dispose()]);
  });
}

test("auto is bfloat16 exactly when the kernels in use are those chosen for the CPU's bf16 instructions", () => {
  const isa = loadNative().isa();
  // Where vdpbf16ps runs at half the FMA rate, bfloat16 mode without AMX is faster on the avx512 set's FMAs.
  const forBf16 = isa === "amx" || isa === "avx512bf16" || (isa === "avx512" && features.bf16DotHalfRate);
  assert.equal(loadNative().bf16ByDefault(), forBf16);
  assert.equal(resolveDtype("auto"), forBf16 ? "bfloat16" : "float32");
  assert.equal(resolveDtype("float32"), "float32");
  if (!features.avx512bf16) console.log("NOTICE: this CPU has no bf16 hardware, so auto is float32 here");
  else {
    assert.ok(forBf16, `this CPU has bf16 hardware but the default kernels are ${isa}`);
    const expected = features.amx ? "amx" : features.bf16DotHalfRate ? "avx512" : "avx512bf16";
    assert.equal(isa, expected, `the default kernels on this CPU (features ${JSON.stringify(features)})`);
  }
  // A forced kernel set without bf16 hardware makes auto mean float32.
  const forced = execFileSync(process.execPath, ["--input-type=module", "-e",
    `import { resolveDtype } from ${JSON.stringify(path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..", "src", "runtime", "model-runner.js"))};
     process.stdout.write(resolveDtype("auto"));`], { env: { ...process.env, WEFT_ISA: "scalar" } }).toString();
  assert.equal(forced, "float32");
});

test("the compute mode shows in /v1/models and in the start-up log", async () => {
  const s = await startServer({ engine: { dtype: "bfloat16" } });
  try {
    const card = async (): Promise<{ dtype: string; status: string }> =>
      ((await (await fetch(`${s.url}/v1/models`)).json()) as { data: { dtype: string; status: string }[] }).data[0]!;
    assert.equal((await card()).dtype, "bfloat16");
    await s.manager.acquire("tiny", "test");
    assert.deepEqual(await card(), { ...(await card()), status: "ready", dtype: "bfloat16" });
    assert.ok(s.logs.some((l) => /dtype bfloat16, kernels \w+/.test(l)), "start-up log names the mode");
  } finally {
    await s.close();
  }
});

test("the bench JSON states the mode, the measured rooflines and each result's share of its roofline", async () => {
  const json = path.join(tempDir(), "bench.json");
  await offlineBench({ model: fixtureModelDir(), concurrency: [1, 2], numPrompts: 2, promptLen: 8, outputLen: 3, mode: "sweep", json, kvCacheMemory: 2 ** 24, quiet: true, dtype: "bfloat16" });
  const r = JSON.parse(fs.readFileSync(json, "utf8")) as {
    dtype: string; rooflines: Record<string, number>;
    roofline_share: { concurrency: number; decode_bandwidth_pct: number | null; decode_compute_pct: number | null }[];
  };
  assert.equal(r.dtype, "bfloat16");
  assert.ok(r.rooflines.read_gb_s! > 0 && r.rooflines.fp32_gflops! > 0);
  assert.equal(r.rooflines.bf16_dot_gflops! > 0, features.avx512bf16);
  assert.equal(r.rooflines.amx_gflops! > 0, features.amx);
  assert.deepEqual(r.roofline_share.map((s) => [s.concurrency, s.decode_bandwidth_pct !== null, s.decode_compute_pct !== null]), [[1, true, false], [2, false, true]]);
});
