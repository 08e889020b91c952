/**
 * GGUF files quantized by llama.cpp's own `llama_model_quantize`, for comparing
 * Weft with llama.cpp on the same file: node-llama-cpp (a devDependency) ships
 * libllama; native/tools/llama-quantize.cpp reaches it, compiled here on first use.
 */
import { execFileSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

/** llama.cpp's `llama_ftype` numbers for the file types Weft serves. */
export const LLAMA_FTYPES = { q8_0: 7, q4_0: 2, q4_1: 3, q4_k_s: 14, q4_k_m: 15, q5_k_s: 16, q5_k_m: 17, q6_k: 18 } as const;
export type LlamaQuantType = keyof typeof LLAMA_FTYPES;

export function isLlamaQuantType(s: string): s is LlamaQuantType {
  return Object.hasOwn(LLAMA_FTYPES, s);
}

const SOURCE = fileURLToPath(new URL("../../../native/tools/llama-quantize.cpp", import.meta.url));

/** The folder of node-llama-cpp's prebuilt CPU libraries for this platform. */
export function llamaCppLibDir(): string {
  const require = createRequire(import.meta.url);
  const name = `${process.platform}-${process.arch}`;
  let pkg: string;
  try {
    pkg = require.resolve(`@node-llama-cpp/${name}`);
  } catch {
    throw new Error(`llama.cpp's prebuilt libraries for ${name} are missing: node-llama-cpp (a devDependency) must be installed`);
  }
  return path.join(path.dirname(pkg), "..", "bins", name);
}

let tool: string | undefined;
/** The compiled quantizer, cached in the temp folder under its source's hash. */
function quantizerTool(): string {
  if (tool) return tool;
  const src = fs.readFileSync(SOURCE);
  const bin = path.join(os.tmpdir(), `weft-llama-quantize-${crypto.createHash("sha256").update(src).digest("hex").slice(0, 12)}`);
  if (!fs.existsSync(bin)) {
    const tmp = `${bin}.${process.pid}`;
    execFileSync(process.env.CXX ?? "g++", ["-O1", "-o", tmp, SOURCE, "-ldl"], { stdio: ["ignore", "ignore", "pipe"] });
    fs.renameSync(tmp, bin);
  }
  return (tool = bin);
}

/** Writes `input` (a float GGUF) quantized to `type` by llama.cpp as `output`. */
export function llamaQuantize(input: string, output: string, type: LlamaQuantType, threads = os.cpus().length): void {
  const dir = llamaCppLibDir();
  const lib = fs.readdirSync(dir).find((f) => /^libllama\..*so$|^libllama\..*dylib$/.test(f));
  if (!lib) throw new Error(`no libllama in ${dir}`);
  const tmp = `${output}.${process.pid}.tmp`;
  try {
    execFileSync(quantizerTool(), [path.join(dir, lib), input, tmp, String(LLAMA_FTYPES[type]), String(threads)], { stdio: ["ignore", "ignore", "pipe"] });
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    const stderr = (e as { stderr?: Buffer }).stderr?.toString().trim().split("\n").slice(-3).join("\n");
    throw new Error(`llama_model_quantize ${type} of ${input} failed${stderr ? `: ${stderr}` : ""}`);
  }
  fs.renameSync(tmp, output);
}

/** `input` quantized to `type` next to it (`NAME-f16.gguf` → `NAME-TYPE.gguf`), made once and reused. */
export function llamaQuantized(input: string, type: LlamaQuantType): string {
  const out = path.join(path.dirname(input), `${path.basename(input, ".gguf").replace(/-(f16|bf16|f32)$/, "")}-${type}.gguf`);
  if (!fs.existsSync(out)) llamaQuantize(input, out, type);
  return out;
}
