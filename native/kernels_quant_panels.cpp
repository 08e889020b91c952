// The VNNI lane kernel on the panels (quant_panels.h) of every block-quantized type (Q8_0,
// Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, and the amx set's Q6_KW): the quantized matmul of the AVX-512
// sets on CPUs with AVX512-VNNI, and the amx set's for steps of few rows. Per panel of 16 output columns, up to
// eight activation rows at a time: each VNNI row (one 4-input word of the 16 columns, decoded to
// bytes by quant_panel_units.h) meets the row's 4 inputs broadcast in one vpdpbusd, so each lane
// is one column's running sum and nothing is summed across lanes. A panel is read from memory
// for its first eight rows and from cache for the rest.
//
// The reduction order (the AMX tiles', kernels_quant_amx.cpp, which gives the same bits): per
// output, for each group g in order (32 inputs sharing a weight scale; Q6_K: 16),
// acc = fma(float(p_g), s_g · x.d, acc), with p_g the exact integer Σ w·x of the group, s_g its
// weight scale and x.d its activation block's scale; the min terms (Q4_1, Q4_K, Q5_K) go into a
// second chain, macc = fma(m_b, x_b.s, macc) per block b, and y = acc + macc. Every row's sums
// follow it whatever the step's row count, so the kernel is batch-invariant; it is not the lane
// order of quant.h that the AVX2 and scalar sets share (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")
#include "kquant_blocks.h"
#include "quant_panel_units.h"

namespace weft {
namespace {

// Rows per pass over a panel: each keeps two accumulators a row in registers (16 of AVX-512's 32
// at 8 rows), and each pass decodes the panel's scales and values again. On Zen 4, 8 against 4:
// matmul-timing 32 × 1024 × 3072 (in cache) Q4_K 30.0–31.8 → 29.4–29.9, Q6_K 34.7–35.2 → 33.1–33.6,
// Q8_0 26.0–27.9 → 25.9–27.0 ns a unit; a Q4_K_M step of 16 rows 59.0–59.8 → 56.5–57.5 ms.
// (On the Intel hosts of earlier sessions 6 or 8 rows were within 10 % of 4.)
constexpr int kVecRows = 8;

// Block J (block b of the matrix) of unit u for R rows: per group the exact sums, one lane per
// column (the chain started at minus the offset times Σx), then the fp32 operations of the header.
template <DType D, int J, int R>
__attribute__((always_inline)) inline void vecBlock(const uint8_t* u, const UnitScales& s, const QuantActBlock* x, int nb, int b,
                                                    __m512 (&acc)[R], __m512 (&macc)[R]) {
  __m512i w[8];
  for (int r = 0; r < 8; r++) {
    w[r] = vnniRow<D, J>(u, r);
    if constexpr (kSignedBytes<D>) w[r] = _mm512_xor_si512(w[r], _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128: unsigned
  }
  for (int t = 0; t < R; t++) {
    const size_t i = static_cast<size_t>(t) * nb + b;
    const QuantActBlock& xb = x[i];
    const auto word = [&](int r) {
      int32_t v;
      std::memcpy(&v, xb.q + 4 * r, 4);
      return _mm512_set1_epi32(v);
    };
    const __m512 xd = _mm512_set1_ps(xb.d);
    if constexpr (kQ6Groups<D>) {
      __m512i lo = _mm512_set1_epi32(-kOffset<D> * xb.half[0]), hi = _mm512_set1_epi32(-kOffset<D> * xb.half[1]);
      for (int r = 0; r < 4; r++) lo = _mm512_dpbusd_epi32(lo, w[r], word(r));
      for (int r = 4; r < 8; r++) hi = _mm512_dpbusd_epi32(hi, w[r], word(r));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(s.scale[2 * J], xd), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(s.scale[2 * J + 1], xd), acc[t]);
    } else {
      __m512i p = kOffset<D> ? _mm512_set1_epi32(-kOffset<D> * (xb.half[0] + xb.half[1])) : _mm512_setzero_si512();
      for (int r = 0; r < 8; r++) p = _mm512_dpbusd_epi32(p, w[r], word(r));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s.scale[J], xd), acc[t]);
      if constexpr (kHasMins<D>) macc[t] = _mm512_fmadd_ps(s.min[J], _mm512_set1_ps(xb.s), macc[t]);
    }
  }
}

