// AVX-512 inner loops: 16 fp32 lanes, weights widened from bf16/f16 in registers.
// GCC 12 reports its own AVX-512 intrinsics headers as reading uninitialised values.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")

namespace weft {
namespace {

template <DType D>
inline __m512 loadW(const void* w, size_t i, __mmask16 m) {
  if constexpr (D == DType::F32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(w) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(w) + i);
    if constexpr (D == DType::F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// An R x C tile of outputs; one accumulator per output, K walked in steps of 16.
template <DType D, int R, int C>
inline void tile(const float* x, int K, const void* w, float* y, int N, int t0, int n0) {
  __m512 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
  for (int k = 0; k < K; k += 16) {
    __mmask16 m = K - k >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 wv[C];
    for (int c = 0; c < C; c++) wv[c] = loadW<D>(w, static_cast<size_t>(n0 + c) * K + k, m);
    for (int r = 0; r < R; r++) {
      __m512 xv = _mm512_maskz_loadu_ps(m, x + static_cast<size_t>(t0 + r) * K + k);
      for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++)
      y[static_cast<size_t>(t0 + r) * N + n0 + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <DType D, int R>
inline void rowGroup(const float* x, int K, const void* w, float* y, int N, int t0, int n0, int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) tile<D, R, 4>(x, K, w, y, N, t0, n);
  for (; n < n1; n++) tile<D, R, 1>(x, K, w, y, N, t0, n);
}

template <DType D>
void matmulTyped(const float* x, int T, int K, const void* w, float* y, int N, int n0, int n1) {
  constexpr int kRowBlock = 64;  // keeps a block of activations in L2 while weight tiles stream
  constexpr int kColBlock = 64;
  for (int tb = 0; tb < T; tb += kRowBlock) {
    int te = tb + kRowBlock < T ? tb + kRowBlock : T;
    for (int nb = n0; nb < n1; nb += kColBlock) {
      int ne = nb + kColBlock < n1 ? nb + kColBlock : n1;
      int t = tb;
      for (; t + 4 <= te; t += 4) rowGroup<D, 4>(x, K, w, y, N, t, nb, ne);
      for (; t < te; t++) rowGroup<D, 1>(x, K, w, y, N, t, nb, ne);
    }
  }
}

void matmul(const float* x, int T, int K, const void* w, DType dtype, float* y, int N, int n0, int n1) {
  switch (dtype) {
    case DType::F32: return matmulTyped<DType::F32>(x, T, K, w, y, N, n0, n1);
    case DType::F16: return matmulTyped<DType::F16>(x, T, K, w, y, N, n0, n1);
    case DType::BF16: return matmulTyped<DType::BF16>(x, T, K, w, y, N, n0, n1);
  }
}

float dot(const float* a, const float* b, int n) {
  __m512 acc = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void axpy(float alpha, const float* x, float* y, int n) {
  __m512 av = _mm512_set1_ps(alpha);
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 yv = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, yv);
  }
}

}  // namespace

const Kernels& kernelsAvx512() {
  static const Kernels k{"avx512", matmul, dot, axpy};
  return k;
}

}  // namespace weft

#pragma GCC pop_options
