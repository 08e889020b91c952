/**
 * Weft against llama.cpp (node-llama-cpp, with probabilities) on the same
 * Q8_0 and Q4_K_M files of a Qwen3 and a Llama model: float GGUFs from
 * `exportGguf`, quantized by llama.cpp's own `llama_model_quantize`.
 *
 * - Token ids: Weft's tokenizer built from the file gives llama.cpp's ids.
 * - Log-probs: at every position of a prompt and its 12-token greedy
 *   continuation, over llama.cpp's top-k tokens, |Δ log-prob| between the
 *   engines stays within TOLERANCE. The yardstick is how far llama.cpp itself
 *   moves between the F16 file and the quantized one (same measure, same
 *   positions): see docs/QUANTIZATION.md for the numbers.
 * - Greedy: llama.cpp's greedy continuation, fed to Weft token by token, is
 *   Weft's argmax at every step except near-ties: steps where llama.cpp's
 *   top-2 log-probs are closer than 2 × TOLERANCE (each can be off by the
 *   tolerance, so the order of two tokens that close is not determined).
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import os from "node:os";
import path from "node:path";
import { exportGguf } from "../src/model/gguf-export.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { llamaQuantized } from "../src/bench/llama-quantize.js";
import { makePeakedModel, type PeakedFamily } from "./support/peaked-model.js";
import { tempDir } from "./helpers.js";

/** Top tokens compared at each position. */
const TOP_K = 10;
/**
 * Largest |Δ log-prob| allowed between Weft and llama.cpp on the same file: 1.5 × the largest
 * measured over both families (Q8_0 0.263, Q4_K_M 0.540; docs/QUANTIZATION.md gives the
 * measurements and why they are this size).
 */
const TOLERANCE = { q8_0: 0.4, q4_k_m: 0.8 } as const;
const CONTINUATION = 12;

const PROMPTS: Record<PeakedFamily, string[]> = {
  qwen3: ["The history of France is", "def fibonacci(n):\n    return", "我爱自然语言处理。", "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n"],
  llama: ["The history of France is", "def fibonacci(n):\n    return", "我爱自然语言处理。", "[INST] Numbers: 1, 2, 3, [/INST]"],
};
const TEXTS = [
  " leading space", "trailing  spaces  ", "\tTabs\nand\r\nnewlines\n\n", "Numbers 1234567 and 3.14159, 1,000,000",
  "한국어 텍스트와 Ελληνικά", "don't won't I'LL", "a\u0301 vs \u00e1", "invalid \ud800 surrogate", "code: `x = f(a) -> {k: v}`;",
  "https://example.com/path?q=1&r=2", "<think>\nreasoning\n</think>", "<s> and </s> as text", "emoji 😀👍🏽 and flags 🇫🇷",
];

type Llama = import("node-llama-cpp").Llama;
type LlamaModel = import("node-llama-cpp").LlamaModel;
type Token = import("node-llama-cpp").Token;
let llama: Llama | undefined;
after(async () => { await llama?.dispose(); });

async function loadLlamaCpp(file: string): Promise<LlamaModel> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  llama ??= await getLlama({ gpu: false, logLevel: LlamaLogLevel.error, maxThreads: os.cpus().length });
  return llama.loadModel({ modelPath: file, gpuLayers: 0 });
}

interface Files { f16: string; q8_0: string; q4_k_m: string }
const files = new Map<PeakedFamily, Files>();
function filesOf(family: PeakedFamily): Files {
  let f = files.get(family);
  if (!f) {
    const dir = tempDir(`weft-fidelity-${family}-`);
    const f16 = path.join(dir, `${family}-f16.gguf`);
    exportGguf(makePeakedModel(family, path.join(dir, "model")), f16, "f16");
    f = { f16, q8_0: llamaQuantized(f16, "q8_0"), q4_k_m: llamaQuantized(f16, "q4_k_m") };
    files.set(family, f);
  }
  return f;
}

