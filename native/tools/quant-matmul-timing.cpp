// Times the quantized matmul alone, as a step calls it (matmulQuantized on the active kernel set:
// the activations quantized, then every column split across the OpenMP threads), on random
// weights of one type and shape. For kernel work: a step's profile shows the matmuls' share, this
// shows one kernel's cost per tile of work. Not part of the addon or the tests.
// Build after the addon (it links the addon's own objects):
//   O=build/Release/obj.target/weft_native/native
//   g++ -O2 -std=c++17 -fopenmp -Inative -o /tmp/quant-matmul-timing native/tools/quant-matmul-timing.cpp \
//     $O/kernels*.o $O/matmul.o $O/quantize.o
// Usage: quant-matmul-timing ROWS K N [q8_0|q4_k|q6_k]   (WEFT_ISA and OMP_NUM_THREADS apply)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "kernels.h"
#include "quant.h"

using namespace weft;

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s ROWS K N [q8_0|q4_k|q6_k]\n", argv[0]);
    return 1;
  }
  const int T = atoi(argv[1]), K = atoi(argv[2]), N = atoi(argv[3]);
  const char* type = argc > 4 ? argv[4] : "q8_0";
  const DType dt = strcmp(type, "q4_k") == 0 ? DType::Q4_K : strcmp(type, "q6_k") == 0 ? DType::Q6_K : DType::Q8_0;
  std::mt19937 rng(1);
  std::vector<uint8_t> data(tensorBytes(dt, N, K));
  for (uint8_t& b : data) b = rng() & 0x3f;  // every f16 scale finite (at most 0x3f3f = 1.56)
  PackedMatrix w;
  w.data = data.data();
  w.dtype = dt;
  w.N = N;
  w.K = K;
  std::normal_distribution<float> normal;
  std::vector<float> x(static_cast<size_t>(T) * K), y(static_cast<size_t>(T) * N);
  for (float& v : x) v = normal(rng);
  const Kernels& k = activeKernels();
  matmulQuantized(k, x.data(), T, w, y.data());  // warm: scratch grown, tiles requested
  const int calls = 20;
  printf("set %s, %s, %d rows x K %d x N %d\n", k.name, type, T, K, N);
  for (int rep = 0; rep < 3; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; i++) matmulQuantized(k, x.data(), T, w, y.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    // A unit of work: 16 output columns × 32 inputs × up to 16 rows (an AMX group tile).
    const double units = (N / 16.0) * (K / 32.0) * ((T + 15) / 16);
    printf("  %.3f ms a call, %.1f ns per 16 x 32 x 16 unit, weights read at %.1f GB/s\n", s * 1e3, s * 1e9 / units, data.size() / s / 1e9);
  }
  return 0;
}
