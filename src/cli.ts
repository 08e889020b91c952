#!/usr/bin/env node
/** weft: serve | generate | make-model | bench | keys */
import { Command, InvalidArgumentError, Option } from "commander";
// Each command's module is imported when that command runs, so `weft keys` or `weft --help` does
// not load the server, the engine and the benchmarks first. What the flags' definitions need
// (defaults, choices) is imported here.
import type { GenerateOptions } from "./commands/generate.js";
import type { WeightDType } from "./model/make-model.js";
import { PRESETS } from "./model/presets.js";
import type { ServeOptions } from "./commands/serve.js";
import { keysCommand } from "./commands/keys.js";
import { batchesCommand } from "./commands/batches.js";
import { DEFAULT_DB_PATH } from "./store/database.js";
import { DEFAULT_HTTP_LIMITS } from "./server/http-limits.js";
import { DEFAULT_MAX_THINK_TOKENS, REASONING_PARSERS, TOOL_CALL_PARSERS } from "./server/chat-settings.js";
import { DEFAULT_ENGINE_CONFIG, ENGINE_FLAGS, engineConfigFromOptions } from "./engine/engine-config.js";
import type { OfflineBenchOptions } from "./bench/offline.js";
import type { ProfileOptions } from "./bench/profile.js";
import type { ServeBenchOptions } from "./bench/serve-bench.js";
import type { BatchBenchOptions } from "./bench/batch-bench.js";
import type { StructuredBenchOptions } from "./bench/structured-bench.js";
import { QUANT_RECIPES, quantizeModel, type QuantRecipe } from "./model/gguf-quantize.js";
import type { PeerOptions } from "./bench/peer.js";
import { isLlamaQuantType, LLAMA_FTYPES, type LlamaQuantType } from "./bench/llama-quantize.js";
import fs from "node:fs";
import path from "node:path";

export function intArg(name: string, min = 0, max = Number.POSITIVE_INFINITY): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`${name} must be an integer ${max === Number.POSITIVE_INFINITY ? `≥ ${min}` : `from ${min} to ${max}`}`);
    }
    return n;
  };
}

export function numArg(name: string, min?: number, max?: number): (v: string) => number {
  return (v) => {
    const n = Number(v);
    if (!Number.isFinite(n)) throw new InvalidArgumentError(`${name} must be a number`);
    if ((min !== undefined && n < min) || (max !== undefined && n > max)) {
      throw new InvalidArgumentError(`${name} must be between ${min ?? "-Infinity"} and ${max ?? "Infinity"}`);
    }
    return n;
  };
}

/** A list flag: comma-separated, repeatable, or a JSON array (vLLM's form, e.g. '["*"]'). */
export function listArg(name: string): (v: string, all: string[]) => string[] {
  return (v, all) => {
    let items: unknown;
    try {
      items = v.trim().startsWith("[") ? JSON.parse(v) : v.split(",");
    } catch {
      items = null;
    }
    if (!Array.isArray(items) || !items.every((i) => typeof i === "string")) throw new InvalidArgumentError(`${name} must be a comma-separated list or a JSON array of strings`);
    return [...all, ...items.map((i) => i.trim()).filter((i) => i.length > 0)];
  };
}

/** `--dtype`, as the engine flag table defines it. */
function dtypeOption(): Option {
  const f = ENGINE_FLAGS.find((e) => e.key === "dtype")!;
  return new Option(f.flag, f.description).choices(f.choices!).default(DEFAULT_ENGINE_CONFIG.dtype);
}

/** `--device`, as the engine flag table defines it. */
function deviceOption(): Option {
  const f = ENGINE_FLAGS.find((e) => e.key === "device")!;
  return new Option(f.flag, f.description).choices(f.choices!).default(DEFAULT_ENGINE_CONFIG.device);
}

/** `--kv-cache-dtype`, as the engine flag table defines it. */
function kvCacheDtypeOption(): Option {
  const f = ENGINE_FLAGS.find((e) => e.key === "kvCacheDtype")!;
  return new Option(f.flag, f.description).choices(f.choices!).default(DEFAULT_ENGINE_CONFIG.kvCacheDtype);
}

const program = new Command("weft").description("OpenAI-compatible LLM inference server with continuous batching");

