// AVX2 inner loops for CPUs without AVX-512: 8 fp32 lanes, 16 registers.
#include <immintrin.h>
#include <cstring>
#include "kernels.h"
#include "vec_math.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace weft {
namespace {

constexpr int L = 16;  // elements per chunk: two 8-lane halves

template <DType D>
inline void loadChunk(const void* w, size_t at, __m256& lo, __m256& hi) {
  if constexpr (D == DType::F32) {
    const float* p = static_cast<const float*>(w) + at;
    lo = _mm256_loadu_ps(p);
    hi = _mm256_loadu_ps(p + 8);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(w) + at;
    lo = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    hi = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)));
  }
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R rows × one column group; the per-output sequence of operations is the same for every R.
// x is held in registers and weights loaded one column at a time: 16 registers are few.
template <DType D, int R>
inline void tile(const float* xp, int T0, const PackedMatrix& w, int g, float* y) {
  __m256 acc[R][kPackCols];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kPackCols; c++) acc[r][c] = _mm256_setzero_ps();
  const size_t base = static_cast<size_t>(g) * kPackCols * w.Kp;
  for (int k = 0; k < w.Kp; k += L) {
    __m256 xl[R], xh[R];
    for (int r = 0; r < R; r++) {
      const float* xr = xp + static_cast<size_t>(T0 + r) * w.Kp + k;
      xl[r] = _mm256_loadu_ps(xr);
      xh[r] = _mm256_loadu_ps(xr + 8);
    }
    for (int c = 0; c < kPackCols; c++) {
      __m256 lo, hi;
      loadChunk<D>(w.data, base + static_cast<size_t>(k) * kPackCols + c * L, lo, hi);
      for (int r = 0; r < R; r++) {
        acc[r][c] = _mm256_fmadd_ps(xl[r], lo, acc[r][c]);
        acc[r][c] = _mm256_fmadd_ps(xh[r], hi, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < kPackCols && g * kPackCols + c < w.N; c++)
      y[static_cast<size_t>(T0 + r) * w.N + g * kPackCols + c] = hsum(acc[r][c]);
}

template <DType D>
void matmulTyped(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  constexpr int kRowBlock = 64;
  for (int tb = 0; tb < T; tb += kRowBlock) {
    int te = tb + kRowBlock < T ? tb + kRowBlock : T;
    for (int g = g0; g < g1; g++) {
      int t = tb;
      for (; t + 2 <= te; t += 2) tile<D, 2>(xp, t, w, g, y);
      for (; t < te; t++) tile<D, 1>(xp, t, w, g, y);
    }
  }
}

// F32 and F16 groups only: this set packs bf16 matrices as pair tiles in both modes
// (matmulPairsF32, matmulBf16), and quantized ones go through matmulQuant.
void matmul(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  switch (w.dtype) {
    case DType::F32: return matmulTyped<DType::F32>(xp, T, w, y, g0, g1);
    case DType::F16: return matmulTyped<DType::F16>(xp, T, w, y, g0, g1);
    default: break;
  }
}

// One input pair of row r as two broadcast fp32 vectors: fp32 rows (float32 mode) as they are,
// bf16 rows (bfloat16 mode) widened exactly from one 32-bit load (the pair's two halves).
inline void broadcastPair(const float* x, __m256& odd, __m256& even, __m256i) {
  odd = _mm256_broadcast_ss(x + 1);
  even = _mm256_broadcast_ss(x);
}
inline void broadcastPair(const uint16_t* x, __m256& odd, __m256& even, __m256i hiMask) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  const __m256i v = _mm256_set1_epi32(pair);
  odd = _mm256_castsi256_ps(_mm256_and_si256(v, hiMask));
  even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

// Pair tiles by fp32 FMAs on widened bf16 weights, in pair order (see MatmulBf16Fn): per pair,
// acc += x[2p+1]·w[2p+1], then acc += x[2p]·w[2p]; a 64-byte row of a tile (one pair of 16
// columns) is split into its odd and even halves, each widened exactly. R rows × G adjacent
// tiles: many rows share each widened weight vector (a batch), or one row runs G tiles' chains
// side by side (decode), so the FMA pipes always have eight independent chains. Each output is
// one chain whatever R and G: batch-invariant. (Unrolled by pragma: else GCC keeps the
// accumulator array in memory and stores it every pair.)
template <class X, int R, int G>
inline void tilePairs(const X* x, int T0, const PackedMatrix& w, int g, float* y) {
  __m256 acc[2 * R * G];
#pragma GCC unroll 16
  for (int i = 0; i < 2 * R * G; i++) acc[i] = _mm256_setzero_ps();
  const uint16_t* wg = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const size_t tileStride = static_cast<size_t>(w.Kp) * kTileCols;
  const X* xr = x + static_cast<size_t>(T0) * w.Kp;
  const __m256i hiMask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int k = 0; k < w.Kp; k += 2, wg += 2 * kTileCols, xr += 2) {
#pragma GCC unroll 8
    for (int j = 0; j < G; j++) {
      const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + j * tileStride));
      const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + j * tileStride + 16));
      const __m256 odd0 = _mm256_castsi256_ps(_mm256_and_si256(v0, hiMask)), even0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
      const __m256 odd1 = _mm256_castsi256_ps(_mm256_and_si256(v1, hiMask)), even1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
