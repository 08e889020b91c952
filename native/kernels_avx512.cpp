// AVX-512 inner loops: 16 fp32 lanes, weights widened from bf16/f16 in registers.
// GCC 12 reports its own AVX-512 intrinsics headers as reading uninitialised values.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <vector>
#include "kernels.h"
#include "vec_math.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,fma,f16c")

namespace weft {
namespace {

constexpr int L = 32;  // elements per chunk: two 16-lane halves

// One chunk of one packed column → two fp32 vectors (for bf16: even and odd elements).
template <DType D>
inline void loadChunk(const void* w, size_t at, __m512& lo, __m512& hi) {
  if constexpr (D == DType::F32) {
    const float* p = static_cast<const float*>(w) + at;
    lo = _mm512_loadu_ps(p);
    hi = _mm512_loadu_ps(p + 16);
  } else if constexpr (D == DType::F16) {
    const uint16_t* p = static_cast<const uint16_t*>(w) + at;
    lo = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  } else {
    __m512i v = _mm512_loadu_si512(static_cast<const uint16_t*>(w) + at);
    lo = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    hi = _mm512_castsi512_ps(_mm512_and_si512(v, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
  }
}

// R rows × one column group. Per output: acc = fma(x_lo, w_lo, acc); acc = fma(x_hi, w_hi, acc)
// chunk after chunk, then one horizontal sum — the same sequence for every R.
// `prefetch`: pull the next column group's weights into L2 (not L1: the tile's activations and weights fill it) while this one
// computes (worth it when several row groups reuse each group's weights).
template <DType D, int R>
inline void tile(const float* xp, int T0, const PackedMatrix& w, int g, float* y, bool prefetch) {
  __m512 acc[R][kPackCols];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kPackCols; c++) acc[r][c] = _mm512_setzero_ps();
  const size_t base = static_cast<size_t>(g) * kPackCols * w.Kp;
  const size_t groupBytes = static_cast<size_t>(kPackCols) * w.Kp * dtypeBytes(D);
  for (int k = 0; k < w.Kp; k += L) {
    if (prefetch) {
      const char* next = static_cast<const char*>(w.data) + (base + static_cast<size_t>(k) * kPackCols) * dtypeBytes(D) + groupBytes;
      for (size_t off = 0; off < static_cast<size_t>(kPackCols) * L * dtypeBytes(D); off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
    }
    __m512 lo[kPackCols], hi[kPackCols];
    for (int c = 0; c < kPackCols; c++) loadChunk<D>(w.data, base + static_cast<size_t>(k) * kPackCols + c * L, lo[c], hi[c]);
    for (int r = 0; r < R; r++) {
      const float* xr = xp + static_cast<size_t>(T0 + r) * w.Kp + k;
      __m512 xl = _mm512_loadu_ps(xr), xh = _mm512_loadu_ps(xr + 16);
      for (int c = 0; c < kPackCols; c++) {
        acc[r][c] = _mm512_fmadd_ps(xl, lo[c], acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xh, hi[c], acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kPackCols && g * kPackCols + c < w.N; c++)
      y[static_cast<size_t>(T0 + r) * w.N + g * kPackCols + c] = _mm512_reduce_add_ps(acc[r][c]);
}

template <DType D>
void matmulTyped(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  constexpr int kRowBlock = 64;  // a block of activations stays in L2 while the weights stream past
  for (int tb = 0; tb < T; tb += kRowBlock) {
    int te = tb + kRowBlock < T ? tb + kRowBlock : T;
    for (int g = g0; g < g1; g++) {
      int t = tb;
      for (; t + 4 <= te; t += 4) tile<D, 4>(xp, t, w, g, y, t == tb && g + 1 < g1);
      for (; t < te; t++) tile<D, 1>(xp, t, w, g, y, false);
    }
  }
}

void matmul(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  switch (w.dtype) {
    case DType::F32: return matmulTyped<DType::F32>(xp, T, w, y, g0, g1);
    case DType::F16: return matmulTyped<DType::F16>(xp, T, w, y, g0, g1);
    case DType::BF16: return matmulTyped<DType::BF16>(xp, T, w, y, g0, g1);
    default: break;  // quantized matrices go through matmulQuant
  }
}

// Sixteen cached K/V elements or bf16 activations (fewer under the mask), widened exactly to fp32.
template <DType D>
inline __m512 loadKv(const KvElem<D>* p, __mmask16 m) {
  if constexpr (D == DType::F32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (D == DType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// bfloat16 mode, pair order (see MatmulBf16Fn), by fp32 FMAs on widened values: R rows × C
// 16-column tiles. A 64-byte row of a tile (one input pair of 16 columns) is split into its odd
// and even halves, each widened exactly, and serves all R rows; the rows come widened (x, fp32 at
// stride ld), so each activation is one broadcast load, no shuffle. Input pairs [p0, p1) only, the
// sums of earlier pairs resumed from y (exact in fp32). Two FMAs per 32 products (the
// widening's two ops aside), where vdpbf16ps takes one instruction that on Intel's cores issues at
// half their FMA rate (docs/PERFORMANCE.md, session 44).
template <int R, int C>
inline void tileBf16(const float* x, size_t ld, int T0, const PackedMatrix& w, int g, float* y, int p0, int p1, const uint16_t* next) {
  const auto maskOf = [&w, g](int c) -> __mmask16 {
    const int cols = w.N - (g + c) * kTileCols;
    return cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  };
  const auto out = [&](int r, int c) { return y + static_cast<size_t>(T0 + r) * w.N + (g + c) * kTileCols; };
  __m512 acc[R][C];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < C; c++) acc[r][c] = p0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(maskOf(c), out(r, c));
  const uint16_t* wg = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const size_t tileStride = static_cast<size_t>(w.Kp) * kTileCols;
  const __m512i hiMask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const float* x0 = x + T0 * ld;
  for (int p = p0; p < p1; p++) {
    if (next)
      for (int c = 0; c < C; c++) _mm_prefetch(reinterpret_cast<const char*>(next + c * tileStride + static_cast<size_t>(p - p0) * 2 * kTileCols), _MM_HINT_T1);
    __m512 odd[C], even[C];
    for (int c = 0; c < C; c++) {
      const __m512i v = _mm512_loadu_si512(wg + c * tileStride + static_cast<size_t>(p) * 2 * kTileCols);
      odd[c] = _mm512_castsi512_ps(_mm512_and_si512(v, hiMask));
      even[c] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    for (int r = 0; r < R; r++) {
      const float* xr = x0 + r * ld + 2 * p;
      const __m512 xo = _mm512_set1_ps(xr[1]), xe = _mm512_set1_ps(xr[0]);
      for (int c = 0; c < C; c++) {
        acc[r][c] = _mm512_fmadd_ps(xo, odd[c], acc[r][c]);
        acc[r][c] = _mm512_fmadd_ps(xe, even[c], acc[r][c]);
      }
    }
  }
  for (int c = 0; c < C; c++)
    for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(out(r, c), maskOf(c), acc[r][c]);
}

// Rows [t0, T) in groups of R against tiles [g, g + C): the tiles' weights stay in L1/L2 while
// every group passes. Each accumulator's chain is the same whatever R and C, so a row's bits do
// not depend on its group.
template <int R, int C>
int rowGroups(const float* x, size_t ld, int t0, int T, const PackedMatrix& w, float* y, int g, int p0, int p1, const uint16_t* next) {
  int t = t0;
  for (; t + R <= T; t += R, next = nullptr) tileBf16<R, C>(x, ld, t, w, g, y, p0, p1, next);
  return t;
}

template <int C>
void columns(const float* x, size_t ld, int T, const PackedMatrix& w, float* y, int g) {
  constexpr int kPairChunk = 128;  // 8 KiB of a tile: the C tiles' chunk stays in L1 while every row group passes
  const uint16_t* tiles = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const bool lastGroup = g + 2 * C > w.Np / kTileCols;
  for (int p0 = 0; p0 < w.Kp / 2; p0 += kPairChunk) {
    const int p1 = std::min(w.Kp / 2, p0 + kPairChunk);
    // The first row group asks L2 for the chunk after this one (the next tiles' first chunk after
    // the last), so the weights the next pass reads are not demand misses.
    const uint16_t* next = p1 < w.Kp / 2 ? tiles + static_cast<size_t>(p1) * 2 * kTileCols
                           : lastGroup   ? nullptr
                                         : tiles + static_cast<size_t>(C) * w.Kp * kTileCols;
    int t = rowGroups<8, C>(x, ld, 0, T, w, y, g, p0, p1, next);
    if (t > 0) next = nullptr;
    if (T - t >= 4) t = rowGroups<4, C>(x, ld, t, t + 4, w, y, g, p0, p1, next), next = nullptr;
    if (T - t >= 2) t = rowGroups<2, C>(x, ld, t, t + 2, w, y, g, p0, p1, next), next = nullptr;
    if (T - t >= 1) rowGroups<1, C>(x, ld, t, T, w, y, g, p0, p1, next);
  }
}

}  // namespace

void widenBf16Row(const uint16_t* x, int n, float* out) {
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, m, loadKv<DType::BF16>(x + i, m));
  }
}

namespace {

// Eight rows × two tiles (each widened weight serving eight rows: 4 + 32 FMA-port ops per 512
// products, 16 accumulators), the tiles outermost within blocks of 64 rows (their activations stay
// in L2 while the weights stream past). The rows come widened to fp32 (Bf16Rows::widened, once a
// matmul), so each FMA takes its activation as a broadcast load. A step of up to 4 rows takes four
// tiles at once, so that one row still has four independent chains and its weight stream loads in flight.
void matmulBf16(const Bf16Rows& x, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  constexpr int kRowBlock = 64;
  const int C = T <= 4 ? 4 : 2;
  for (int tb = 0; tb < T; tb += kRowBlock) {
    const int rows = std::min(kRowBlock, T - tb);
    const float* xb = x.widened + tb * x.ld;
    float* yb = y + static_cast<size_t>(tb) * w.N;
    int g = g0;
    for (; g + C <= g1; g += C) C == 4 ? columns<4>(xb, x.ld, rows, w, yb, g) : columns<2>(xb, x.ld, rows, w, yb, g);
    for (; g < g1; g++) columns<1>(xb, x.ld, rows, w, yb, g);
  }
}

void axpy(float alpha, const float* x, float* y, int n) {
  __m512 av = _mm512_set1_ps(alpha);
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 yv = _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i));
    _mm512_mask_storeu_ps(y + i, m, yv);
  }
}

inline __m512 exp16(__m512 x) {
  WEFT_EXP_CONSTANTS
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-103.0f));
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);  // p · 2^n, with underflow to 0 handled
}

void siluMul(float* g, const float* u, int n) {
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 gv = _mm512_maskz_loadu_ps(m, g + i);
    __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(g + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + i)));
  }
}