// R activation rows (row t's blocks at x + t·nb; y: row stride N) × one panel's first `cols` columns.
template <DType D, int R>
void vecRows(const Panel& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  constexpr int perUnit = kBlocksPerUnit<D>;
  __m512 acc[R], macc[R];
  for (int t = 0; t < R; t++) acc[t] = macc[t] = _mm512_setzero_ps();
  eachUnit<D>(p, nb / perUnit, [&](int u, const uint8_t* unit, const UnitScales& s) {
    eachBlock<perUnit>([&](auto j) { vecBlock<D, decltype(j)::value, R>(unit, s, x, nb, perUnit * u + decltype(j)::value, acc, macc); });
  });
  const __mmask16 written = static_cast<__mmask16>((1u << cols) - 1);
  for (int t = 0; t < R; t++)
    _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * N, written, kHasMins<D> ? _mm512_add_ps(acc[t], macc[t]) : acc[t]);
}

template <DType D>
void vecRowsOf(const Panel& p, const QuantActBlock* x, int T, int nb, float* y, int N, int cols) {
  switch (T) {
    case 1: vecRows<D, 1>(p, x, nb, y, N, cols); break;
    case 2: vecRows<D, 2>(p, x, nb, y, N, cols); break;
    case 3: vecRows<D, 3>(p, x, nb, y, N, cols); break;
    case 4: vecRows<D, 4>(p, x, nb, y, N, cols); break;
    case 5: vecRows<D, 5>(p, x, nb, y, N, cols); break;
    case 6: vecRows<D, 6>(p, x, nb, y, N, cols); break;
    case 7: vecRows<D, 7>(p, x, nb, y, N, cols); break;
    case 8: vecRows<D, 8>(p, x, nb, y, N, cols); break;
    default: break;
  }
}

void vecRowsFor(DType d, const Panel& p, const QuantActBlock* x, int T, int nb, float* y, int N, int cols) {
  switch (d) {
    case DType::Q4_0: vecRowsOf<DType::Q4_0>(p, x, T, nb, y, N, cols); break;
    case DType::Q4_1: vecRowsOf<DType::Q4_1>(p, x, T, nb, y, N, cols); break;
    case DType::Q4_K: vecRowsOf<DType::Q4_K>(p, x, T, nb, y, N, cols); break;
    case DType::Q5_K: vecRowsOf<DType::Q5_K>(p, x, T, nb, y, N, cols); break;
    case DType::Q6_K: vecRowsOf<DType::Q6_K>(p, x, T, nb, y, N, cols); break;
    case DType::Q6_KW: vecRowsOf<DType::Q6_KW>(p, x, T, nb, y, N, cols); break;
    default: vecRowsOf<DType::Q8_0>(p, x, T, nb, y, N, cols); break;
  }
}

// A Q6_K panel's units as Q6_KW's (the amx set's form: d and scales as they are, the 6-bit values
// widened to signed bytes), for steps of more than kVecRows rows: each pass over the panel then
// loads its bytes instead of unpacking ql and qh again. The integer sums are the same (a stored value
// u read as u − 32 + 128 with the offset 128, instead of u with the offset 32), so are the bits.
void widenQ6Panel(const Panel& p, int units, uint8_t* out) {
  Ahead ahead(p, units);
  for (int u = 0; u < units; u++) {
    ahead.next();
    const uint8_t* src = p.at + static_cast<size_t>(u) * kUnitBytes<DType::Q6_K>;
    uint8_t* dst = out + static_cast<size_t>(u) * kUnitBytes<DType::Q6_KW>;
    std::memcpy(dst + q6kwpanel::kD, src + q6kpanel::kD, q6kpanel::kQl - q6kpanel::kD);  // d and the scales
    eachBlock<8>([&](auto j) {
      constexpr int J = decltype(j)::value;
      for (int r = 0; r < 8; r++)
        _mm512_storeu_si512(dst + q6kwpanel::kQ + kVnniRow * (8 * J + r),
                            _mm512_sub_epi8(vnniRow<DType::Q6_K, J>(src, r), _mm512_set1_epi8(static_cast<char>(kQ6KBias))));
    });
  }
}

}  // namespace

void matmulQuantPanels(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  const bool widen = w.panelType == DType::Q6_K && T > kVecRows;
  thread_local std::vector<uint8_t> wide;
  if (widen) wide.resize(panelBytes(DType::Q6_KW, kCols, w.K));
  for (int n = n0; n < n1; n += kCols) {
    Panel p = panelOf(w, n, n1);
    DType type = w.panelType;
    if (widen) {
      widenQ6Panel(p, w.K / panelUnitInputs(DType::Q6_K), wide.data());
      p = Panel{wide.data()};
      type = DType::Q6_KW;
    }
    const int cols = std::min(kCols, n1 - n);
    for (int t = 0; t < T; t += kVecRows) {
      const size_t at = static_cast<size_t>(t) * nb;
      vecRowsFor(type, p, x + at, std::min(kVecRows, T - t), nb, y + static_cast<size_t>(t) * w.N + n, w.N, cols);
      p.ahead = nullptr;  // the first pass asked for the panel ahead
      p.aheadBytes = 0;
    }
  }
}

}  // namespace weft

#pragma GCC pop_options
