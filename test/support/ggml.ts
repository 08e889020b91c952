/**
 * llama.cpp's own quantization code, for tests: node-llama-cpp's prebuilt
 * libggml-base (ggml_quantize_chunk, the per-type to_float of
 * ggml_get_type_traits) and libllama (llama_model_quantize), driven by a small
 * C++ program compiled here once per process.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { GGML_TYPES, type GgmlType } from "../../src/model/gguf.js";
import { tempDir } from "../helpers.js";

/** node-llama-cpp's prebuilt CPU binaries for this platform (libggml-base.so, libllama.so). */
export function llamaCppBins(): string {
  const require = createRequire(import.meta.url);
  const name = `${process.platform}-${process.arch}`;
  return path.join(path.dirname(require.resolve(`@node-llama-cpp/${name}`)), "..", "bins", name);
}

const PROGRAM = String.raw`
#include <dlfcn.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <vector>
// ggml's struct ggml_type_traits (ggml.h): name, block size, interleave, type size, quantized, to_float, ...
struct traits { const char* name; int64_t blck; int64_t blck_interleave; size_t type_size; bool quantized;
  void (*to_float)(const void*, float*, int64_t); };
// llama_model_quantize_params begins with nthread and ftype; the rest is kept as the library's defaults.
struct params { int32_t nthread; int32_t ftype; char rest[248]; };
static std::vector<char> slurp(const char* f) { FILE* p = fopen(f, "rb"); std::vector<char> b; char c[65536]; size_t n;
  while ((n = fread(c, 1, sizeof c, p)) > 0) b.insert(b.end(), c, c + n); fclose(p); return b; }
static void spill(const char* f, const void* d, size_t n) { FILE* p = fopen(f, "wb"); fwrite(d, 1, n, p); fclose(p); }
int main(int argc, char** argv) {
  void* lib = dlopen(argv[1], RTLD_NOW); if (!lib) { fprintf(stderr, "%s\n", dlerror()); return 2; }
  if (!strcmp(argv[2], "model")) {  // model LIBLLAMA IN OUT FTYPE
    auto init = (void (*)()) dlsym(lib, "llama_backend_init");
    auto defaults = (params (*)()) dlsym(lib, "llama_model_quantize_default_params");
    auto quantize = (uint32_t (*)(const char*, const char*, const params*)) dlsym(lib, "llama_model_quantize");
    init(); params p = defaults(); p.nthread = 1; p.ftype = atoi(argv[5]);
    return quantize(argv[3], argv[4], &p) == 0 ? 0 : 4;
  }
  auto traitsOf = (const traits* (*)(int)) dlsym(lib, "ggml_get_type_traits");
  auto typeName = (const char* (*)(int)) dlsym(lib, "ggml_type_name");
  int type = atoi(argv[3]); const traits* t = traitsOf(type);
  if (strcmp(t->name, typeName(type)) != 0) { fprintf(stderr, "type_traits layout mismatch\n"); return 3; }
  std::vector<char> in = slurp(argv[5]);
  if (!strcmp(argv[2], "quantize")) {  // quantize LIBGGML TYPE N_PER_ROW IN OUT
    auto quantize = (size_t (*)(int, const float*, void*, int64_t, int64_t, int64_t, const float*)) dlsym(lib, "ggml_quantize_chunk");
    int64_t per = atoll(argv[4]), rows = (int64_t)(in.size() / 4) / per;
    std::vector<char> out(rows * per / t->blck * t->type_size);
    spill(argv[6], out.data(), quantize(type, (const float*)in.data(), out.data(), 0, rows, per, nullptr));
    return 0;
  }
  int64_t n = atoll(argv[4]); std::vector<float> out(n);  // dequant LIBGGML TYPE N IN OUT
  t->to_float(in.data(), out.data(), n); spill(argv[6], out.data(), n * 4); return 0;
}
`;

let binary: string | undefined;
function run(lib: string, ...args: string[]): void {
  if (!binary) {
    const dir = tempDir("weft-ggml-");
    fs.writeFileSync(path.join(dir, "ggml.cpp"), PROGRAM);
    binary = path.join(dir, "ggml");
    execFileSync("g++", ["-O1", "-o", binary, path.join(dir, "ggml.cpp"), "-ldl"]);
  }
  execFileSync(binary, [path.join(llamaCppBins(), lib), ...args], { stdio: ["ignore", "ignore", "pipe"] });
}

/** `x` (rows of `perRow`) quantized by ggml_quantize_chunk (no importance matrix). */
export function ggmlQuantize(type: GgmlType, x: Float32Array, perRow: number): Uint8Array {
  const dir = tempDir("weft-ggml-q-");
  fs.writeFileSync(path.join(dir, "x.f32"), x);
  run("libggml-base.so", "quantize", String(GGML_TYPES[type].id), String(perRow), path.join(dir, "x.f32"), path.join(dir, "x.q"));
  return new Uint8Array(fs.readFileSync(path.join(dir, "x.q")));
}

/** `count` values of `type` read by ggml's own to_float. */
export function ggmlToFloat(type: GgmlType, data: Uint8Array, count: number): Float32Array {
  const dir = tempDir("weft-ggml-d-");
  fs.writeFileSync(path.join(dir, "x.q"), data);
  run("libggml-base.so", "dequant", String(GGML_TYPES[type].id), String(count), path.join(dir, "x.q"), path.join(dir, "x.f32"));
  return new Float32Array(new Uint8Array(fs.readFileSync(path.join(dir, "x.f32"))).buffer);
}

/** llama.cpp's llama_ftype numbers. */
export const LLAMA_FTYPES = { q8_0: 7, q4_0: 2, q4_k_m: 15, q5_k_m: 17, q6_k: 18 } as const;

/** A float GGUF file quantized by llama_model_quantize (one thread, default parameters). */
export function llamaModelQuantize(input: string, out: string, ftype: keyof typeof LLAMA_FTYPES): void {
  const lib = fs.readdirSync(llamaCppBins()).find((f) => /^libllama\..*so$/.test(f))!;
  run(lib, "model", input, out, String(LLAMA_FTYPES[ftype]));
}