float expSum(float* s, int n, float max) {
  __m512 acc = _mm512_setzero_ps(), mv = _mm512_set1_ps(max);
  for (int i = 0; i < n; i += 16) {
    __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, s + i), mv)));
    _mm512_mask_storeu_ps(s + i, m, e);
    acc = _mm512_add_ps(acc, e);
  }
  return _mm512_reduce_add_ps(acc);
}

// NQ queries' outputs over keys [j0, j1) for NV 16-float vectors of dimensions from d0, the
// accumulators in registers (NV and NQ are template arguments so none spills); `acc` starts
// from outs unless fresh. The last vector's mask covers a head size that is not a multiple of 16.
template <DType D, int NQ, int NV>
inline void weightedSumRange(const float* const* ps, const KvElem<D>* const* vrows, int j0, int j1, int d0, __mmask16 last,
                             float* const* outs, bool fresh) {
  __m512 acc[NQ][NV];
  const auto mask = [last](int c) -> __mmask16 { return c == NV - 1 ? last : 0xFFFF; };
  for (int q = 0; q < NQ; q++)
    for (int c = 0; c < NV; c++) acc[q][c] = fresh ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(mask(c), outs[q] + d0 + 16 * c);
  for (int j = j0; j < j1; j++) {
    if (j + kVRowsAhead < j1) prefetchRow<D>(vrows[j + kVRowsAhead] + d0, NV * 16);
    const KvElem<D>* v = vrows[j] + d0;
    __m512 p[NQ];
    for (int q = 0; q < NQ; q++) p[q] = _mm512_set1_ps(ps[q][j]);
    for (int c = 0; c < NV; c++) {
      const __m512 vc = loadKv<D>(v + 16 * c, mask(c));
      for (int q = 0; q < NQ; q++) acc[q][c] = _mm512_fmadd_ps(p[q], vc, acc[q][c]);
    }
  }
  for (int q = 0; q < NQ; q++)
    for (int c = 0; c < NV; c++) _mm512_mask_storeu_ps(outs[q] + d0 + 16 * c, mask(c), acc[q][c]);
}