/** Prompt ids as both engines are given them: BOS first when the file asks for it. */
function promptIds(tok: TextTokenizer, text: string): number[] {
  return tok.encode(text, true);
}

/** Probabilities (sorted, highest first) llama.cpp gives after each of `ids[from..]`, and its greedy continuation of `prompt` when asked. */
async function llamaCppRun(file: string, vocab: number, prompts: number[][], sequences?: number[][]): Promise<{ ids: number[][]; probs: Map<number, number>[][] }> {
  const model = await loadLlamaCpp(file);
  const ctx = await model.createContext({ contextSize: 256, sequences: 1, threads: os.cpus().length });
  try {
    const ids: number[][] = [], probs: Map<number, number>[][] = [];
    const seq = ctx.getSequence();
    for (const [i, prompt] of prompts.entries()) {
      await seq.clearHistory();
      let all = sequences?.[i];
      if (!all) {
        const cont: number[] = [];
        for await (const t of seq.evaluate(prompt as Token[], { temperature: 0, yieldEogToken: true })) {
          cont.push(t);
          if (cont.length === CONTINUATION) break;
        }
        await seq.clearHistory();
        all = [...prompt, ...cont];
      }
      const items = all.map((t, j) => (j < prompt.length - 1 ? (t as Token) : ([t as Token, { generateNext: { probabilities: true, options: { temperature: 0 } } }] as const)));
      const out = await seq.controlledEvaluate(items.slice(0, -1) as Parameters<typeof seq.controlledEvaluate>[0]);
      const rows = out.slice(prompt.length - 1).map((o) => {
        const p = o?.next.probabilities;
        assert.ok(p && p.size === vocab, `llama.cpp gave ${p?.size} probabilities, not the whole vocabulary`);
        return p as Map<number, number>;
      });
      ids.push(all);
      probs.push(rows);
    }
    return { ids, probs };
  } finally {
    await ctx.dispose();
    await model.dispose();
  }
}

/** A row's log-probs, read lazily: logit − logsumexp. */
interface LogitRow { logits: Float32Array; lse: number }

function logitRow(logits: Float32Array): LogitRow {
  let max = -Infinity, sum = 0;
  for (const v of logits) max = Math.max(max, v);
  for (const v of logits) sum += Math.exp(v - max);
  return { logits, lse: max + Math.log(sum) };
}

/** Weft's log-probs after each of `ids[from - 1..]` (all rows in one prefill). */
async function weftLogprobs(file: string, sequences: number[][], from: number[]): Promise<LogitRow[][]> {
  const ck = loadCheckpoint(file);
  const runner = await ModelRunner.create(ck, { numBlocks: 16, blockSize: 16 });
  try {
    const V = ck.config.vocab;
    const out: LogitRow[][] = [];
    for (const [i, ids] of sequences.entries()) {
      const table = Array.from({ length: Math.ceil(ids.length / 16) }, (_, b) => b);
      const logits = (await runner.execute([{ tokenIds: ids.slice(0, -1), startPosition: 0, blockTable: table, sample: null, allLogits: true }])).logits![0]!;
      out.push(Array.from({ length: ids.length - from[i]! }, (_, j) => logitRow(logits.subarray((from[i]! - 1 + j) * V, (from[i]! + j) * V))));
    }
    return out;
  } finally {
    await runner.dispose();
  }
}

