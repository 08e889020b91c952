// A decode step as the engine runs it (bench peer's Weft side, on the CPU): N requests of PROMPT random
// tokens generating OUTPUT each, all submitted at once; per run, the decode tok/s `bench peer` reports,
// the mean of the steps whose rows are all N sequences' decode tokens (launch to result, as the
// engine's observer times them), the other steps by kind, and how busy the event loop was. Beside
// `scripts/step-split.mjs` (the runner alone) it shows what the engine adds to a step.
//   node scripts/engine-split.mjs --model DIR [--sequences 32] [--prompt 128] [--output 128] [--runs 2]
import { parseArgs } from "node:util";
import { performance } from "node:perf_hooks";
import { loadWeft } from "../dist/src/bench/peer.js";
import { runLevel } from "../dist/src/bench/offline.js";
import { syntheticPrompts } from "../dist/src/bench/workload.js";
import { attributeStep, summarize } from "../dist/src/bench/stats.js";
import { readModelConfig } from "../dist/src/model/config.js";

const { values: o } = parseArgs({
  options: { model: { type: "string" }, sequences: { type: "string", default: "32" }, prompt: { type: "string", default: "128" },
    output: { type: "string", default: "128" }, runs: { type: "string", default: "2" } },
});
if (!o.model) throw new Error("usage: node scripts/engine-split.mjs --model DIR [--sequences 32] [--prompt 128] [--output 128] [--runs 2]");
const n = Number(o.sequences), promptLen = Number(o.prompt), outputLen = Number(o.output), config = readModelConfig(o.model);
const totals = () => ({ prefillSeconds: 0, decodeSeconds: 0, prefillTokens: 0, decodeTokens: 0 });
const steps = totals(), byKind = new Map();
// The engine bench peer runs (its default 512-token prefill sizes the steps).
const m = await loadWeft(o.model, { concurrency: [n], promptLen, outputLen, prefillLen: 512 }, (s, rows) => {
  attributeStep(steps, s, rows);
  const kind = rows.prefill > 0 ? "with prefill" : `${rows.decode} decode`;
  const k = byKind.get(kind) ?? { count: 0, seconds: 0 };
  byKind.set(kind, { count: k.count + 1, seconds: k.seconds + s });
}, () => {});
await runLevel(m, syntheticPrompts({ numPrompts: 2, promptLen: 16, vocab: config.vocab, seed: 1 }), 2, 2, totals()); // warm-up
const ms = (k) => (k ? (k.seconds / k.count * 1000).toFixed(2) : "-");
for (let r = 0; r < Number(o.runs); r++) {
  byKind.clear();
  const idle = performance.eventLoopUtilization();
  const { timings, wall } = await runLevel(m, syntheticPrompts({ numPrompts: n, promptLen, vocab: config.vocab, seed: n }), outputLen, n, steps);
  const loop = performance.eventLoopUtilization(idle);
  const decode = summarize(n, timings, wall, steps, 0).decode_tokens_per_second ?? 0;
  const full = byKind.get(`${n} decode`);
  const others = [...byKind].filter(([kind]) => kind !== `${n} decode`).map(([kind, k]) => `${kind} ${k.count} × ${ms(k)}`).join(", ");
  console.log(`${n} sequences: decode ${decode} tok/s; ${full?.count ?? 0} steps of ${n} decode rows at ${ms(full)} ms; ` +
    `event loop busy ${(loop.utilization * 100).toFixed(1)} % of ${wall.toFixed(2)} s; other steps (ms each): ${others}`);
}
await m.engine.shutdown();
