// Reading the VNNI panels (quant_panels.h) of the block-quantized types: per unit, the columns'
// scales decoded to floats and each VNNI row (one 4-input word of the panel's 16 columns) decoded to
// bytes, and the walk over a panel's units with the panels ahead asked into L2. Shared by the VNNI
// lane kernel (kernels_quant_panels.cpp) and the AMX tiles (kernels_quant_amx.cpp), which must read
// the same values.
//
// Include after a `#pragma GCC target` that enables AVX-512 (F, BW, VL, DQ), F16C and FMA, and after
// kquant_blocks.h. Everything here has internal linkage, so each kernel file compiles its own copy
// for its own target.
#pragma once
#include <immintrin.h>
#include <cstddef>
#include <cstdint>
#include <utility>
#include "quant.h"
#include "quant_panels.h"

namespace weft {
namespace {

constexpr int kCols = kPanelCols;  // output columns per panel: one per 32-bit lane (a B tile's 4-byte columns)
template <DType D>
constexpr int kUnitBytes = panelUnitBytes(D);
// Unsigned values with a min term per block (the others are signed, or read with an offset).
template <DType D>
constexpr bool kHasMins = D == DType::Q4_1 || D == DType::Q4_K || D == DType::Q5_K;
// The panel types that hold signed weight bytes (Q8_0's quants, Q6_KW's widened values):
// vpdpbusd reads them as w + 128 (the sign bit flipped).
template <DType D>
constexpr bool kSignedBytes = D == DType::Q8_0 || D == DType::Q6_KW;
// Q6_K's two panel types: one scale per 16 inputs, two groups a block.
template <DType D>
constexpr bool kQ6Groups = D == DType::Q6_K || D == DType::Q6_KW;
// The offset a signed type's weights are read with as unsigned bytes by vpdpbusd (Q8_0 and Q6_KW
// as w + 128; Q4_0's and Q6_K's stored values are w + 8 and w + 32): each sum then starts at minus
// the offset times its inputs' Σx.
constexpr int offsetOf(DType d) {
  return d == DType::Q8_0 || d == DType::Q6_KW ? 128 : d == DType::Q4_0 ? 8 : d == DType::Q6_K ? kQ6KBias : 0;
}
template <DType D>
constexpr int kOffset = offsetOf(D);
// Q5_K's d, dmin and scale words lie as Q4_K's, Q6_KW's d and scales as Q6_K's (decodeScales reads each pair the same way).
static_assert(q4kpanel::kD == q5kpanel::kD && q4kpanel::kDmin == q5kpanel::kDmin && q4kpanel::kScales == q5kpanel::kScales);
static_assert(q6kpanel::kD == q6kwpanel::kD && q6kpanel::kScales == q6kwpanel::kScales);
template <DType D>
constexpr int kBlocksPerUnit = D == DType::Q4_K || D == DType::Q5_K || kQ6Groups<D> ? 8 : 1;
// Weight panels are asked into L2 this many panels ahead, a share of the panel per unit: with
// no prefetch one row streamed 10–20 % slower (matmul-timing, session 20). Four panels of Q8_0
// (68 KiB at K = 1024) are more than L1 holds: with L1 as the target, one-row Q8_0 steps took
// 12 % longer. The current panel instead (distance 0) was 2–5 % faster at one row but 20 %
// slower at four rows of Q8_0.
constexpr int kPrefetchPanels = 4;

using U32x16 = uint32_t __attribute__((vector_size(64)));

inline __m512i load64(const uint8_t* p) { return _mm512_loadu_si512(p); }
// The 16 f16 values at p, one per column.
inline __m512 f16x16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
// Byte k of each 32-bit word, unsigned or signed, as floats.
inline __m512 byteOf(U32x16 w, int k) { return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(__m512i(w), 8 * k), _mm512_set1_epi32(0xFF))); }
inline __m512 signedByteOf(__m512i w, int k) { return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * k), 24)); }

// One panel's units, and the panels ahead to prefetch while it runs.
struct Panel {
  const uint8_t* at;
  const char* ahead = nullptr;  // kPrefetchPanels panels on, if the thread's columns reach
  size_t aheadBytes = 0;
};

// The panel ahead asked into L2 in n equal parts, one per call of next(): a few lines at a
// time, spread over the work on the current panel.
struct Ahead {
  const char* at = nullptr;
  const char* end = nullptr;
  size_t lines = 0;  // per part
  Ahead() = default;
  Ahead(const Panel& p, int n) : at(p.ahead), end(p.ahead + p.aheadBytes), lines((p.aheadBytes / 64 + n) / n) {}
  void next() {
    for (size_t k = 0; k < lines && at < end; k++, at += 64) _mm_prefetch(at, _MM_HINT_T1);
  }
};

// A unit's scales, one per column: per group (one-block units: 1; Q4_K, Q5_K: 8, of 32 inputs;
// Q6_K, Q6_KW: 16, of 16) and the min terms per block.
struct UnitScales {
  __m512 scale[16];
  __m512 min[8];
};

