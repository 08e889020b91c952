// The MLX matmul with AVX2: as the AVX-512 build (see kernels_mlx_avx512.cpp), each
// 16-lane accumulator held as two 8-lane halves (lanes 0-7 and 8-15), so the order and
// the bits are the same; register tiles of up to 2 activation rows × 2 columns.
#include <immintrin.h>
#include <algorithm>
#include <vector>
#include "mlx_quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace weft {
namespace {

constexpr int kRowBlock = 64;

// q of inputs k .. k+7 of one row's words (k a multiple of 8), as int32 lanes.
template <int Bits>
inline __m256i loadQ(const uint8_t* row, int k) {
  if constexpr (Bits == 8) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k)));
  } else {  // byte m holds inputs 2m (low nibble) and 2m+1: each byte twice, then shift by 0 or 4
    int32_t four;
    __builtin_memcpy(&four, row + k / 2, 4);
    const __m128i b = _mm_cvtsi32_si128(four);
    const __m256i v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    const __m256i shift = _mm256_set_epi32(4, 0, 4, 0, 4, 0, 4, 0);
    return _mm256_and_si256(_mm256_srlv_epi32(v, shift), _mm256_set1_epi32(0xF));
  }
}

template <int Bits>
void dequantPanel(const PackedMatrix& w, int n, float* buf) {
  const size_t rowBytes = static_cast<size_t>(w.K) * Bits / 8;
  const int groups = w.K / w.group;
  for (int c = 0; c < kMlxPanel; c++) {
    float* out = buf + static_cast<size_t>(c) * w.K;
    if (n + c >= w.N) {
      std::fill(out, out + w.K, 0.0f);
      continue;
    }
    const uint8_t* row = static_cast<const uint8_t*>(w.data) + rowBytes * (n + c);
    for (int g = 0; g < groups; g++) {
      const size_t at = static_cast<size_t>(n + c) * groups + g;
      const __m256 s = _mm256_set1_ps(mlxParam(w.paramDtype, w.scales, at));
      const __m256 b = _mm256_set1_ps(mlxParam(w.paramDtype, w.biases, at));
      for (int k = g * w.group; k < (g + 1) * w.group; k += 8)
        _mm256_storeu_ps(out + k, _mm256_fmadd_ps(_mm256_cvtepi32_ps(loadQ<Bits>(row, k)), s, b));
    }
  }
}

// Lanes 0-7 in lo, 8-15 in hi, reduced in mlx_quant.h's order.
inline float reduce(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Activation rows t .. t+R-1 against columns n+c0, n+c0+1 of the dequantized panel.
template <int R>
void tile(const float* x, int t, const float* buf, const PackedMatrix& w, int n, int c0, float* y) {
  const int K = w.K;
  __m256 lo[R][2], hi[R][2];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 2; c++) lo[r][c] = hi[r][c] = _mm256_setzero_ps();
  const float* w0 = buf + static_cast<size_t>(c0) * K;
  const float* w1 = w0 + K;
  for (int k = 0; k < K; k += 16) {
    const __m256 a0 = _mm256_loadu_ps(w0 + k), a1 = _mm256_loadu_ps(w0 + k + 8);
    const __m256 b0 = _mm256_loadu_ps(w1 + k), b1 = _mm256_loadu_ps(w1 + k + 8);
    for (int r = 0; r < R; r++) {
      const float* xr = x + static_cast<size_t>(t + r) * K + k;
      const __m256 x0 = _mm256_loadu_ps(xr), x1 = _mm256_loadu_ps(xr + 8);
      lo[r][0] = _mm256_fmadd_ps(a0, x0, lo[r][0]);
      hi[r][0] = _mm256_fmadd_ps(a1, x1, hi[r][0]);
      lo[r][1] = _mm256_fmadd_ps(b0, x0, lo[r][1]);
      hi[r][1] = _mm256_fmadd_ps(b1, x1, hi[r][1]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < 2 && n + c0 + c < w.N; c++) y[static_cast<size_t>(t + r) * w.N + n + c0 + c] = reduce(lo[r][c], hi[r][c]);
}

template <int Bits>
void matmul(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  static thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(kMlxPanel) * w.K) buf.resize(static_cast<size_t>(kMlxPanel) * w.K);
  for (int tb = 0; tb < T; tb += kRowBlock) {  // a block's activations stay in L2 while the panels go past
    const int te = std::min(T, tb + kRowBlock);
    for (int n = n0; n < n1; n += kMlxPanel) {
      dequantPanel<Bits>(w, n, buf.data());
      for (int c0 = 0; c0 < kMlxPanel && n + c0 < w.N; c0 += 2) {
        int t = tb;
        for (; t + 2 <= te; t += 2) tile<2>(x, t, buf.data(), w, n, c0, y);
        if (t < te) tile<1>(x, t, buf.data(), w, n, c0, y);
      }
    }
  }
}

}  // namespace

void matmulMlxAvx2(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (w.dtype == DType::MLX4) matmul<4>(x, T, w, y, n0, n1);
  else matmul<8>(x, T, w, y, n0, n1);
}

}  // namespace weft

#pragma GCC pop_options