#pragma GCC unroll 8
      for (int r = 0; r < R; r++) {
        __m256 xo, xe;
        broadcastPair(xr + r * w.Kp, xo, xe, hiMask);
        __m256& a0 = acc[2 * (r * G + j)];
        __m256& a1 = acc[2 * (r * G + j) + 1];
        a0 = _mm256_fmadd_ps(xe, even0, _mm256_fmadd_ps(xo, odd0, a0));
        a1 = _mm256_fmadd_ps(xe, even1, _mm256_fmadd_ps(xo, odd1, a1));
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < G; j++) {
    const int at = (g + j) * kTileCols, cols = w.N - at < kTileCols ? w.N - at : kTileCols;
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) {
      float* yr = y + static_cast<size_t>(T0 + r) * w.N + at;
      if (cols == kTileCols) {
        _mm256_storeu_ps(yr, acc[2 * (r * G + j)]);
        _mm256_storeu_ps(yr + 8, acc[2 * (r * G + j) + 1]);
        continue;
      }
      alignas(32) float out[kTileCols];
      _mm256_store_ps(out, acc[2 * (r * G + j)]);
      _mm256_store_ps(out + 8, acc[2 * (r * G + j) + 1]);
      for (int c = 0; c < cols; c++) yr[c] = out[c];
    }
  }
}

// The column tiles [g0, g1) for rows [t, t + R), G tiles at a time, the rest one by one.
template <class X, int R, int G>
void columnsPairs(const X* x, int t, const PackedMatrix& w, float* y, int g0, int g1) {
  int g = g0;
  for (; g + G <= g1; g += G) tilePairs<X, R, G>(x, t, w, g, y);
  for (; g < g1; g++) tilePairs<X, R, 1>(x, t, w, g, y);
}

// One or two rows take several column tiles at once to have eight chains; three or more rows
// go in blocks of at most 64 (their x stays in L2 while each column tile is read once a
// block), each split into row tiles of as even a size as lets none exceed five fp32 rows (five
// rows × two vectors of accumulators, four widened weight vectors, the mask and two broadcasts
// fill the 16 registers) or four bf16 rows (their broadcast needs one more; five spilled and
// ran 26 % slower); a tile's weights are widened once for all of its rows.
template <class X>
void matmulPairs(const X* x, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  if (T == 1) return columnsPairs<X, 1, 4>(x, 0, w, y, g0, g1);
  if (T == 2) return columnsPairs<X, 2, 2>(x, 0, w, y, g0, g1);
  constexpr int kRowBlock = 64, kMaxRows = sizeof(X) == 4 ? 5 : 4;
  const int blocks = (T + kRowBlock - 1) / kRowBlock;
  for (int b = 0; b < blocks; b++) {
    const int tb = T * b / blocks, te = T * (b + 1) / blocks;
    const int tiles = (te - tb + kMaxRows - 1) / kMaxRows;
    for (int g = g0; g < g1; g++)
      for (int i = 0; i < tiles; i++) {
        const int t0 = tb + (te - tb) * i / tiles, rows = tb + (te - tb) * (i + 1) / tiles - t0;
        switch (rows) {
          case 5: tilePairs<X, 5, 1>(x, t0, w, g, y); break;
          case 4: tilePairs<X, 4, 1>(x, t0, w, g, y); break;
          default: tilePairs<X, 3, 1>(x, t0, w, g, y); break;
        }
      }
  }
}

void matmulBf16(const Bf16Rows& x, int T, const PackedMatrix& w, float* y, int g0, int g1) { matmulPairs(x.rounded, T, w, y, g0, g1); }
void matmulPairsF32(const float* x, int T, const PackedMatrix& w, float* y, int g0, int g1) { matmulPairs(x, T, w, y, g0, g1); }