// d (Q8_0, Q4_0), d and m (Q4_1), d·sc and −dmin·m (Q4_K, Q5_K), d·sc (Q6_K, Q6_KW): the values
// unpackRowScalar gives per column.
template <DType D>
__attribute__((always_inline)) inline void decodeScales(const uint8_t* u, UnitScales& s) {
  if constexpr (D == DType::Q8_0) {
    s.scale[0] = f16x16(u + q8panel::kD);
  } else if constexpr (D == DType::Q4_0) {
    s.scale[0] = f16x16(u + q40panel::kD);
  } else if constexpr (D == DType::Q4_1) {
    s.scale[0] = f16x16(u + q41panel::kD);
    s.min[0] = f16x16(u + q41panel::kM);
  } else if constexpr (kHasMins<D>) {
    U32x16 sc03, sc47, mn03, mn47;
    const uint8_t* w = u + q4kpanel::kScales;
    q4kScaleWords(U32x16(load64(w)), U32x16(load64(w + kVnniRow)), U32x16(load64(w + 2 * kVnniRow)), &sc03, &sc47, &mn03, &mn47);
    const __m512 d = f16x16(u + q4kpanel::kD), negMin = _mm512_xor_ps(f16x16(u + q4kpanel::kDmin), _mm512_set1_ps(-0.0f));
    for (int k = 0; k < 4; k++) {
      s.scale[k] = _mm512_mul_ps(d, byteOf(sc03, k));
      s.scale[4 + k] = _mm512_mul_ps(d, byteOf(sc47, k));
      s.min[k] = _mm512_mul_ps(negMin, byteOf(mn03, k));
      s.min[4 + k] = _mm512_mul_ps(negMin, byteOf(mn47, k));
    }
  } else {
    const __m512 d = f16x16(u + q6kpanel::kD);
    for (int i = 0; i < 4; i++) {
      const __m512i w = load64(u + q6kpanel::kScales + kVnniRow * i);
      for (int k = 0; k < 4; k++) s.scale[4 * i + k] = _mm512_mul_ps(d, signedByteOf(w, k));
    }
  }
}

// VNNI row r (inputs 4r..4r+3) of block J of a unit, 16 columns: Q8_0's and Q6_KW's signed
// weights, the other types' unsigned stored values (4, 5 or 6 bits).
template <DType D, int J>
__attribute__((always_inline)) inline __m512i vnniRow(const uint8_t* u, int r) {
  if constexpr (D == DType::Q8_0) {
    return load64(u + q8panel::kQ + kVnniRow * r);
  } else if constexpr (D == DType::Q4_0 || D == DType::Q4_1) {  // rows 0–3 the low nibbles, 4–7 the high
    const U8x64 q = U8x64(load64(u + (D == DType::Q4_0 ? q40panel::kQ : q41panel::kQ) + kVnniRow * (r % 4)));
    return __m512i(r < 4 ? q & 0x0F : q >> 4);
  } else if constexpr (D == DType::Q4_K) {
    return __m512i(q4kQuants<J % 2 == 1>(U8x64(load64(u + q4kpanel::kQs + kVnniRow * (8 * (J / 2) + r)))));
  } else if constexpr (D == DType::Q5_K) {  // the low 4 bits as Q4_K's, the 5th from bit J of qh
    const U8x64 low = q4kQuants<J % 2 == 1>(U8x64(load64(u + q5kpanel::kQs + kVnniRow * (8 * (J / 2) + r))));
    const U8x64 h = U8x64(load64(u + q5kpanel::kQh + kVnniRow * r));
    return __m512i(low | ((J <= 4 ? h << (4 - J) : h >> (J - 4)) & 0x10));
  } else if constexpr (D == DType::Q6_K) {
    constexpr int n = J / 4, k = J % 4;  // the half, and the block within it
    const U8x64 l = U8x64(load64(u + q6kpanel::kQl + kVnniRow * (8 * (2 * n + k % 2) + r)));
    const U8x64 h = U8x64(load64(u + q6kpanel::kQh + kVnniRow * (8 * n + r)));
    return __m512i(q6kBits<k>(l, h));
  } else {
    return load64(u + q6kwpanel::kQ + kVnniRow * (8 * J + r));
  }
}

// f(std::integral_constant<int, J>()) for J = 0..N−1, in order: each block's index known when compiled.
template <int N, int J = 0, class F>
__attribute__((always_inline)) inline void eachBlock(F&& f) {
  if constexpr (J < N) {
    f(std::integral_constant<int, J>());
    eachBlock<N, J + 1>(f);
  }
}

// f(u, unit, scales) for each unit of the panel in order, its scales decoded, while the
// panels ahead are prefetched.
template <DType D, class F>
__attribute__((always_inline)) inline void eachUnit(const Panel& p, int units, F&& f) {
  Ahead ahead(p, units);
  for (int u = 0; u < units; u++) {
    ahead.next();
    const uint8_t* unit = p.at + static_cast<size_t>(u) * kUnitBytes<D>;
    UnitScales s;
    decodeScales<D>(unit, s);
    f(u, unit, s);
  }
}

// Column n's panel of w (n a multiple of kCols, n < n1), with the panel kPrefetchPanels on as the
// one to prefetch if the run [n, n1) reaches it.
inline Panel panelOf(const PackedMatrix& w, int n, int n1) {
  const size_t bytes = panelBytes(w.panelType, kCols, w.K);
  Panel p{static_cast<const uint8_t*>(w.data) + bytes * (n / kCols)};
  if (n + (kPrefetchPanels + 1) * kCols <= n1) {
    p.ahead = reinterpret_cast<const char*>(p.at + bytes * kPrefetchPanels);
    p.aheadBytes = bytes;
  }
  return p;
}

}  // namespace
}  // namespace weft