// One run of at most 128 dimensions: its vector count picks the instance.
template <DType D, int NQ>
void weightedSumRun(const float* const* ps, const KvElem<D>* const* vrows, int j0, int j1, int d0, int dims, float* const* outs,
                    bool fresh) {
  const int nv = (dims + 15) / 16;
  const __mmask16 last = dims % 16 ? static_cast<__mmask16>((1u << (dims % 16)) - 1) : 0xFFFF;
  switch (nv) {
    case 8: return weightedSumRange<D, NQ, 8>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 7: return weightedSumRange<D, NQ, 7>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 6: return weightedSumRange<D, NQ, 6>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 5: return weightedSumRange<D, NQ, 5>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 4: return weightedSumRange<D, NQ, 4>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 3: return weightedSumRange<D, NQ, 3>(ps, vrows, j0, j1, d0, last, outs, fresh);
    case 2: return weightedSumRange<D, NQ, 2>(ps, vrows, j0, j1, d0, last, outs, fresh);
    default: return weightedSumRange<D, NQ, 1>(ps, vrows, j0, j1, d0, last, outs, fresh);
  }
}

// Up to 8 vectors of output per query stay in registers: runs of 128 dimensions (weightedSumRuns).
template <DType D>
void weightedSumTyped(const float* const* ps, const int* ns, int nq, const KvElem<D>* const* vrows, int hd, float* const* outs) {
  weightedSumRuns(ps, ns, nq, hd, 128, outs, [vrows](auto q, const float* const* p, int j0, int j1, int d0, int dims, float* const* o, bool fresh) {
    weightedSumRun<D, decltype(q)::value>(p, vrows, j0, j1, d0, dims, o, fresh);
  });
}

