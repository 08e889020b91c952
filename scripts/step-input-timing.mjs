// The host-side cost of turning a scheduled decode batch into the addon's step arrays
// (src/runtime/step-input.ts), alone: B sequences of one token each (context 128 + i, greedy
// or seeded sampling, the engine's block tables of 32-token blocks), the least and median
// microseconds a call over many calls. No model and no addon: it times the TypeScript only.
//   node scripts/step-input-timing.mjs [--batch 1,32,128,512] [--calls 2000] [--json FILE]
import fs from "node:fs";
import os from "node:os";
import { parseArgs } from "node:util";
import { buildStepInput } from "../dist/src/runtime/step-input.js";

const { values: o } = parseArgs({ options: { batch: { type: "string", default: "1,32,128,512" }, calls: { type: "string", default: "2000" }, json: { type: "string" } } });
const calls = Number(o.calls);
const params = (b) => ({ temperature: b % 2 ? 0.7 : 0, topP: 0.95, topK: 0, minP: 0, repetitionPenalty: 1, presencePenalty: 0, frequencyPenalty: 0, seed: b, logprobs: 0 });

function batch(B, step) {
  return Array.from({ length: B }, (_, b) => ({
    tokenIds: [(b * 7919 + step) % 151936], startPosition: 128 + (step % 64),
    blockTable: Array.from({ length: 8 }, (_, i) => b * 8 + i),
    sample: { params: params(b), counter: step, promptIds: [], outputIds: [] },
  }));
}

const rows = [];
for (const B of o.batch.split(",").map(Number)) {
  const times = [];
  for (let i = 0; i < calls; i++) {
    const seqs = batch(B, i);
    const t0 = performance.now();
    buildStepInput(seqs, 32, 151936);
    times.push((performance.now() - t0) * 1000);
  }
  times.sort((a, b) => a - b);
  rows.push({ sequences: B, least_us: Math.round(times[0] * 10) / 10, median_us: Math.round(times[calls >> 1] * 10) / 10 });
}
const machine = `${os.cpus()[0]?.model ?? "unknown CPU"}, ${os.cpus().length} CPUs, Node ${process.version}`;
console.log(machine);
console.table(rows);
if (o.json) fs.writeFileSync(o.json, JSON.stringify({ machine, calls, rows }, null, 2));
