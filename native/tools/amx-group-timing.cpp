// Times the per-group pattern of the amx set's 32-row quantized kernel (panelRowPair in
// kernels_quant_amx.cpp) on one thread with everything in L1, and its parts alone, to see which
// part binds: per group of 32 inputs, two row tiles' A loads, one B load, two zeroed C tiles and
// two TDPBSSDs; the previous group's two tile stores; and the scaling of the group two back
// (sixteen rows each of load, convert, multiply and FMA, the second tile's accumulators in L1).
// Not part of the addon or the tests; the data are arbitrary (the sums are not checked). Build after
// the addon (it links the addon's own objects, for cpuFeatures: the CPU check and Linux's AMX grant):
//   O=build/Release/obj.target/weft_native/native
//   g++ -O2 -std=c++17 -fopenmp -march=sapphirerapids -Inative -o /tmp/amx-group-timing native/tools/amx-group-timing.cpp $O/kernels*.o $O/matmul.o $O/quantize.o $O/quant_panels.o
// Usage: amx-group-timing [all|amx|amx-stores|stores-no-zero|scaling]
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include "amx_tiles.h"
#include "kernels.h"

using namespace weft;

namespace {

constexpr int kGroups = 32, kRounds = 200000, kLag = 2, kBufs = kLag + 1;

enum class Part { All, Amx, AmxStores, StoresNoZero, Scaling };

alignas(64) int8_t a[2 * kGroups][16 * 32];
alignas(64) int8_t b[kGroups][8 * 64];
alignas(64) int32_t sums[kBufs][2][16 * 16];
alignas(64) float acc1[16 * 16];

// A 0/1 (16 rows × 32 bytes), B 2/3 (8 VNNI rows), C 4/5 and 6/7: the kernel's configuration.
void configure() {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, 16, 32);
    c.set(2 + i, 8, 64);
    c.set(4 + i, 16, 64);
    c.set(6 + i, 16, 64);
  }
  asm volatile("ldtilecfg %0" : : "m"(c));
}

#define PRODUCTS(B, C0, C1, g, zero)  \
  do {                                \
    _tile_loadd(B, b[g], 64);         \
    if (zero) {                       \
      _tile_zero(C0);                 \
      _tile_zero(C1);                 \
    }                                 \
    _tile_loadd(0, a[g], 32);         \
    _tile_dpbssd(C0, 0, B);           \
    _tile_loadd(1, a[kGroups + g], 32); \
    _tile_dpbssd(C1, 1, B);           \
  } while (0)

void store(int g) {
  int32_t* c0 = sums[g % kBufs][0];
  int32_t* c1 = sums[g % kBufs][1];
  if (g % 2 == 0) {
    _tile_stored(4, c0, 64);
    _tile_stored(5, c1, 64);
  } else {
    _tile_stored(6, c0, 64);
    _tile_stored(7, c1, 64);
  }
}

__attribute__((always_inline)) inline void scale(int s, __m512 (&acc)[16]) {
  const int32_t* c0 = sums[s % kBufs][0];
  const int32_t* c1 = sums[s % kBufs][1];
  const __m512 w = _mm512_set1_ps(1.0f + s);
#pragma GCC unroll 16
  for (int t = 0; t < 16; t++)
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c0 + 16 * t)), _mm512_mul_ps(w, _mm512_set1_ps(0.5f * t)), acc[t]);
#pragma GCC unroll 16
  for (int t = 0; t < 16; t++)
    _mm512_store_ps(acc1 + 16 * t, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c1 + 16 * t)),
                                                   _mm512_mul_ps(w, _mm512_set1_ps(0.5f * t)), _mm512_load_ps(acc1 + 16 * t)));
}

double run(Part part) {
  const bool products = part != Part::Scaling, stores = part != Part::Amx && part != Part::Scaling;
  const bool scaling = part == Part::All || part == Part::Scaling, zero = part != Part::StoresNoZero;
  __m512 acc[16];
  for (auto& v : acc) v = _mm512_setzero_ps();
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < kRounds; r++)
    for (int g = 0; g <= kGroups + kLag; g++) {
      if (products && g < kGroups) {
        if (g % 2 == 0) PRODUCTS(2, 4, 5, g, zero);
        else PRODUCTS(3, 6, 7, g, zero);
      }
      if (stores && g >= 1 && g <= kGroups) store(g - 1);
      if (scaling && g - 1 - kLag >= 0) scale(g - 1 - kLag, acc);
    }
  const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
  float keep = acc1[3];
  for (auto& v : acc) keep += _mm512_reduce_add_ps(v);
  asm volatile("" : : "x"(keep));
  return ns / kRounds / kGroups;
}

}  // namespace

int main(int argc, char** argv) {
  const char* names[] = {"all", "amx", "amx-stores", "stores-no-zero", "scaling"};
  const char* want = argc > 1 ? argv[1] : "all";
  int part = 0;
  while (part < 5 && strcmp(names[part], want) != 0) part++;
  if (part == 5) {
    fprintf(stderr, "usage: %s [all|amx|amx-stores|stores-no-zero|scaling]\n", argv[0]);
    return 1;
  }
  if (!cpuFeatures().amx) {
    fprintf(stderr, "AMX is not available here (the CPU lacks it, or Linux refused the tile state)\n");
    return 1;
  }
  for (int i = 0; i < 2 * kGroups; i++) std::memset(a[i], i, sizeof a[i]);
  for (int i = 0; i < kGroups; i++) std::memset(b[i], 3 * i, sizeof b[i]);
  configure();
  printf("%s: %.1f ns a group (two row tiles)\n", names[part], run(static_cast<Part>(part)));
  _tile_release();
  return 0;
}
