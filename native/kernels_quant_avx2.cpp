// The quantized matmul with 256-bit integer dot products, in the order quant.h
// fixes (bit-identical to the scalar code). Compiled twice: here for AVX2, where
// a lane's 4 products are summed by vpmaddubsw + vpmaddwd, and by
// kernels_quant_vnni.cpp (WEFT_QUANT_VNNI) with one vpdpbusd. Both take the
// unsigned |w| and the activations with w's sign applied: |w| ≤ 128 and |x| ≤ 127
// keep vpmaddubsw's 16-bit pair sums from saturating.
#include <immintrin.h>
#include <cmath>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#ifdef WEFT_QUANT_VNNI
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define WEFT_QUANT_MATMUL matmulQuantVnni
#else
#pragma GCC target("avx2,fma,f16c")
#define WEFT_QUANT_MATMUL matmulQuantAvx2
#endif

namespace weft {
namespace {

// Lane l (bytes 4l..4l+3) of the result: the exact int32 Σ w·x of those four bytes.
inline __m256i dot4(__m256i w, __m256i x) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sx = _mm256_sign_epi8(x, w);
#ifdef WEFT_QUANT_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
#endif
}

inline float f16At(const uint8_t* p) {
  return _cvtsh_ss(static_cast<unsigned short>(p[0] | p[1] << 8));
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store32(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

void unpackQ8_0(const uint8_t* src, int K, const UnpackedRow& r) {
  for (int b = 0; b < K / 32; b++, src += 34) {
    store32(r.q + 32 * b, load32(src + 2));
    _mm256_storeu_ps(r.dv + 8 * b, _mm256_set1_ps(f16At(src)));
    r.m[b] = 0.0f;
  }
}

// The 6-bit scales and mins (ggml's get_scale_min_k4) of one Q4_K superblock.
void scalesK4(const uint8_t* q, int* sc, int* m) {
  for (int j = 0; j < 8; j++) {
    if (j < 4) {
      sc[j] = q[j] & 63;
      m[j] = q[j + 4] & 63;
    } else {
      sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
      m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
  }
}

void unpackQ4K(const uint8_t* src, int K, const UnpackedRow& r) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int sb = 0; sb < K / 256; sb++, src += 144) {
    const float d = f16At(src), dmin = f16At(src + 2);
    int sc[8], mi[8];
    scalesK4(src + 4, sc, mi);
    int8_t* q = r.q + 256 * sb;
    for (int j = 0; j < 4; j++) {
      const __m256i v = load32(src + 16 + 32 * j);
      store32(q + 64 * j, _mm256_and_si256(v, low));
      store32(q + 64 * j + 32, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
    }
    for (int j = 0; j < 8; j++) {
      _mm256_storeu_ps(r.dv + 8 * (8 * sb + j), _mm256_set1_ps(d * sc[j]));
      r.m[8 * sb + j] = -(dmin * mi[j]);
    }
  }
}

void unpackQ6K(const uint8_t* src, int K, const UnpackedRow& r) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(0x30), bias = _mm256_set1_epi8(32);
  for (int sb = 0; sb < K / 256; sb++, src += 210) {
    const float d = f16At(src + 208);
    for (int n = 0; n < 2; n++) {
      const __m256i l0 = load32(src + 64 * n), l1 = load32(src + 64 * n + 32), h = load32(src + 128 + 32 * n);
      int8_t* q = r.q + 256 * sb + 128 * n;
      const __m256i lo0 = _mm256_and_si256(l0, low), lo1 = _mm256_and_si256(l1, low);
      const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(l0, 4), low), hi1 = _mm256_and_si256(_mm256_srli_epi16(l1, 4), low);
      store32(q, _mm256_sub_epi8(_mm256_or_si256(lo0, _mm256_and_si256(_mm256_slli_epi16(h, 4), two)), bias));
      store32(q + 32, _mm256_sub_epi8(_mm256_or_si256(lo1, _mm256_and_si256(_mm256_slli_epi16(h, 2), two)), bias));
      store32(q + 64, _mm256_sub_epi8(_mm256_or_si256(hi0, _mm256_and_si256(h, two)), bias));
      store32(q + 96, _mm256_sub_epi8(_mm256_or_si256(hi1, _mm256_and_si256(_mm256_srli_epi16(h, 2), two)), bias));
      const int8_t* sc = reinterpret_cast<const int8_t*>(src + 192 + 8 * n);
      for (int k = 0; k < 4; k++) {
        const int blk = 8 * sb + 4 * n + k;
        _mm256_storeu_ps(r.dv + 8 * blk, _mm256_set_m128(_mm_set1_ps(d * sc[2 * k + 1]), _mm_set1_ps(d * sc[2 * k])));
        r.m[blk] = 0.0f;
      }
    }
  }
}

void unpackRow(DType d, const uint8_t* src, int K, const UnpackedRow& r) {
  switch (d) {
    case DType::Q8_0: unpackQ8_0(src, K, r); return;
    case DType::Q4_K: unpackQ4K(src, K, r); return;
    case DType::Q6_K: unpackQ6K(src, K, r); return;
    default: unpackRowScalar(d, src, K, r); return;  // same values, portable code
  }
}

inline float hsum(__m256 acc) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // a0+a4, a1+a5, a2+a6, a3+a7
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // (a0+a4)+(a2+a6), (a1+a5)+(a3+a7)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

template <bool Mins>
float dotRow(const UnpackedRow& r, const QuantActBlock* x, int nb) {
  __m256 acc = _mm256_setzero_ps();
  float macc = 0.0f;
  for (int b = 0; b < nb; b++) {
    const __m256i p = dot4(load32(r.q + 32 * b), load32(x[b].q));
    const __m256 s = _mm256_mul_ps(_mm256_loadu_ps(r.dv + 8 * b), _mm256_set1_ps(x[b].d));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), s, acc);
    if (Mins) macc = std::fma(r.m[b], x[b].s, macc);
  }
  return hsum(acc) + macc;
}

}  // namespace

void WEFT_QUANT_MATMUL(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> dv, m;
  q.resize(w.K);
  dv.resize(8 * static_cast<size_t>(nb));
  m.resize(nb);
  const UnpackedRow row{q.data(), dv.data(), m.data()};
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  const bool mins = quantHasMins(w.dtype);
  for (int n = n0; n < n1; n++) {
    unpackRow(w.dtype, static_cast<const uint8_t*>(w.data) + rowBytes * n, w.K, row);
    for (int t = 0; t < T; t++) {
      const QuantActBlock* xt = x + static_cast<size_t>(t) * nb;
      y[static_cast<size_t>(t) * w.N + n] = mins ? dotRow<true>(row, xt, nb) : dotRow<false>(row, xt, nb);
    }
  }
}

}  // namespace weft

#pragma GCC pop_options
