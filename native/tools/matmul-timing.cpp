// Times one matmul alone, as a step calls it on the active kernel set, on random weights of
// one type and shape: bf16 (matmulPackedBf16 on rows already rounded: the bfloat16 mode's
// matmul), f32-bf16 (bf16 weights in the float32 mode's groups: matmulPacked on rows already
// packed, where the set reads them so), f32-pairs (bf16 weights in pair tiles: matmulPairsF32, the float32 mode's matmul on
// bf16 weights where the set has it) or a quantized type (matmulQuantized: the activations quantized, then every column
// split across the OpenMP threads). For kernel work: a step's profile shows the matmuls'
// share, this shows one kernel's cost. COPIES matrices of that shape are called in turn, so
// with enough of them (their bytes well past the caches) the weights stream from memory as in
// a step, and with one or two they stay in cache: the kernel's compute rate. Not part of the
// addon or the tests. Build after the addon (it links the addon's own objects):
//   O=build/Release/obj.target/weft_native/native
//   g++ -O2 -std=c++17 -fopenmp -Inative -o /tmp/matmul-timing native/tools/matmul-timing.cpp $O/kernels*.o $O/matmul.o $O/quantize.o $O/quant_panels.o $O/kquant_rows.o
// Usage: matmul-timing ROWS K N [bf16|f32-bf16|f32-pairs|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k] [COPIES]   (WEFT_ISA and OMP_NUM_THREADS apply;
//   CALLS sets the calls per timing, 20 or COPIES by default: more for `perf record`)
#include <sys/mman.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include "kernels.h"
#include "ops.h"
#include "quant.h"
#include "kquant_rows.h"
#include "quant_panels.h"

using namespace weft;