program
  .command("generate")
  .description("generate from one prompt")
  .requiredOption("--model <spec>", "a model directory, a .gguf file, a Hugging Face repo id, or org/repo:QUANT (a repo's GGUF file by tag)")
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
  .addOption(dtypeOption())
  .addOption(deviceOption())
  .action(async (o: GenerateOptions) => (await import("./commands/generate.js")).generate(o));

program
  .command("make-model")
  .description(`write a random-weight checkpoint with a real model's shapes and tokenizer (presets: ${Object.keys(PRESETS).join(", ")})`)
  .requiredOption("--preset <name>", "model shape")
  .requiredOption("--out <dir>", "output directory")
  .option("--dtype <dtype>", "bf16 | f16 | f32", "bf16")
  .option("--seed <s>", "weights seed", intArg("--seed"), 0)
  .addOption(new Option("--quant <type>", "write a quantized GGUF file instead (--out FILE.gguf)").choices(QUANT_RECIPES))
  .action(async (o: { preset: string; out: string; dtype: string; seed: number; quant?: QuantRecipe }) => {
    if (!["bf16", "f16", "f32"].includes(o.dtype)) throw new InvalidArgumentError("--dtype must be bf16, f16 or f32");
    const { makeModel } = await import("./model/make-model.js");
    if (!o.quant) {
      const dir = makeModel({ preset: o.preset, out: o.out, dtype: o.dtype as WeightDType, seed: o.seed });
      console.log(`wrote ${o.preset} (random weights, ${o.dtype}) to ${dir}`);
      return;
    }
    if (!o.out.endsWith(".gguf")) throw new InvalidArgumentError("with --quant, --out names the .gguf file to write");
    const tmp = fs.mkdtempSync(path.join(path.dirname(path.resolve(o.out)), ".weft-make-model-"));
    try {
      const r = quantizeModel(makeModel({ preset: o.preset, out: tmp, dtype: o.dtype as WeightDType, seed: o.seed }), o.out, o.quant);
      console.log(`wrote ${o.preset} (random weights, ${o.quant}) to ${o.out}: ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
    } finally {
      fs.rmSync(tmp, { recursive: true, force: true });
    }
  });

const collect = (v: string, all: string[]): string[] => [...all, v];

const serveCommand = program
  .command("serve")
  .description("serve the OpenAI-compatible API (the built-in random-weight demo model when no --model is given)")
  .option("--host <host>", "address to listen on", "127.0.0.1")
  .option("--port <port>", "port (0: any free port)", intArg("--port"), 8000)
  .option("--model <spec>", "ID=PATH, a model directory, a .gguf file, a Hugging Face repo id, or org/repo:QUANT (a repo's GGUF file by tag, e.g. Qwen/Qwen3-0.6B-GGUF:Q8_0) (repeatable)", collect, [])
  .option("--db <path>", "SQLite database of API keys", DEFAULT_DB_PATH)
  .option("--api-key <key>", "also accept this key (and require a key on /v1)")
  .option("--protect-metrics", "require an API key on /metrics")
  .option("--body-limit <bytes>", "largest request body", intArg("--body-limit", 1), 4 * 1024 * 1024)
  .option("--max-loaded-models <n>", "engines kept loaded; the least recently used idle one is unloaded", intArg("--max-loaded-models", 1), 4)
  .option("--shutdown-timeout <s>", "seconds in-flight requests get to finish on SIGTERM", numArg("--shutdown-timeout"), 30)
  .option("--rate-limit <n>", "requests per minute per API key (0: unlimited)", intArg("--rate-limit"), 0)
  .option("--rate-limit-tokens <n>", "prompt + max_tokens × n tokens reserved per minute per API key, unused ones refunded (0: unlimited)", intArg("--rate-limit-tokens"), 0)
  .option("--rate-limit-sequences <n>", "sequences (prompts × n) per minute per API key (0: unlimited)", intArg("--rate-limit-sequences"), 0)
  .option("--stream-stall-timeout <s>", "seconds a streaming client may stop reading before its request is aborted", numArg("--stream-stall-timeout"), 30)
  .option("--stream-max-buffer <bytes>", "bytes buffered for a slow streaming client before its request is aborted", intArg("--stream-max-buffer", 1), 4 * 1024 * 1024)
  .option("--allowed-origins <origins>", "browser origins allowed to call the API (CORS), e.g. https://app.example.com; '*' for any; comma-separated, repeatable or a JSON list", listArg("--allowed-origins"), [])
  .option("--allowed-hosts <hosts>", "extra Host names to answer (DNS-rebinding defence): with no API key set up only localhost, IP addresses and these are answered; once given, also with keys; '*' turns the check off", listArg("--allowed-hosts"), [])
  .option("--header-timeout <s>", "seconds a client has to send a request's headers (408 after)", numArg("--header-timeout"), DEFAULT_HTTP_LIMITS.headersTimeoutMs / 1000)
  .option("--request-timeout <s>", "seconds a client has to send a whole request, body included (408 after)", numArg("--request-timeout"), DEFAULT_HTTP_LIMITS.requestTimeoutMs / 1000)
  .option("--keep-alive-timeout <s>", "seconds an idle kept-alive connection stays open; keep it above your proxy's idle timeout", numArg("--keep-alive-timeout"), DEFAULT_HTTP_LIMITS.keepAliveTimeoutMs / 1000)
  .option("--max-connections <n>", "open connections served; a request on one beyond them gets 503 (0: no cap)", intArg("--max-connections"), DEFAULT_HTTP_LIMITS.maxConnections)
  .option("--chat-template <file>", "a Jinja chat template used instead of every model's own")
  .addOption(new Option("--reasoning-parser <name>", "split <think> blocks into reasoning_content: auto (when the chat template thinks), none, or always").choices(REASONING_PARSERS).default("auto"))
  .addOption(new Option("--tool-call-parser <name>", "how tool calls are read from model output: auto (from the chat template) or a family's format").choices(TOOL_CALL_PARSERS).default("auto"))
  .option("--max-think-tokens <n>", "the most tokens a think block may take before a constrained answer (enable_thinking with a schema or a required tool call)", intArg("--max-think-tokens", 1), DEFAULT_MAX_THINK_TOKENS)
  .option("--data-dir <dir>", "where batch input and output files are kept (default: a files/ folder next to --db)")
  .option("--max-batch-file-bytes <bytes>", "largest file accepted by POST /v1/files", intArg("--max-batch-file-bytes", 1), 200 * 2 ** 20);
// Engine knobs: one table (src/engine/engine-config.ts) gives the flags and the config object.
for (const f of ENGINE_FLAGS) {
  if (f.kind === "negatable") serveCommand.option(f.flag, f.description);
  else if (f.kind === "choice") serveCommand.addOption(new Option(f.flag, f.description).choices(f.choices!).default(DEFAULT_ENGINE_CONFIG[f.key]));
  else serveCommand.option(f.flag, f.description, f.kind === "int" ? intArg(f.flag.split(" ")[0]!, f.min, f.max) : numArg(f.flag.split(" ")[0]!, f.min, f.max), DEFAULT_ENGINE_CONFIG[f.key] as number);
}
serveCommand.action(async (o: Omit<ServeOptions, "engine">) => (await import("./commands/serve.js")).serve({ ...o, engine: engineConfigFromOptions(o as unknown as Record<string, unknown>) }));

program.addCommand(keysCommand());
program.addCommand(batchesCommand());


program
  .command("export-gguf")
  .description("write a checkpoint as GGUF for llama.cpp (Qwen2/Qwen3/Llama-3 with BPE tokenizers)")
  .requiredOption("--model <dir>", "model directory")
  .requiredOption("--out <file>", "output .gguf file")
  .option("--dtype <dtype>", "f16 | bf16 for matrices", "f16")
  .action(async (o: { model: string; out: string; dtype: string }) => {
    if (o.dtype !== "f16" && o.dtype !== "bf16") throw new InvalidArgumentError("--dtype must be f16 or bf16");
    const r = (await import("./model/gguf-export.js")).exportGguf(o.model, o.out, o.dtype);
    console.log(`wrote ${o.out}: ${r.tensors} tensors, ${(r.bytes / 1e9).toFixed(2)} GB`);
  });

program
  .command("quantize")
  .description("write a model as a quantized GGUF file that llama.cpp and weft load (see docs/QUANTIZATION.md)")
  .requiredOption("--model <path>", "a Hugging Face model directory (bf16, f16, f32) or a float GGUF file")
  .requiredOption("--out <file>", "output .gguf file")
  .addOption(new Option("--type <type>", "file type: the tensors' types follow llama.cpp's recipe of that name").choices(QUANT_RECIPES).makeOptionMandatory())
  .action(async (o: { model: string; out: string; type: QuantRecipe }) => {
    if (path.resolve(o.model) === path.resolve(o.out)) throw new InvalidArgumentError("--out must not be the input file");
    const r = quantizeModel(o.model, o.out, o.type, (m) => process.stderr.write(`${m}\n`));
    const mix = Object.entries(r.types).map(([t, n]) => `${n} ${t}`).join(", ");
    console.log(`wrote ${o.out}: ${r.tensors} tensors (${mix}), ${(r.bytes / 1e9).toFixed(2)} GB in ${r.seconds.toFixed(1)} s`);
  });

const intList = (name: string) => (v: string): number[] => v.split(",").map((x) => intArg(name, 1)(x.trim()));
const quantList = (v: string): LlamaQuantType[] => v.split(",").map((x) => {
  const t = x.trim().toLowerCase();
  if (!isLlamaQuantType(t)) throw new InvalidArgumentError(`unknown type "${x.trim()}" (have: ${Object.keys(LLAMA_FTYPES).join(", ")})`);
  return t;
});
const bench = program.command("bench").description("measure throughput and latency");
bench
  .command("offline", { isDefault: true })
  .description("the engine in-process (the default: `weft bench --model DIR ...`)")
  .requiredOption("--model <spec>", "a model directory, a .gguf file, a Hugging Face repo id, or org/repo:QUANT")
  .option("--concurrency <list>", "concurrency levels", intList("--concurrency"), [1, 4, 16, 32])
  .option("--num-prompts <n>", "requests per level", intArg("--num-prompts", 1), 32)
  .option("--prompt-len <n>", "prompt tokens (random ids); absent: the built-in prompt set", intArg("--prompt-len", 1))
  .option("--output-len <n>", "tokens generated per request (EOS ignored)", intArg("--output-len", 1), 64)
  .option("--prefix-len <n>", "tokens shared by all prompts (turns prefix caching on)", intArg("--prefix-len"))
  .option("--mode <mode>", "sweep | compare (sequential vs all together)", "sweep")
  .option("--kv-cache-memory <bytes>", "KV cache bytes", intArg("--kv-cache-memory", 1))
  .option("--max-num-batched-tokens <n>", "tokens per step", intArg("--max-num-batched-tokens", 1))
  .option("--num-scheduler-steps <n>", "decode steps run back to back in one call while every request decodes", intArg("--num-scheduler-steps", 1, 64))
  .option("--json <file>", "write the results as JSON")
  .addOption(dtypeOption())
  .addOption(deviceOption())
  .action(async (o: OfflineBenchOptions) => {
    if (o.mode !== "sweep" && o.mode !== "compare") throw new InvalidArgumentError("--mode must be sweep or compare");
    await (await import("./bench/offline.js")).offlineBench(o);
  });

bench
  .command("serve")
  .description("the same workload over HTTP (streaming) against any OpenAI-compatible server; JSON and an SVG chart")
  .requiredOption("--base-url <url>", "server address, e.g. http://127.0.0.1:8000")
  .requiredOption("--model <id>", "model id on that server")
  .option("--api-key <key>", "bearer key")
  .option("--concurrency <list>", "concurrency levels", intList("--concurrency"), [1, 4, 16, 32])
  .option("--num-prompts <n>", "requests per level", intArg("--num-prompts", 1), 32)
  .option("--prompt-len <n>", "prompt tokens (random ids); absent: the built-in prompt set", intArg("--prompt-len", 1))
  .option("--output-len <n>", "tokens generated per request (EOS ignored)", intArg("--output-len", 1), 64)
  .option("--json <file>", "write the results as JSON")
  .option("--svg <file>", "write a chart of throughput and p99 latency against concurrency")
  .action(async (o: ServeBenchOptions) => void (await (await import("./bench/serve-bench.js")).serveBench(o)));

bench
  .command("batch")
  .description("interactive TTFT on an idle server, then while a Batch API job runs (any server with OpenAI's Files and Batches APIs)")
  .requiredOption("--base-url <url>", "server address, e.g. http://127.0.0.1:8000")
  .requiredOption("--model <id>", "model id on that server")
  .option("--api-key <key>", "bearer key")
  .option("--lines <n>", "lines in the batch", intArg("--lines", 1), 500)
  .option("--probes <n>", "streamed interactive requests per phase", intArg("--probes", 1), 16)
  .option("--probe-gap-ms <ms>", "each probe waits a random 0..ms before it is sent (0: back to back)", intArg("--probe-gap-ms", 0), 250)
  .option("--output-len <n>", "tokens per request", intArg("--output-len", 1), 32)
  .option("--json <file>", "write the results as JSON")
  .action(async (o: BatchBenchOptions) => void (await (await import("./bench/batch-bench.js")).batchBench(o)));
bench
  .command("structured")
  .description("constrained decoding's cost: N JSON-schema requests at once vs N unconstrained, same prompt and token counts")
  .requiredOption("--model <dir>", "model directory (with its tokenizer)")
  .option("--concurrency <n>", "requests decoded together", intArg("--concurrency", 1), 16)
  .option("--output-len <n>", "most tokens per request (a request that completes its schema ends sooner; its twin matches it)", intArg("--output-len", 1), 64)
  .option("--rounds <n>", "alternating rounds; each side reports its best", intArg("--rounds", 1), 3)
  .option("--temperature <t>", "sampling temperature of both sides (0: greedy)", (v: string) => {
    const t = Number(v);
    if (!(t >= 0 && t <= 2)) throw new InvalidArgumentError("--temperature must be between 0 and 2");
    return t;
  }, 1)
  .option("--schema <file>", "a JSON schema file (default: a built-in list of records)")
  .option("--json <file>", "write the results as JSON")
  .addOption(dtypeOption())
  .action(async (o: StructuredBenchOptions) => void (await (await import("./bench/structured-bench.js")).structuredBench(o)));
bench
  .command("profile")
  .description("where a step's time goes: decode at several batch sizes, and one prefill")
  .requiredOption("--model <spec>", "a model directory, a .gguf file, a Hugging Face repo id, or org/repo:QUANT")
  .option("--batch <list>", "decode batch sizes", intList("--batch"), [1, 16, 32])
  .option("--context <n>", "cached tokens per decoding sequence", intArg("--context"), 128)
  .option("--prefill <n>", "prompt tokens of the prefill case (0: skip)", intArg("--prefill"), 512)
  .option("--steps <n>", "decode steps per case", intArg("--steps", 1), 8)
  .option("--temperature <t>", "every row's sampling temperature (0: greedy)", numArg("--temperature", 0), 0)
  .option("--top-p <p>", "every row's top_p", numArg("--top-p", Number.MIN_VALUE, 1), 1)
  .addOption(dtypeOption())
  .addOption(kvCacheDtypeOption())
  .addOption(deviceOption())
  .action(async (o: ProfileOptions) => (await import("./bench/profile.js")).printProfile(o));
bench
  .command("peer")
  .description("Weft vs llama.cpp (node-llama-cpp, a devDependency), both on the CPU, on the same random checkpoint, or with --quant the same quantized GGUF, in one run")
  .option("--preset <name>", "model shape", "qwen3-0.6b")
  .option("--dir <dir>", "where the checkpoint and GGUF files are kept", path.join(".weft", "bench"))
  .option("--concurrency <list>", "sequences decoded together", intList("--concurrency"), [1, 4, 16, 32])
  .option("--prompt-len <n>", "prompt tokens per sequence", intArg("--prompt-len", 1), 128)
  .option("--output-len <n>", "tokens generated per sequence", intArg("--output-len", 2), 128)
  .option("--prefill-len <n>", "tokens of the single-prompt prefill case", intArg("--prefill-len", 1), 512)
  .option("--quant <types>", `run both on the same GGUF quantized by llama.cpp to each type (${Object.keys(LLAMA_FTYPES).join(", ")}), comma-separated`, quantList)
  .option("--num-scheduler-steps <n>", "Weft's decode steps run back to back in one call", intArg("--num-scheduler-steps", 1, 64))
  .option("--json <file>", "write the results as JSON")
  .action(async (o: PeerOptions) => {
    fs.mkdirSync(o.dir, { recursive: true });
    await (await import("./bench/peer.js")).peerBench(o);
  });

program.parseAsync().catch((e: unknown) => {
  process.stderr.write(`weft: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
});