void axpy(float alpha, const float* x, float* y, int n) {
  __m256 av = _mm256_set1_ps(alpha);
  int nv = n & ~7;
  for (int i = 0; i < nv; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (int i = nv; i < n; i++) y[i] += alpha * x[i];
}

inline __m256 exp8(__m256 x) {
  WEFT_EXP_CONSTANTS
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-87.0f));
  __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent bits; below −87 the clamp keeps n in range (tiny results, not 0).
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void siluMul(float* g, const float* u, int n) {
  int nv = n & ~7;
  for (int i = 0; i < nv; i += 8) {
    __m256 gv = _mm256_loadu_ps(g + i);
    __m256 s = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
    _mm256_storeu_ps(g + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (int i = nv; i < n; i++) g[i] = g[i] / (1.0f + __builtin_expf(-g[i])) * u[i];
}

float expSum(float* s, int n, float max) {
  __m256 acc = _mm256_setzero_ps(), mv = _mm256_set1_ps(max);
  int nv = n & ~7;
  for (int i = 0; i < nv; i += 8) {
    __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (int i = nv; i < n; i++) sum += s[i] = __builtin_expf(s[i] - max);
  return sum;
}

// Up to eight cached K/V elements (`lanes`, the rest zero), widened exactly to fp32.
template <DType D>
inline __m256 loadKv(const KvElem<D>* p, int lanes, __m256i mask) {
  if constexpr (D == DType::F32) {
    return _mm256_maskload_ps(p, mask);
  } else {
    __m128i h;
    if (lanes == 8) {
      h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    } else {  // AVX2 has no masked 16-bit load
      alignas(16) uint16_t buf[8] = {};
      for (int i = 0; i < lanes; i++) buf[i] = p[i];
      h = _mm_load_si128(reinterpret_cast<const __m128i*>(buf));
    }
    if constexpr (D == DType::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Eight cached K/V elements, widened exactly to fp32 (an fp32 row by a plain load).
template <DType D>
inline __m256 loadKv8(const KvElem<D>* p) {
  if constexpr (D == DType::F32) return _mm256_loadu_ps(p);
  else return loadKv<D>(p, 8, _mm256_set1_epi32(-1));
}

// KV 8-key vectors per pass (KV · 8 keys of the block), so that each query runs KV independent
// FMA chains: with one 8-key vector a query's chain of hd dependent FMAs bound the loop by the
// FMA's latency. Up to two queries take 4 vectors (a 32-token block's row), more take 2, so
// that NQ · KV accumulators and the KV loaded keys fit the 16 registers. A score still sums
// its dimensions in order.
template <DType D, int NQ>
void scoresN(const float* const* qs, const KvElem<D>* kt, const void* ahead, int stride, int hd, int n, float scale, float* const* out) {
  constexpr int KV = NQ <= 2 ? 4 : 2;
  const __m256 sv = _mm256_set1_ps(scale);
  for (int j = 0; j < n; j += 8 * KV) {
    int lanes[KV];
    __m256i m[KV];
    for (int v = 0; v < KV; v++) {
      const int left = n - j - 8 * v;
      lanes[v] = left >= 8 ? 8 : left > 0 ? left : 0;
      m[v] = _mm256_cmpgt_epi32(_mm256_set1_epi32(lanes[v]), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    }
    __m256 acc[NQ][KV];
    for (int q = 0; q < NQ; q++)
      for (int v = 0; v < KV; v++) acc[q][v] = _mm256_setzero_ps();
    for (int d = 0; d < hd; d++) {
      if (j == 0 && ahead) prefetchRow<D>(static_cast<const KvElem<D>*>(ahead) + static_cast<size_t>(d) * stride, stride);
      const KvElem<D>* row = kt + static_cast<size_t>(d) * stride + j;
      __m256 k[KV];
      for (int v = 0; v < KV; v++) k[v] = lanes[v] == 8 ? loadKv8<D>(row + 8 * v) : loadKv<D>(row + 8 * v, lanes[v], m[v]);
      for (int q = 0; q < NQ; q++) {
        const __m256 qd = _mm256_set1_ps(qs[q][d]);
        for (int v = 0; v < KV; v++) acc[q][v] = _mm256_fmadd_ps(qd, k[v], acc[q][v]);
      }
    }
    for (int q = 0; q < NQ; q++)
      for (int v = 0; v < KV; v++)
        if (lanes[v] > 0) _mm256_maskstore_ps(out[q] + j + 8 * v, m[v], _mm256_mul_ps(acc[q][v], sv));
  }
}

template <DType D>
void scoresTyped(const float* const* qs, int nq, const KvElem<D>* kt, const void* ahead, int stride, int hd, int n, float scale,
                 float* const* out) {
  withQueryCount(nq, [&](auto q) { scoresN<D, decltype(q)::value>(qs, kt, ahead, stride, hd, n, scale, out); });
}

// y[i] += alpha * x[i] for a cached V row: the same operations as axpy on the widened row.
template <DType D>
void axpyKv(float alpha, const KvElem<D>* x, float* y, int n) {
  if constexpr (D == DType::F32) {
    axpy(alpha, x, y, n);
  } else {
    const __m256 av = _mm256_set1_ps(alpha);
    const __m256i all = _mm256_set1_epi32(-1);
    const int nv = n & ~7;
    for (int i = 0; i < nv; i += 8)
      _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, loadKv<D>(x + i, 8, all), _mm256_loadu_ps(y + i)));
    for (int i = nv; i < n; i++) y[i] += alpha * (D == DType::F16 ? f16ToF32(x[i]) : bf16ToF32(x[i]));
  }
}

// NQ queries' outputs over keys [j0, j1) for NV 8-float vectors of dimensions from d0, the
// accumulators in registers (where one axpy a key loaded and stored every output vector for each
// key); `acc` starts from outs unless fresh. Each element is the same FMA chain in key order.
template <DType D, int NQ, int NV>
inline void weightedSumRange(const float* const* ps, const KvElem<D>* const* vrows, int j0, int j1, int d0, float* const* outs, bool fresh) {
  __m256 acc[NQ][NV];
  for (int q = 0; q < NQ; q++)
    for (int c = 0; c < NV; c++) acc[q][c] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(outs[q] + d0 + 8 * c);
  for (int j = j0; j < j1; j++) {
    if (j + kVRowsAhead < j1) prefetchRow<D>(vrows[j + kVRowsAhead] + d0, NV * 8);
    const KvElem<D>* v = vrows[j] + d0;
    for (int c = 0; c < NV; c++) {
      const __m256 vc = loadKv8<D>(v + 8 * c);
      for (int q = 0; q < NQ; q++) acc[q][c] = _mm256_fmadd_ps(_mm256_set1_ps(ps[q][j]), vc, acc[q][c]);
    }
  }
  for (int q = 0; q < NQ; q++)
    for (int c = 0; c < NV; c++) _mm256_storeu_ps(outs[q] + d0 + 8 * c, acc[q][c]);
}

// Up to 32 dimensions at a time (4 vectors × up to 3 queries: 12 of the 16 registers).
template <DType D, int NQ>
void weightedSumRun(const float* const* ps, const KvElem<D>* const* vrows, int j0, int j1, int d0, int dims, float* const* outs, bool fresh) {
  switch (dims / 8) {
    case 4: return weightedSumRange<D, NQ, 4>(ps, vrows, j0, j1, d0, outs, fresh);
    case 3: return weightedSumRange<D, NQ, 3>(ps, vrows, j0, j1, d0, outs, fresh);
    case 2: return weightedSumRange<D, NQ, 2>(ps, vrows, j0, j1, d0, outs, fresh);
    default: return weightedSumRange<D, NQ, 1>(ps, vrows, j0, j1, d0, outs, fresh);
  }
}

// Runs of 32 dimensions (weightedSumRuns). A head size that is not a multiple of 8 takes one
// axpy a key (its scalar tail), as before.
template <DType D>
void weightedSumTyped(const float* const* ps, const int* ns, int nq, const KvElem<D>* const* vrows, int hd, float* const* outs) {
  if (hd % 8 != 0) {
    for (int q = 0; q < nq; q++) {
      float* o = outs[q];
      for (int d = 0; d < hd; d++) o[d] = 0.0f;
      for (int j = 0; j < ns[q]; j++) {
        if (j + kVRowsAhead < ns[q]) prefetchRow<D>(vrows[j + kVRowsAhead], hd);
        axpyKv<D>(ps[q][j], vrows[j], o, hd);
      }
    }
    return;
  }
  weightedSumRuns(ps, ns, nq, hd, 32, outs, [vrows](auto q, const float* const* p, int j0, int j1, int d0, int dims, float* const* o, bool fresh) {
    weightedSumRun<D, decltype(q)::value>(p, vrows, j0, j1, d0, dims, o, fresh);
  });
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

// f32ToBf16 on eight lanes at a time: the same integer steps, so the same bits.
void roundBf16(const float* x, int n, uint16_t* out) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF), quiet = _mm256_set1_epi32(0x40);
  const __m256i abs = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i high = _mm256_srli_epi32(b, 16);
    const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(bias, _mm256_and_si256(high, one))), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, abs), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(high, quiet), nan);
    // The lanes are below 2^16: packus keeps them, then the permute undoes its 128-bit interleave.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_castsi256_si128(packed));
  }
  roundBf16Scalar(x + i, n - i, out + i);
}

}  // namespace

const Kernels& kernelsAvx2() {
  static const Kernels k = [] {
    Kernels s{"avx2", L, matmul, axpy, siluMul, expSum, scoresTyped<DType::F32>, weightedSumTyped<DType::F32>, matmulBf16, false};
    s.scoresHalf = scoresHalf;
    s.weightedSumHalf = weightedSumHalf;
    s.roundBf16 = roundBf16;
    s.matmulPairsF32 = matmulPairsF32;
    return s;
  }();
  return k;
}

}  // namespace weft

#pragma GCC pop_options