namespace {

DType typeNamed(const char* s) {
  if (strcmp(s, "bf16") == 0) return DType::BF16;
  if (strcmp(s, "q4_0") == 0) return DType::Q4_0;
  if (strcmp(s, "q4_1") == 0) return DType::Q4_1;
  if (strcmp(s, "q4_k") == 0) return DType::Q4_K;
  if (strcmp(s, "q5_k") == 0) return DType::Q5_K;
  if (strcmp(s, "q6_k") == 0) return DType::Q6_K;
  return DType::Q8_0;
}

// Random weights for every matrix of the run, in memory aligned to huge pages and asked for
// them, as the addon's weights are: bf16 elements of magnitude 2^-7 to 2^-6 (no NaN, no
// subnormals); quantized blocks whose f16 scales are all finite (each byte at most 0x3f).
uint8_t* randomWeights(DType dt, size_t bytes) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t size = (bytes + kHuge - 1) / kHuge * kHuge;
  auto* data = static_cast<uint8_t*>(std::aligned_alloc(kHuge, size));
  if (!data) return nullptr;
  madvise(data, size, MADV_HUGEPAGE);
  std::mt19937 rng(1);
  if (dt == DType::BF16) {
    for (size_t i = 0; i + 1 < bytes; i += 2) {
      const uint16_t v = static_cast<uint16_t>(0x3c00 | (rng() & 0x80ff));
      std::memcpy(data + i, &v, 2);
    }
  } else {
    for (size_t i = 0; i < bytes; i++) data[i] = rng() & 0x3f;
  }
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s ROWS K N [bf16|f32-bf16|f32-pairs|q8_0|q4_0|q4_1|q4_k|q5_k|q6_k] [COPIES]\n", argv[0]);
    return 1;
  }
  const int T = atoi(argv[1]), K = atoi(argv[2]), N = atoi(argv[3]);
  const char* type = argc > 4 ? argv[4] : "q8_0";
  const int copies = argc > 5 ? atoi(argv[5]) : 1;
  const bool fp32 = strcmp(type, "f32-bf16") == 0, pairs = strcmp(type, "f32-pairs") == 0;
  const DType dt = fp32 || pairs ? DType::BF16 : typeNamed(type);
  const bool bf16 = dt == DType::BF16 && !fp32 && !pairs;
  if ((bf16 || pairs) && (K % kTileK != 0 || N % kTileCols != 0)) {
    fprintf(stderr, "%s: K must be a multiple of %d and N of %d\n", type, kTileK, kTileCols);
    return 1;
  }
  const Kernels& k = activeKernels();
  if (pairs && !k.matmulPairsF32) {
    fprintf(stderr, "f32-pairs: the %s set reads float32 bf16 weights in groups (f32-bf16)\n", k.name);
    return 1;
  }
  if (fp32 && k.matmulPairsF32) {
    fprintf(stderr, "f32-bf16: the %s set reads float32 bf16 weights in pair tiles (f32-pairs)\n", k.name);
    return 1;
  }
  if (fp32 && (K % k.chunk != 0 || N % kPackCols != 0)) {
    fprintf(stderr, "f32-bf16: K must be a multiple of %d and N of %d\n", k.chunk, kPackCols);
    return 1;
  }
  // Held as the addon holds them (PackedStore::packQuantized): in panels, or as decoded rows.
  const bool panels = k.quantPanels() && dt != DType::BF16;
  const bool decoded = !panels && k.decodedKRows() && decodedRowsOf(dt) != dt;
  const DType panel = decoded ? decodedRowsOf(dt) : panelTypeOf(dt, k.wideQ6Panels());
  const size_t bytes = dt == DType::BF16 ? static_cast<size_t>(N) * K * 2
                       : panels         ? panelBytes(panel, N, K)
                       : decoded        ? decodedRowBytes(panel, K) * N
                                        : tensorBytes(dt, N, K);
  uint8_t* data = randomWeights(dt, bytes * copies);
  if (!data) {
    fprintf(stderr, "cannot allocate %zu bytes of weights\n", bytes * copies);
    return 1;
  }
  std::vector<PackedMatrix> ws(copies);
  std::vector<uint8_t> rows(panels || decoded ? tensorBytes(dt, N, K) : 0);
  for (int c = 0; c < copies; c++) {
    if (panels || decoded) {  // random rows (as randomWeights makes them) into panels or decoded rows
      std::memcpy(rows.data(), data + bytes * c, rows.size());
      if (panels) packQuantPanels(panel, rows.data(), N, K, data + bytes * c);
      else packDecodedRows(panel, rows.data(), N, K, data + bytes * c);
    }
    ws[c].data = data + bytes * c;
    ws[c].dtype = dt;
    ws[c].panelType = panels || decoded ? panel : dt;
    ws[c].pairTiles = bf16 || pairs;
    ws[c].N = ws[c].Np = N;
    ws[c].K = ws[c].Kp = K;
  }
  std::normal_distribution<float> normal;
  std::mt19937 rng(2);
  std::vector<float> x(static_cast<size_t>(T) * K), y(static_cast<size_t>(T) * N);
  for (float& v : x) v = normal(rng);
  std::vector<uint16_t> xp(bf16 ? x.size() : 0);  // bf16: the rows rounded once, as a step's matmul input
  for (int t = 0; bf16 && t < T; t++) packRowBf16(k, x.data() + static_cast<size_t>(t) * K, K, K, xp.data() + static_cast<size_t>(t) * K);
  std::vector<float> xf(fp32 ? x.size() : 0);  // float32 mode: the rows packed once, as a step's matmul input
  if (fp32) packActivations(x.data(), T, K, K, k.chunk, dt, xf.data());
  const auto call = [&](const PackedMatrix& w) {
    if (fp32) matmulPacked(k, xf.data(), T, w, y.data());
    else if (pairs) matmulPairsF32(k, x.data(), T, w, y.data(), xf);
    else if (bf16) matmulPackedBf16(k, xp.data(), T, w, y.data());
    else matmulQuantized(k, x.data(), T, w, y.data());
  };
  for (const PackedMatrix& w : ws) call(w);  // warm: pages touched, scratch grown, tiles requested
  const int calls = std::max(getenv("CALLS") ? atoi(getenv("CALLS")) : 20, copies);
  printf("set %s, %s, %d rows x K %d x N %d, %d %s\n", k.name, type, T, K, N, copies, copies == 1 ? "matrix" : "matrices");
  for (int rep = 0; rep < 3; rep++) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; i++) call(ws[i % copies]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / calls;
    // A unit of work: 16 output columns × 32 inputs × up to 16 rows (an AMX tile product).
    const double units = (N / 16.0) * (K / 32.0) * ((T + 15) / 16);
    const double gflops = 2.0 * T * K * N / s / 1e9;
    printf("  %.3f ms a call, %.1f ns per 16 x 32 x 16 unit, weights read at %.1f GB/s, %.1f GFLOP/s\n", s * 1e3, s * 1e9 / units, bytes / s / 1e9, gflops);
  }
  std::free(data);
  return 0;
}