// Two 16-key vectors per dimension (a 32-key block's whole row of a dimension), so each query
// runs two independent FMA chains; a score still sums its dimensions in order.
template <DType D, int NQ>
void scoresN(const float* const* qs, const KvElem<D>* kt, const void* ahead, int stride, int hd, int n, float scale, float* const* out) {
  const __m512 sv = _mm512_set1_ps(scale);
  for (int j = 0; j < n; j += 32) {
    const auto maskAt = [n](int from) -> __mmask16 {
      return n - from >= 16 ? 0xFFFF : n - from <= 0 ? 0 : static_cast<__mmask16>((1u << (n - from)) - 1);
    };
    const __mmask16 m0 = maskAt(j), m1 = maskAt(j + 16);
    __m512 acc0[NQ], acc1[NQ];
    for (int q = 0; q < NQ; q++) acc0[q] = acc1[q] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
      if (j == 0 && ahead) prefetchRow<D>(static_cast<const KvElem<D>*>(ahead) + static_cast<size_t>(d) * stride, stride);
      const KvElem<D>* row = kt + static_cast<size_t>(d) * stride + j;
      const __m512 k0 = loadKv<D>(row, m0), k1 = loadKv<D>(row + 16, m1);
      for (int q = 0; q < NQ; q++) {
        const __m512 qd = _mm512_set1_ps(qs[q][d]);
        acc0[q] = _mm512_fmadd_ps(qd, k0, acc0[q]);
        acc1[q] = _mm512_fmadd_ps(qd, k1, acc1[q]);
      }
    }
    for (int q = 0; q < NQ; q++) {
      _mm512_mask_storeu_ps(out[q] + j, m0, _mm512_mul_ps(acc0[q], sv));
      if (m1) _mm512_mask_storeu_ps(out[q] + j + 16, m1, _mm512_mul_ps(acc1[q], sv));
    }
  }
}

template <DType D>
void scoresTyped(const float* const* qs, int nq, const KvElem<D>* kt, const void* ahead, int stride, int hd, int n, float scale,
                 float* const* out) {
  withQueryCount(nq, [&](auto q) { scoresN<D, decltype(q)::value>(qs, kt, ahead, stride, hd, n, scale, out); });
}

void scoresHalf(const float* const* qs, int nq, const uint16_t* kt, const void* ahead, DType kv, int stride, int hd, int n, float scale,
                float* const* out) {
  if (kv == DType::F16) scoresTyped<DType::F16>(qs, nq, kt, ahead, stride, hd, n, scale, out);
  else scoresTyped<DType::BF16>(qs, nq, kt, ahead, stride, hd, n, scale, out);
}

void weightedSumHalf(const float* const* ps, const int* ns, int nq, const uint16_t* const* vrows, DType kv, int hd, float* const* outs) {
  if (kv == DType::F16) weightedSumTyped<DType::F16>(ps, ns, nq, vrows, hd, outs);
  else weightedSumTyped<DType::BF16>(ps, ns, nq, vrows, hd, outs);
}

// f32ToBf16 on sixteen lanes at a time: the same integer steps, so the same bits.
void roundBf16(const float* x, int n, uint16_t* out) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF), quiet = _mm512_set1_epi32(0x40);
  const __m512i abs = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512i b = _mm512_maskz_loadu_epi32(m, x + i);
    const __m512i high = _mm512_srli_epi32(b, 16);
    const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(b, _mm512_add_epi32(bias, _mm512_and_si512(high, one))), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, abs), inf);
    const __m512i r = _mm512_mask_or_epi32(rounded, nan, high, quiet);
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(r));
  }
}

}  // namespace

const Kernels& kernelsAvx512() {
  static const Kernels k = [] {
    Kernels s{"avx512", L, matmul, axpy, siluMul, expSum, scoresTyped<DType::F32>, weightedSumTyped<DType::F32>, matmulBf16, false};
    s.scoresHalf = scoresHalf;
    s.weightedSumHalf = weightedSumHalf;
    s.roundBf16 = roundBf16;
    s.bf16ByDefault = cpuFeatures().bf16DotHalfRate;
    return s;
  }();
  return k;
}

bool readsWidenedBf16Rows(MatmulBf16Fn f) { return f == matmulBf16; }

}  // namespace weft

#pragma GCC pop_options
