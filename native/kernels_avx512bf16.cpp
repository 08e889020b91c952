// AVX512_BF16 (vdpbf16ps): bfloat16 mode's matmul with one instruction per
// input pair of 16 columns; every other loop is the AVX-512 set's.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <cstring>
#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,fma")

namespace weft {
namespace {

// R rows × C 16-column tiles. Per output and per input pair, in order, one
// vdpbf16ps lane: acc += x[2p+1]·w[2p+1], then acc += x[2p]·w[2p] (pair order).
template <int R, int C>
inline void tile(const uint16_t* xp, int T0, const PackedMatrix& w, int g, float* y) {
  __m512 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
  const uint16_t* wg = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const size_t tileStride = static_cast<size_t>(w.Kp) * kTileCols;
  for (int p = 0; p < w.Kp / 2; p++) {
    __m512bh wv[C];
    for (int c = 0; c < C; c++) wv[c] = (__m512bh)_mm512_loadu_si512(wg + c * tileStride + static_cast<size_t>(p) * 2 * kTileCols);
    for (int r = 0; r < R; r++) {
      int32_t pair;
      std::memcpy(&pair, xp + static_cast<size_t>(T0 + r) * w.Kp + 2 * p, 4);
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int c = 0; c < C; c++) {
    const int cols = w.N - (g + c) * kTileCols;
    const __mmask16 m = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + static_cast<size_t>(T0 + r) * w.N + (g + c) * kTileCols, m, acc[r][c]);
  }
}

// Rows in blocks of 64 (their activations stay in L2) against runs of four
// tiles (their weights stay in L2 while the block's rows stream past them).
void matmulBf16(const Bf16Rows& rows, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  const uint16_t* xp = rows.rounded;
  constexpr int kRowBlock = 64;
  for (int tb = 0; tb < T; tb += kRowBlock) {
    const int te = tb + kRowBlock < T ? tb + kRowBlock : T;
    int g = g0;
    for (; g + 4 <= g1; g += 4) {
      int t = tb;
      for (; t + 4 <= te; t += 4) tile<4, 4>(xp, t, w, g, y);
      for (; t < te; t++) tile<1, 4>(xp, t, w, g, y);
    }
    for (; g < g1; g++) {
      int t = tb;
      for (; t + 4 <= te; t += 4) tile<4, 1>(xp, t, w, g, y);
      for (; t < te; t++) tile<1, 1>(xp, t, w, g, y);
    }
  }
}

}  // namespace

const Kernels& kernelsAvx512Bf16() {
  static const Kernels k = [] {
    Kernels s = kernelsAvx512();
    s.name = "avx512bf16";
    s.matmulBf16 = matmulBf16;
    s.bf16ByDefault = true;
    return s;
  }();
  return k;
}

}  // namespace weft

#pragma GCC pop_options
