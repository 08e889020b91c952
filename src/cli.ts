#!/usr/bin/env node
/** weft: serve | generate | make-model | bench | keys */
import { Command, InvalidArgumentError } from "commander";
import { generate } from "./commands/generate.js";
import { makeModel, type WeightDType } from "./model/make-model.js";
import { PRESETS } from "./model/presets.js";

export function intArg(name: string, min = 0): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`${name} must be an integer ≥ ${min}`);
    return n;
  };
}

export function numArg(name: string): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isFinite(n)) throw new InvalidArgumentError(`${name} must be a number`);
    return n;
  };
}

const program = new Command("weft").description("OpenAI-compatible LLM inference server with continuous batching");

program
  .command("generate")
  .description("generate from one prompt")
  .requiredOption("--model <dir>", "Hugging Face model directory")
  .option("--prompt <text>", "prompt text")
  .option("--prompt-ids <ids>", "prompt token ids, comma-separated")
  .option("--chat", "wrap the prompt in the model's chat template")
  .option("--max-tokens <n>", "tokens to generate", intArg("--max-tokens", 1), 32)
  .option("--temperature <t>", "0 = greedy", numArg("--temperature"), 0)
  .option("--top-p <p>", "nucleus sampling", numArg("--top-p"), 1)
  .option("--top-k <k>", "0 = off", intArg("--top-k"), 0)
  .option("--seed <s>", "seed for sampling", intArg("--seed"))
  .option("--logprobs <k>", "report top-k log-probs per token", intArg("--logprobs"))
  .option("--ignore-eos", "keep generating past EOS")
  .option("--json", "print one JSON object")
  .action(generate);

program
  .command("make-model")
  .description(`write a random-weight checkpoint with a real model's shapes and tokenizer (presets: ${Object.keys(PRESETS).join(", ")})`)
  .requiredOption("--preset <name>", "model shape")
  .requiredOption("--out <dir>", "output directory")
  .option("--dtype <dtype>", "bf16 | f16 | f32", "bf16")
  .option("--seed <s>", "weights seed", intArg("--seed"), 0)
  .action((o: { preset: string; out: string; dtype: string; seed: number }) => {
    if (!["bf16", "f16", "f32"].includes(o.dtype)) throw new InvalidArgumentError("--dtype must be bf16, f16 or f32");
    const dir = makeModel({ preset: o.preset, out: o.out, dtype: o.dtype as WeightDType, seed: o.seed });
    console.log(`wrote ${o.preset} (random weights, ${o.dtype}) to ${dir}`);
  });

program.parseAsync().catch((e: unknown) => {
  process.stderr.write(`weft: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
});
