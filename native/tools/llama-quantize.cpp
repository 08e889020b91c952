// llama.cpp's own model quantizer, reached through the libllama that node-llama-cpp ships
// (a devDependency), so benchmarks and tests quantize with llama.cpp's code, not Weft's.
// Usage: llama-quantize LIBLLAMA IN.gguf OUT.gguf FTYPE NTHREADS   (FTYPE: llama_ftype's number)
// Not part of the addon: src/bench/llama-quantize.ts compiles it on first use.
#include <dlfcn.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

// llama_model_quantize_params starts with nthread and ftype; the rest stays as the library's
// defaults. The padding is larger than the real struct, which is returned and read through memory.
struct QuantizeParams {
  int32_t nthread;
  int32_t ftype;
  char rest[248];
};

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s LIBLLAMA IN OUT FTYPE NTHREADS\n", argv[0]);
    return 1;
  }
  void* lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) {
    fprintf(stderr, "%s\n", dlerror());
    return 2;
  }
  auto init = reinterpret_cast<void (*)()>(dlsym(lib, "llama_backend_init"));
  auto defaults = reinterpret_cast<QuantizeParams (*)()>(dlsym(lib, "llama_model_quantize_default_params"));
  auto quantize = reinterpret_cast<uint32_t (*)(const char*, const char*, const QuantizeParams*)>(dlsym(lib, "llama_model_quantize"));
  if (!init || !defaults || !quantize) {
    fprintf(stderr, "libllama lacks the quantizer's symbols\n");
    return 3;
  }
  init();
  QuantizeParams p = defaults();
  p.ftype = atoi(argv[4]);
  p.nthread = atoi(argv[5]);
  return quantize(argv[2], argv[3], &p) == 0 ? 0 : 4;
}
