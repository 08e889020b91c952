// The MLX matmul with AVX-512: a panel of kMlxPanel weight rows dequantized into an
// fp32 buffer 16 weights at a time, then register tiles of up to 4 activation rows ×
// the panel's 4 columns, one 16-lane accumulator each (lane = k % 16, see mlx_quant.h).
// GCC 12 reports its own AVX-512 intrinsics headers as reading uninitialised values.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <vector>
#include "mlx_quant.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")

namespace weft {
namespace {

// q of inputs k .. k+15 of one row's words (k a multiple of 16), as int32 lanes.
template <int Bits>
inline __m512i loadQ(const uint8_t* row, int k) {
  if constexpr (Bits == 8) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + k)));
  } else {  // byte m holds inputs 2m (low nibble) and 2m+1: each byte twice, then shift by 0 or 4
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + k / 2));
    const __m512i v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    const __m512i shift = _mm512_set_epi32(4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0, 4, 0);
    return _mm512_and_si512(_mm512_srlv_epi32(v, shift), _mm512_set1_epi32(0xF));
  }
}

// Weight rows n .. n+3 (rows past N as zeros) dequantized into buf (4 × K, row-major).
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
      const __m512 s = _mm512_set1_ps(mlxParam(w.paramDtype, w.scales, at));
      const __m512 b = _mm512_set1_ps(mlxParam(w.paramDtype, w.biases, at));
      for (int k = g * w.group; k < (g + 1) * w.group; k += 16)
        _mm512_storeu_ps(out + k, _mm512_fmadd_ps(_mm512_cvtepi32_ps(loadQ<Bits>(row, k)), s, b));
    }
  }
}

// The 16 lanes of acc reduced in mlx_quant.h's order.
inline float reduce(__m512 acc) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Activation rows t .. t+R-1 against the dequantized panel of columns n .. n+3.
template <int R>
void tile(const float* x, int t, const float* buf, const PackedMatrix& w, int n, float* y) {
  const int K = w.K;
  __m512 acc[R][kMlxPanel];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel; c++) acc[r][c] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 16) {
    __m512 wv[kMlxPanel];
    for (int c = 0; c < kMlxPanel; c++) wv[c] = _mm512_loadu_ps(buf + static_cast<size_t>(c) * K + k);
    for (int r = 0; r < R; r++) {
      const __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(t + r) * K + k);
      for (int c = 0; c < kMlxPanel; c++) acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel && n + c < w.N; c++) y[static_cast<size_t>(t + r) * w.N + n + c] = reduce(acc[r][c]);
}

template <int Bits>
void matmul(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  static thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(kMlxPanel) * w.K) buf.resize(static_cast<size_t>(kMlxPanel) * w.K);
  for (int n = n0; n < n1; n += kMlxPanel) {
    dequantPanel<Bits>(w, n, buf.data());
    int t = 0;
    for (; t + 4 <= T; t += 4) tile<4>(x, t, buf.data(), w, n, y);
    switch (T - t) {
      case 3: tile<3>(x, t, buf.data(), w, n, y); break;
      case 2: tile<2>(x, t, buf.data(), w, n, y); break;
      case 1: tile<1>(x, t, buf.data(), w, n, y); break;
      default: break;
    }
  }
}

}  // namespace

void matmulMlxAvx512(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (w.dtype == DType::MLX4) matmul<4>(x, T, w, y, n0, n1);
  else matmul<8>(x, T, w, y, n0, n1);
}

}  // namespace weft

#pragma GCC pop_options
