// Where a decode step's wall time goes on the host, outside the engine: B sequences decoding one token
// a step (greedy) at CONTEXT..CONTEXT+99 cached tokens, calling the addon's step directly; per step,
// microseconds building the step's arrays (src/runtime/step-input.ts), in the synchronous step() call,
// in the backend's own step (its profile), and the rest of the wait (thread hand-offs, the result's way
// back). The hash of the sampled tokens shows whether two builds compute the same thing.
//   node scripts/step-split.mjs --model DIR [--device cuda] [--batch 1] [--context 128] [--steps 500]
import { parseArgs } from "node:util";
import { loadCheckpoint } from "../dist/src/model/checkpoint.js";
import { ModelRunner } from "../dist/src/runtime/model-runner.js";
import { buildStepInput } from "../dist/src/runtime/step-input.js";
import { defaultSamplingParams } from "../dist/src/engine/sampling-params.js";

const { values: o } = parseArgs({
  options: { model: { type: "string" }, device: { type: "string", default: "cuda" }, batch: { type: "string", default: "1" },
    context: { type: "string", default: "128" }, steps: { type: "string", default: "500" } },
});
if (!o.model) throw new Error("usage: node scripts/step-split.mjs --model DIR [--device cuda] [--batch 1] [--context 128] [--steps 500]");
const B = Number(o.batch), context = Number(o.context), N = Number(o.steps), blockSize = 32;
const perSeq = Math.ceil((context + 101) / blockSize);
const runner = await ModelRunner.create(loadCheckpoint(o.model), { numBlocks: B * perSeq, blockSize, dtype: "bfloat16" }, "bfloat16", o.device);
const params = defaultSamplingParams({ temperature: 0, topP: 1, maxTokens: 1, seed: 0 });
const seqs = (i) => Array.from({ length: B }, (_, b) => ({
  tokenIds: [100 + i + b], startPosition: context + (i % 100), blockTable: Array.from({ length: perSeq }, (_, j) => b * perSeq + j),
  sample: { params, counter: i, promptIds: [], outputIds: [] },
}));
for (let i = 0; i < 50; i++) await runner.execute(seqs(i));  // warm-up: graphs captured, buffers grown
runner.native.takeProfile();
let hash = 0, build = 0, call = 0, wait = 0;
const start = performance.now();
for (let i = 0; i < N; i++) {
  const batch = seqs(i);  // the engine's sequences, made outside the timed part
  const t0 = performance.now();
  const input = buildStepInput(batch, blockSize, runner.vocab);
  const t1 = performance.now();
  const pending = runner.native.step(input);
  const t2 = performance.now();
  const out = await pending;
  wait += performance.now() - t2;
  build += t1 - t0;
  call += t2 - t1;
  for (const t of out.tokens) hash = (hash * 31 + t) >>> 0;
}
const wall = performance.now() - start;
const p = runner.native.takeProfile();
const backend = (p.matmul + p.attention + p.lmHead + p.sampling + p.other) * 1000;
const us = (ms) => (ms / N * 1000).toFixed(1);
console.log(`${runner.native.info().deviceName}, batch ${B}, context ${context}: ${(B * N / wall * 1000).toFixed(0)} tok/s; us a step: wall ${us(wall)}, ` +
  `build ${us(build)}, step() call ${us(call)}, backend ${us(backend)}, rest of the wait ${us(wait - backend)}; tokens hash ${hash}`);
await runner.dispose();
await new Promise((resolve) => setTimeout(resolve, 300));  // lets scripts/cuda-trace.cpp's flush thread deliver the last records
