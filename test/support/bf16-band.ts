/** transformers' own bf16 error band (reference.json `bf16_band`) and our measure against it. */
import fs from "node:fs";
import path from "node:path";
import { loadCheckpoint } from "../../src/model/checkpoint.js";
import { FIXTURES, readReference, readReferenceLogits } from "../helpers.js";

function logSoftmax(row: ArrayLike<number>, at: number, V: number): Float64Array {
  let max = -Infinity;
  for (let v = 0; v < V; v++) max = Math.max(max, row[at + v]!);
  let sum = 0;
  for (let v = 0; v < V; v++) sum += Math.exp(row[at + v]! - max);
  const out = new Float64Array(V);
  for (let v = 0; v < V; v++) out[v] = row[at + v]! - max - Math.log(sum);
  return out;
}

/** The band's measure: largest |Δ log-prob| over the fp32 reference's top-20 tokens at every stored position. */
export function bandError(model: string, logitsOf: (prompt: number) => Float32Array): number {
  const ref = readReferenceLogits(model);
  const V = loadCheckpoint(path.join(FIXTURES, model)).config.vocab;
  let worst = 0;
  readReference(model).forEach((_, i) => {
    const expected = ref.get(`logits_${i}`)!.data as Float32Array;
    const positions = ref.get(`positions_${i}`)!.data as BigInt64Array;
    const got = logitsOf(i);
    positions.forEach((p, j) => {
      const want = logSoftmax(expected, j * V, V), have = logSoftmax(got, Number(p) * V, V);
      const top = [...want.keys()].sort((a, b) => want[b]! - want[a]!).slice(0, 20);
      for (const v of top) worst = Math.max(worst, Math.abs(have[v]! - want[v]!));
    });
  });
  return worst;
}

/** transformers' bf16 band for a fixture: its largest |Δ log-prob| on CPU and on CUDA. */
export function band(model: string): { cpu: number; cuda: number } {
  const ref = JSON.parse(fs.readFileSync(path.join(FIXTURES, model, "reference.json"), "utf8")) as { bf16_band: { cpu: number; cuda: number } };
  return ref.bf16_band;
}

/** Two log-probs each off by up to the band: a greedy choice closer than this is a near-tie. */
export function tieGap(model: string): number {
  const b = band(model);
  return 2 * Math.max(b.cpu, b.cuda);
}

export function argmax(l: Float32Array): number {
  return l.reduce((best, v, j) => (v > l[best]! ? j : best), 0);
}