/** At each position, the largest |Δ log-prob| over `ref`'s top-k tokens (`ref`: probabilities, sorted). */
function topKErrors(ref: Map<number, number>[][], got: (i: number, j: number, t: number) => number): number[] {
  return ref.flatMap((rows, i) => rows.map((row, j) => {
    let k = 0, worst = 0;
    for (const [t, p] of row) {
      if (k++ === TOP_K) break;
      worst = Math.max(worst, Math.abs(got(i, j, t) - Math.log(p)));
    }
    return worst;
  }));
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

for (const family of ["qwen3", "llama"] as const) {
  test(`${family}: Weft's tokenizer from the quantized files gives llama.cpp's ids`, async () => {
    const f = filesOf(family);
    for (const file of [f.q8_0, f.q4_k_m]) {
      const tok = TextTokenizer.fromDir(file);
      const model = await loadLlamaCpp(file);
      try {
        const texts = [...TEXTS, ...PROMPTS[family]];
        const diffs = texts.flatMap((t) => {
          const [got, want] = [tok.encode(t, false), model.tokenize(t, true).map(Number)];
          return JSON.stringify(got) === JSON.stringify(want) ? [] : [`${JSON.stringify(t)}: weft ${JSON.stringify(got)} llama.cpp ${JSON.stringify(want)}`];
        });
        assert.deepEqual(diffs, [], path.basename(file));
      } finally {
        await model.dispose();
      }
    }
  });

  for (const type of ["q8_0", "q4_k_m"] as const) {
    test(`${family} ${type}: greedy agrees with llama.cpp except at near-ties; top-${TOP_K} log-probs within the measured tolerance`, async () => {
      const f = filesOf(family);
      const tok = TextTokenizer.fromDir(f[type]);
      const prompts = PROMPTS[family].map((p) => promptIds(tok, p));
      const vocab = loadCheckpoint(f[type]).config.vocab;
      const ref = await llamaCppRun(f[type], vocab, prompts);
      const f16 = await llamaCppRun(f.f16, vocab, prompts, ref.ids);
      const weft = await weftLogprobs(f[type], ref.ids, prompts.map((p) => p.length));

      const lp = (r: LogitRow, t: number): number => r.logits[t]! - r.lse;
      const vsLlama = topKErrors(ref.probs, (i, j, t) => lp(weft[i]![j]!, t));
      const yardstick = topKErrors(ref.probs, (i, j, t) => Math.log(f16.probs[i]![j]!.get(t)!));
      const tol = TOLERANCE[type];
      let ties = 0, differ = 0, widestDiffering = 0;
      const flips: string[] = [];
      ref.probs.forEach((rows, i) => rows.forEach((row, j) => {
        const want = ref.ids[i]![prompts[i]!.length + j]!;
        const [p1, p2] = row.values();
        const gap = Math.log(p1!) - Math.log(p2!);
        const w = weft[i]![j]!.logits;
        const got = w.reduce((best, v, t) => (v > w[best]! ? t : best), 0);
        if (gap < 2 * tol) ties++;
        if (got !== want) [differ, widestDiffering] = [differ + 1, Math.max(widestDiffering, gap)];
        if (got !== want && gap >= 2 * tol) flips.push(`prompt ${i} step ${j}: llama.cpp ${want}, Weft ${got}, top-2 gap ${gap.toFixed(4)}`);
      }));
      const [wMax, yMax] = [Math.max(...vsLlama), Math.max(...yardstick)];
      console.log(`NOTICE: ${family} ${type}, ${vsLlama.length} positions, |Δ log-prob| over llama.cpp's top-${TOP_K}, median / max: ` +
        `Weft vs llama.cpp ${median(vsLlama).toFixed(4)} / ${wMax.toFixed(4)}; llama.cpp F16 vs ${type} ${median(yardstick).toFixed(4)} / ${yMax.toFixed(4)}; ` +
        `greedy: ${differ} of ${vsLlama.length} choices differ (widest top-2 gap among them ${widestDiffering.toFixed(3)}), ${ties} near-ties (top-2 gap < ${2 * tol})`);
      assert.deepEqual(flips, [], "greedy choices differ where the top-2 gap is above the near-tie band");
      assert.ok(wMax <= tol, `${family} ${type}: Weft's log-probs are up to ${wMax} from llama.cpp's (tolerance ${tol})`);
      assert.ok(median(vsLlama) < median(yardstick), "Weft and llama.cpp on one file differ less than llama.cpp moves between the F16 file and this one");
    });
  }
}
