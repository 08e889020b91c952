// The MLX matmul with AVX-512: register tiles of up to 4 activation rows × a panel of
// kMlxPanel columns, one 16-lane accumulator each (lane = k % 16, see mlx_quant.h).
// A step of at most 3 rows dequantizes the weights in registers as it uses them (each
// weight serves every row at once). A larger step dequantizes the panel a chunk of inputs
// at a time into an L1 buffer that every row tile then reads; the accumulators of all rows
// wait in memory between chunks, so each lane still sees k in order: the same bits.
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

constexpr int kFusedRows = 3;  // steps of up to this many rows dequantize in registers (4 would spill: 8 registers hold the scales and biases)
constexpr int kRowBlock = 64;  // rows whose activations stay in L2 while the panels go past
constexpr int kChunk = 1024;   // inputs per dequantized chunk: 4 columns × 1024 floats = 16 KiB (measured better than 256)

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

// The 16 lanes of acc reduced in mlx_quant.h's order.
inline float reduce(__m512 acc) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Where row n's words start, and its group g's scale and bias (a column past N stands in
// for the last one: computed, never stored).
struct Column {
  const uint8_t* words;
  size_t params;  // index of group 0's scale and bias
};
template <int Bits>
inline Column column(const PackedMatrix& w, int n) {
  n = std::min(n, w.N - 1);
  return {static_cast<const uint8_t*>(w.data) + static_cast<size_t>(n) * w.K * Bits / 8, static_cast<size_t>(n) * (w.K / w.group)};
}

// All R ≤ 3 rows of the step against columns n .. n+3, dequantizing in registers.
template <int Bits, int R>
void fusedTile(const float* x, const PackedMatrix& w, int n, float* y) {
  const int K = w.K, groups = K / w.group;
  Column cols[kMlxPanel];
  for (int c = 0; c < kMlxPanel; c++) cols[c] = column<Bits>(w, n + c);
  __m512 acc[R][kMlxPanel];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel; c++) acc[r][c] = _mm512_setzero_ps();
  for (int g = 0; g < groups; g++) {
    __m512 s[kMlxPanel], b[kMlxPanel];
    for (int c = 0; c < kMlxPanel; c++) {
      s[c] = _mm512_set1_ps(mlxParam(w.paramDtype, w.scales, cols[c].params + g));
      b[c] = _mm512_set1_ps(mlxParam(w.paramDtype, w.biases, cols[c].params + g));
    }
    for (int k = g * w.group; k < (g + 1) * w.group; k += 16) {
      __m512 wv[kMlxPanel];
      for (int c = 0; c < kMlxPanel; c++) wv[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(loadQ<Bits>(cols[c].words, k)), s[c], b[c]);
      for (int r = 0; r < R; r++) {
        const __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(r) * K + k);
        for (int c = 0; c < kMlxPanel; c++) acc[r][c] = _mm512_fmadd_ps(wv[c], xv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel && n + c < w.N; c++) y[static_cast<size_t>(r) * w.N + n + c] = reduce(acc[r][c]);
}

// Inputs [k0, k1) of columns n .. n+3 dequantized into buf (column c at c · kChunk).
template <int Bits>
void dequantChunk(const PackedMatrix& w, int n, int k0, int k1, float* buf) {
  for (int c = 0; c < kMlxPanel; c++) {
    const Column col = column<Bits>(w, n + c);
    for (int g = k0 / w.group; g < k1 / w.group; g++) {
      const __m512 s = _mm512_set1_ps(mlxParam(w.paramDtype, w.scales, col.params + g));
      const __m512 b = _mm512_set1_ps(mlxParam(w.paramDtype, w.biases, col.params + g));
      for (int k = g * w.group; k < (g + 1) * w.group; k += 16)
        _mm512_storeu_ps(buf + c * kChunk + (k - k0), _mm512_fmadd_ps(_mm512_cvtepi32_ps(loadQ<Bits>(col.words, k)), s, b));
    }
  }
}

// Rows t .. t+R-1 over inputs [k0, k1) of the dequantized chunk; their accumulators
// (R × 4 vectors of 16 floats from `acc`) are loaded before and stored after.
template <int R>
void chunkTile(const float* x, int t, int K, const float* buf, int k0, int k1, float* acc) {
  __m512 a[R][kMlxPanel];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel; c++) a[r][c] = _mm512_loadu_ps(acc + ((t + r) * kMlxPanel + c) * 16);
  for (int k = k0; k < k1; k += 16) {
    __m512 wv[kMlxPanel];
    for (int c = 0; c < kMlxPanel; c++) wv[c] = _mm512_loadu_ps(buf + c * kChunk + (k - k0));
    for (int r = 0; r < R; r++) {
      const __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(t + r) * K + k);
      for (int c = 0; c < kMlxPanel; c++) a[r][c] = _mm512_fmadd_ps(wv[c], xv, a[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kMlxPanel; c++) _mm512_storeu_ps(acc + ((t + r) * kMlxPanel + c) * 16, a[r][c]);
}

template <int Bits>
void matmul(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (T <= kFusedRows) {
    for (int n = n0; n < n1; n += kMlxPanel) {
      switch (T) {
        case 3: fusedTile<Bits, 3>(x, w, n, y); break;
        case 2: fusedTile<Bits, 2>(x, w, n, y); break;
        default: fusedTile<Bits, 1>(x, w, n, y); break;
      }
    }
    return;
  }
  alignas(64) float buf[kMlxPanel * kChunk];
  alignas(64) float acc[kRowBlock * kMlxPanel * 16];  // a block's accumulators, 16 lanes each
  for (int tb = 0; tb < T; tb += kRowBlock) {
    const int rows = std::min(kRowBlock, T - tb);
    const float* xb = x + static_cast<size_t>(tb) * w.K;
    float* yb = y + static_cast<size_t>(tb) * w.N;
    for (int n = n0; n < n1; n += kMlxPanel) {
      std::fill(acc, acc + rows * kMlxPanel * 16, 0.0f);
      for (int k0 = 0; k0 < w.K; k0 += kChunk) {
        const int k1 = std::min(w.K, k0 + kChunk);  // K and kChunk are multiples of the group
        dequantChunk<Bits>(w, n, k0, k1, buf);
        int t = 0;
        for (; t + 4 <= rows; t += 4) chunkTile<4>(xb, t, w.K, buf, k0, k1, acc);
        switch (rows - t) {
          case 3: chunkTile<3>(xb, t, w.K, buf, k0, k1, acc); break;
          case 2: chunkTile<2>(xb, t, w.K, buf, k0, k1, acc); break;
          case 1: chunkTile<1>(xb, t, w.K, buf, k0, k1, acc); break;
          default: break;
        }
      }
      for (int t = 0; t < rows; t++)
        for (int c = 0; c < kMlxPanel && n + c < w.N; c++) yb[static_cast<size_t>(t) * w.N + n + c] = reduce(_mm512_load_ps(acc + (t * kMlxPanel + c) * 16));
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
