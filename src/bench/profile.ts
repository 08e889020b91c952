/**
 * `weft bench profile`: where a step's time goes, at several batch sizes,
 * straight through the runner (no scheduler): decode steps of B sequences
 * with `context` cached tokens each, and one prefill of `prefill` tokens.
 */
import { loadCheckpoint } from "../model/checkpoint.js";
import { ModelRunner, resolveDevice, resolveDtype, resolveKvCacheDtype, type RunnerSequence } from "../runtime/model-runner.js";
import type { ComputeDtype, Device, KvCacheDtype } from "../runtime/native.js";
import { defaultSamplingParams } from "../engine/sampling-params.js";
import { table } from "./stats.js";
import { resolveModelSource } from "../model/registry.js";

export interface ProfileOptions {
  model: string;
  batch: number[];
  context: number;
  prefill: number;
  steps: number;
  /** Compute mode (default auto). */
  dtype?: ComputeDtype | "auto";
  /** KV cache element (default auto: follows the compute mode). */
  kvCacheDtype?: KvCacheDtype | "auto";
  /** Where the model runs (default auto). */
  device?: Device | "auto";
  /** Sampling of every row (default greedy: temperature 0, top_p 1). */
  temperature?: number;
  topP?: number;
}

export interface ProfileRow extends Record<string, unknown> {
  case: string;
  tokens_per_step: number;
  step_ms: number;
  tokens_per_second: number;
  matmul_pct: number;
  attention_pct: number;
  lm_head_pct: number;
  sampling_pct: number;
  other_native_pct: number;
  typescript_pct: number;
}

export interface ProfileReport {
  /** Device, compute dtype and KV cache element, as the loaded model reports them. */
  header: string;
  rows: ProfileRow[];
}

export async function profileSteps(o: ProfileOptions): Promise<ProfileReport> {
  const ckpt = loadCheckpoint(await resolveModelSource(o.model, { log: (m) => void process.stderr.write(`${m}\n`) }));
  const blockSize = 32;
  const maxB = Math.max(...o.batch);
  const perSeq = Math.ceil((Math.max(o.context + o.steps + 1, o.prefill)) / blockSize);
  const device = resolveDevice(o.device ?? "auto");
  const dtype = resolveDtype(o.dtype ?? "auto", device);
  const kv = { numBlocks: perSeq * maxB + 1, blockSize, dtype: resolveKvCacheDtype(o.kvCacheDtype ?? "auto", dtype) };
  const runner = await ModelRunner.create(ckpt, kv, dtype, device);
  const info = runner.info();
  const params = defaultSamplingParams({ temperature: o.temperature ?? 0, topP: o.topP ?? 1, maxTokens: 1, seed: 0 });
  const header = `device ${info.device} (${info.deviceName}), dtype ${info.dtype}, KV cache ${info.kvCacheDtype}; temperature ${params.temperature}, top_p ${params.topP}`;
  const table_ = (b: number): number[] => Array.from({ length: perSeq }, (_, i) => b * perSeq + i);
  const rows: ProfileRow[] = [];
  const measure = async (label: string, make: (step: number) => RunnerSequence[], steps: number): Promise<void> => {
    await runner.execute(make(0)); // warm-up
    runner.native.takeProfile();
    const start = performance.now();
    let tokens = 0;
    for (let i = 1; i <= steps; i++) {
      const seqs = make(i);
      tokens += seqs.reduce((n, s) => n + s.tokenIds.length, 0);
      await runner.execute(seqs);
    }
    const wall = (performance.now() - start) / 1000;
    const p = runner.native.takeProfile();
    const nativeTotal = p.matmul + p.attention + p.lmHead + p.sampling + p.other;
    const pct = (x: number): number => Math.round((x / wall) * 1000) / 10;
    rows.push({
      case: label, tokens_per_step: tokens / steps, step_ms: Math.round((wall / steps) * 10000) / 10,
      tokens_per_second: Math.round((tokens / wall) * 10) / 10, matmul_pct: pct(p.matmul), attention_pct: pct(p.attention),
      lm_head_pct: pct(p.lmHead), sampling_pct: pct(p.sampling), other_native_pct: pct(p.other), typescript_pct: pct(wall - nativeTotal),
    });
  };
  const ids = (n: number, seed: number): number[] => Array.from({ length: n }, (_, i) => (seed * 7919 + i * 104729) % 100000 + 100);
  // Write every decoding sequence's context first: blocks never written map the kernel's shared zero
  // page, whose reads hit in cache and would hide the KV cache's memory traffic. The positions the
  // decode steps will write are written too (each step overwrites its own before reading it), so that
  // the steps do not pay the pool's first touch (the kernel zeroing 2 MiB pages), once per pool in serving.
  for (let b = 0; b < maxB && o.context > 0; b++) {
    await runner.execute([{ tokenIds: ids(o.context + o.steps + 1, b), startPosition: 0, blockTable: table_(b), sample: null }]);
  }
  for (const B of o.batch) {
    // Decode: B sequences, each with `context` tokens already cached.
    await measure(`decode B=${B} ctx=${o.context}`, (step) => Array.from({ length: B }, (_, b) => ({
      tokenIds: [ids(1, b + step)[0]!], startPosition: o.context + step, blockTable: table_(b),
      sample: { params, counter: step, promptIds: [], outputIds: [] },
    })), o.steps);
  }
  if (o.prefill > 0) {
    await measure(`prefill ${o.prefill}`, () => [{
      tokenIds: ids(o.prefill, 3), startPosition: 0, blockTable: table_(0), sample: { params, counter: 0, promptIds: [], outputIds: [] },
    }], 2);
  }
  await runner.dispose();
  return { header, rows };
}

export async function printProfile(o: ProfileOptions): Promise<void> {
  const { header, rows } = await profileSteps(o);
  console.log(header);
  console.log(table(rows, Object.keys(rows[0]!)));
}
