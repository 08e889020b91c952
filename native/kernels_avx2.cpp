// AVX2 inner loops for CPUs without AVX-512: 8 fp32 lanes, 16 registers.
#include <immintrin.h>
#include "kernels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace weft {
namespace {

template <DType D>
inline __m256 loadW(const void* w, size_t i) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + i);
  } else {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + i));
    if constexpr (D == DType::F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType D>
inline float scalarW(const void* w, size_t i) {
  if constexpr (D == DType::F32) return static_cast<const float*>(w)[i];
  else if constexpr (D == DType::F16) return f16ToF32(static_cast<const uint16_t*>(w)[i]);
  else return bf16ToF32(static_cast<const uint16_t*>(w)[i]);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// An R x C tile; one accumulator per output over 8-wide steps, then a scalar tail.
template <DType D, int R, int C>
inline void tile(const float* x, int K, const void* w, float* y, int N, int t0, int n0) {
  __m256 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
  int kv = K & ~7;
  for (int k = 0; k < kv; k += 8) {
    __m256 wv[C];
    for (int c = 0; c < C; c++) wv[c] = loadW<D>(w, static_cast<size_t>(n0 + c) * K + k);
    for (int r = 0; r < R; r++) {
      __m256 xv = _mm256_loadu_ps(x + static_cast<size_t>(t0 + r) * K + k);
      for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) {
      float s = hsum(acc[r][c]);
      const float* xr = x + static_cast<size_t>(t0 + r) * K;
      for (int k = kv; k < K; k++) s += xr[k] * scalarW<D>(w, static_cast<size_t>(n0 + c) * K + k);
      y[static_cast<size_t>(t0 + r) * N + n0 + c] = s;
    }
}

template <DType D, int R>
inline void rowGroup(const float* x, int K, const void* w, float* y, int N, int t0, int n0, int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) tile<D, R, 4>(x, K, w, y, N, t0, n);
  for (; n < n1; n++) tile<D, R, 1>(x, K, w, y, N, t0, n);
}

template <DType D>
void matmulTyped(const float* x, int T, int K, const void* w, float* y, int N, int n0, int n1) {
  constexpr int kRowBlock = 64;
  constexpr int kColBlock = 64;
  for (int tb = 0; tb < T; tb += kRowBlock) {
    int te = tb + kRowBlock < T ? tb + kRowBlock : T;
    for (int nb = n0; nb < n1; nb += kColBlock) {
      int ne = nb + kColBlock < n1 ? nb + kColBlock : n1;
      int t = tb;
      for (; t + 2 <= te; t += 2) rowGroup<D, 2>(x, K, w, y, N, t, nb, ne);
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
  __m256 acc = _mm256_setzero_ps();
  int nv = n & ~7;
  for (int i = 0; i < nv; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
  float s = hsum(acc);
  for (int i = nv; i < n; i++) s += a[i] * b[i];
  return s;
}

void axpy(float alpha, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(alpha);
  int nv = n & ~7;
  for (int i = 0; i < nv; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (int i = nv; i < n; i++) y[i] += alpha * x[i];
}

}  // namespace

const Kernels& kernelsAvx2() {
  static const Kernels k{"avx2", matmul, dot, axpy};
  return k;
}

}  // namespace weft

#pragma GCC pop_options
