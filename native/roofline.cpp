// The machine's limits, measured: what `weft bench` states its results against.
// Each loop runs on every OpenMP thread at once; the best of a few repetitions counts.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "roofline.h"
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("amx-tile")
#include "amx_tiles.h"
#pragma GCC pop_options

namespace weft {
namespace {

constexpr int kChains = 12;  // independent accumulators: enough to cover an FMA's latency on two ports

double seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Best of `reps` runs of `body` on every thread at once; returns work / second.
template <typename Body>
double best(int reps, double workPerThread, Body body) {
  double rate = 0;
  for (int r = 0; r < reps; r++) {
    int threads = 1;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel
    {
#pragma omp single
      threads = omp_get_num_threads();
      body();
    }
    const double s = seconds(start);
    if (workPerThread * threads / s > rate) rate = workPerThread * threads / s;
  }
  return rate;
}

volatile float sink;

__attribute__((target("avx512f,fma"))) void fmaLoop512(long iters) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_set1_ps(1.0f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++)
    for (auto& a : acc) a = _mm512_fmadd_ps(a, m, c);
  for (int i = 1; i < kChains; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  sink = _mm512_reduce_add_ps(acc[0]);
}

__attribute__((target("avx2,fma"))) void fmaLoop256(long iters) {
  __m256 acc[kChains];
  for (auto& a : acc) a = _mm256_set1_ps(1.0f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (long i = 0; i < iters; i++)
    for (auto& a : acc) a = _mm256_fmadd_ps(a, m, c);
  for (int i = 1; i < kChains; i++) acc[0] = _mm256_add_ps(acc[0], acc[i]);
  alignas(32) float out[8];
  _mm256_store_ps(out, acc[0]);
  sink = out[0];
}

__attribute__((target("avx512f,avx512bf16"))) void dotLoop(long iters) {
  __m512 acc[kChains];
  for (auto& a : acc) a = _mm512_setzero_ps();
  const __m512bh x = (__m512bh)_mm512_set1_epi32(0x3F803F80), y = (__m512bh)_mm512_set1_epi32(0x33803380);
  for (long i = 0; i < iters; i++)
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
  for (int i = 1; i < kChains; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
  sink = _mm512_reduce_add_ps(acc[0]);
}

// Four 16×16 C tiles fed by two A and two B tiles held in the tile registers: TMUL throughput alone.
__attribute__((target("amx-tile,amx-bf16"))) void amxLoop(long iters) {
  TileConfig c;
  for (int t = 0; t < 8; t++) c.set(t, 16, 64);
  TileScope tiles;
  tiles.load(c);
  alignas(64) static thread_local uint16_t data[16 * 32];
  for (auto& v : data) v = 0x3F80;
  _tile_loadd(4, data, 64);
  _tile_loadd(5, data, 64);
  _tile_loadd(6, data, 64);
  _tile_loadd(7, data, 64);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (long i = 0; i < iters; i++) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  alignas(64) float out[256];
  _tile_stored(0, out, 64);
  sink = out[0];
}

// Streams read at once by each thread: one stream leaves the memory system idle between the
// prefetcher's requests (about 16 GB/s a core on the AMX hosts we measured), eight keep enough
// lines in flight to reach what the weight-streaming kernels achieve (22 GB/s; 41 with 2 cores).
constexpr int kStreams = 8;

// Reads [begin, end) as kStreams equal contiguous parts in lockstep, 128 bytes of each per
// round with 256-bit loads (memory, not the adds, is the limit).
__attribute__((target("avx2"))) uint64_t readRange(const uint64_t* begin, const uint64_t* end) {
  const size_t part = static_cast<size_t>(end - begin) / kStreams / 16 * 16;
  __m256i acc[kStreams];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  for (size_t off = 0; off < part; off += 16)
    for (int s = 0; s < kStreams; s++) {
      const auto* p = reinterpret_cast<const __m256i*>(begin + s * part + off);
      const __m256i sum = _mm256_add_epi64(_mm256_add_epi64(_mm256_load_si256(p), _mm256_load_si256(p + 1)),
                                           _mm256_add_epi64(_mm256_load_si256(p + 2), _mm256_load_si256(p + 3)));
      acc[s] = _mm256_add_epi64(acc[s], sum);
    }
  alignas(32) uint64_t out[4];
  __m256i total = _mm256_setzero_si256();
  for (const __m256i& a : acc) total = _mm256_add_epi64(total, a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), total);
  return out[0] + out[1] + out[2] + out[3];
}

uint64_t readRangeScalar(const uint64_t* begin, const uint64_t* end) {
  uint64_t sum = 0;
  for (const uint64_t* p = begin; p < end; p++) sum += *p;
  return sum;
}

// Sums a buffer far larger than the caches, each thread its own contiguous share.
double readBandwidth(bool avx2) {
  const size_t bytes = size_t{1} << 30;
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) throw std::runtime_error("cannot map 1 GiB to measure bandwidth");
  madvise(mem, bytes, MADV_HUGEPAGE);  // 512 faults instead of 262,144: most of this measurement's time was the first touch
  auto* words = static_cast<uint64_t*>(mem);
  const size_t n = bytes / 8;
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; i++) words[i] = i;  // touch every page first: no page faults in the timing
  double rate = 0;
  for (int r = 0; r < 6; r++) {  // the first passes can run below speed (pages, clocks): best of six
    uint64_t sum = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : sum)
    {
      const size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
      const uint64_t* begin = words + n * id / nt / 16 * 16;
      const uint64_t* end = words + n * (id + 1) / nt / 16 * 16;
      sum += avx2 ? readRange(begin, end) : readRangeScalar(begin, end);
    }
    const double s = seconds(start);
    sink = static_cast<float>(sum);
    if (bytes / s > rate) rate = bytes / s;
  }
  munmap(mem, bytes);
  return rate;
}

}  // namespace

Rooflines measureRooflines() {
  const CpuFeatures& f = cpuFeatures();
  Rooflines r;
  r.readBytesPerSecond = readBandwidth(f.avx2);
  // Each repetition below runs 20–70 ms here: long against the clock and a thread's start, short for `weft bench`.
  constexpr long kIters = 20'000'000;
  if (f.avx512) r.fp32Flops = best(3, 2.0 * 16 * kChains * kIters, [] { fmaLoop512(kIters); });
  else if (f.avx2) r.fp32Flops = best(3, 2.0 * 8 * kChains * kIters, [] { fmaLoop256(kIters); });
  constexpr long kDotIters = 5'000'000;  // vdpbf16ps issued at a quarter of the FMAs' rate on the Xeons measured
  if (f.avx512bf16) r.bf16DotFlops = best(3, 2.0 * 32 * kChains * kDotIters, [] { dotLoop(kDotIters); });
  constexpr long kTileIters = 500'000;
  if (f.amx) r.amxFlops = best(3, 4.0 * 2 * 16 * 16 * 32 * kTileIters, [] { amxLoop(kTileIters); });
  return r;
}

}  // namespace weft
