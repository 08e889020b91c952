// llama.cpp's CUDA build (node-llama-cpp's prebuilt, every layer on the GPU) on the serving workload
// of docs/GPU.md: C sequences of `--prompt-len` random tokens, `--output-len` tokens each, all
// evaluated together in lockstep (each decode call carries every sequence's token, as `weft bench
// peer` checks on the CPU). Prints decode tok/s (tokens after each sequence's first over the decode
// phase) and output tok/s over the whole run, prompts included. For the GPU host (scripts/gpu-bundle.mjs
// with --llama-cpp carries node-llama-cpp and its CUDA binaries there):
//   node scripts/gpu-llama-cpp.mjs --model FILE.gguf --concurrency 1,32,128 [--json FILE]
// (`--device cpu` runs the CPU build instead: a check of the script away from a GPU.)
import fs from "node:fs";
import { parseArgs } from "node:util";
import { llamaDecode } from "../dist/src/bench/peer.js";
import { syntheticPrompts } from "../dist/src/bench/workload.js";
import { readGguf } from "../dist/src/model/gguf.js";
import { ggufModelConfig } from "../dist/src/model/gguf-model.js";

const { values: o } = parseArgs({
  options: {
    model: { type: "string" }, concurrency: { type: "string", default: "1,32,128" }, device: { type: "string", default: "cuda" },
    "prompt-len": { type: "string", default: "128" }, "output-len": { type: "string", default: "128" }, json: { type: "string" },
  },
});
if (!o.model) throw new Error("usage: node scripts/gpu-llama-cpp.mjs --model FILE.gguf [--concurrency 1,32,128] [--device cuda|cpu] [--json FILE]");
if (o.device !== "cuda" && o.device !== "cpu") throw new Error(`--device must be cuda or cpu, not ${o.device}`);
const count = (name, text) => {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new Error(`${name} must be a positive integer, not ${text}`);
  return n;
};
const promptLen = count("--prompt-len", o["prompt-len"]), outputLen = count("--output-len", o["output-len"]);
const levels = o.concurrency.split(",").map((c) => count("--concurrency", c));
const { vocab } = ggufModelConfig(readGguf(o.model));
const rows = [];
for (const c of levels) {
  // The prompts `weft bench peer` gives both engines at this level (syntheticPrompts, seeded by it).
  const prompts = syntheticPrompts({ numPrompts: c, promptLen, vocab, seed: c });
  const r = await llamaDecode(o.model, prompts, outputLen, o.device);
  const calls = r.tokensPerDecodeCall;
  const row = {
    concurrency: c, decode_tok_s: Math.round(r.decodeTokensPerSecond), output_tok_s: Math.round(r.outputTokensPerSecond),
    tokens_per_decode_call: `${Math.min(...calls)}–${Math.max(...calls)}`,
  };
  console.log(JSON.stringify(row));
  rows.push(row);
}
if (o.json) fs.writeFileSync(o.json, JSON.stringify({ engine: `llama.cpp (node-llama-cpp ${o.device} prebuilt)`, model: o.model, prompt_len: promptLen, output_len: outputLen, rows }, null, 2));
