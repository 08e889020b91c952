// The quantized matmul with integer dot products for AVX2, in the order quant.h fixes
// (bit-identical to the scalar code): 256-bit, one panel column per vector; a lane's 4
// products summed by vpmaddubsw + vpmaddwd on |w| and x with w's sign, where |w| ≤ 128
// and |x| ≤ 127 keep the 16-bit pair sums from saturating (on w and x as they are for the
// types whose unpacked weights are never negative: see dot).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <stdexcept>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#include "kquant_blocks.h"

namespace weft {
namespace {

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void store32(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }

// Block b of an unpacked row (see UnpackedRow's step).
inline int8_t* blockQ(const UnpackedRow& r, int b) { return r.q + static_cast<size_t>(32) * r.step * b; }
inline float* blockDv(const UnpackedRow& r, int b) { return r.dv + static_cast<size_t>(8) * r.step * b; }

void unpackQ8_0(const uint8_t* src, int K, UnpackedRow r) {  // r by value: its stores cannot alias it
  for (int b = 0; b < K / 32; b++, src += 34) {
    store32(blockQ(r, b), load32(src + 2));
    _mm256_storeu_ps(blockDv(r, b), _mm256_set1_ps(f16At(src)));
    r.m[r.step * b] = 0.0f;
  }
}

// Block K (0–3) of a Q6_K half superblock as the dot takes it (q6kBits − kQ6KBias).
template <int K>
inline __m256i q6kQuants(__m256i l, __m256i h) {
  return _mm256_sub_epi8(__m256i(q6kBits<K>(U8x32(l), U8x32(h))), _mm256_set1_epi8(kQ6KBias));
}

// Block 2i + High of a Q4_K superblock from its quant bytes 32i..32i+31.
template <bool High>
inline __m256i q4kWeights(__m256i v) {
  return __m256i(q4kQuants<High>(U8x32(v)));
}

void unpackQ4K(const uint8_t* src, int K, UnpackedRow r) {
  for (int sb = 0; sb < K / 256; sb++, src += kQ4KBytes) {
    __m256 scale, min;
    q4kScales(src, &scale, &min);
    alignas(32) float sc[8], mi[8];
    _mm256_store_ps(sc, scale);
    _mm256_store_ps(mi, min);
    for (int j = 0; j < 4; j++) {
      const __m256i v = load32(src + kQ4KQuants + 32 * j);
      store32(blockQ(r, 8 * sb + 2 * j), q4kWeights<false>(v));
      store32(blockQ(r, 8 * sb + 2 * j + 1), q4kWeights<true>(v));
    }
    for (int j = 0; j < 8; j++) {
      _mm256_storeu_ps(blockDv(r, 8 * sb + j), _mm256_set1_ps(sc[j]));
      r.m[r.step * (8 * sb + j)] = mi[j];
    }
  }
}

void unpackQ6K(const uint8_t* src, int K, UnpackedRow r) {
  for (int sb = 0; sb < K / 256; sb++, src += kQ6KBytes) {
    alignas(32) float sc[16];
    __m256 lo, hi;
    q6kScales(src, &lo, &hi);
    _mm256_store_ps(sc, lo);
    _mm256_store_ps(sc + 8, hi);
    for (int n = 0; n < 2; n++) {
      const __m256i l0 = load32(src + 64 * n), l1 = load32(src + 64 * n + 32), h = load32(src + kQ6KHigh + 32 * n);
      const int b0 = 8 * sb + 4 * n;
      store32(blockQ(r, b0), q6kQuants<0>(l0, h));
      store32(blockQ(r, b0 + 1), q6kQuants<1>(l1, h));
      store32(blockQ(r, b0 + 2), q6kQuants<2>(l0, h));
      store32(blockQ(r, b0 + 3), q6kQuants<3>(l1, h));
      for (int k = 0; k < 4; k++) {
        const float* s2 = sc + 8 * n + 2 * k;  // block b0 + k's two 16-input scales: lanes 0–3, 4–7
        _mm256_storeu_ps(blockDv(r, b0 + k), _mm256_set_m128(_mm_set1_ps(s2[1]), _mm_set1_ps(s2[0])));
        r.m[r.step * (b0 + k)] = 0.0f;
      }
    }
  }
}

// Q4_0's and Q4_1's 32 values of one block as unpackQ4 stores them (`a`: the block).
template <bool One>
inline __m256i q4Quants(const uint8_t* a) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + (One ? 4 : 2)));
  const __m128i low = _mm_and_si128(v, _mm_set1_epi8(0x0F)), high = _mm_and_si128(_mm_srli_epi16(v, 4), _mm_set1_epi8(0x0F));
  const __m256i q = _mm256_set_m128i(high, low);
  return One ? q : _mm256_sub_epi8(q, _mm256_set1_epi8(8));
}

// Q4_0 (18-byte blocks: f16 d, 16 bytes; input i < 16 the low nibble of byte i, 16 + i its
// high nibble; w = q − 8) and Q4_1 (20 bytes: f16 d, f16 m, the same nibbles; w = d·q + m).
template <bool One>
void unpackQ4(const uint8_t* src, int K, UnpackedRow r) {
  constexpr int bytes = One ? 20 : 18;
  for (int b = 0; b < K / 32; b++, src += bytes) {
    store32(blockQ(r, b), q4Quants<One>(src));
    _mm256_storeu_ps(blockDv(r, b), _mm256_set1_ps(f16At(src)));
    r.m[r.step * b] = One ? f16At(src + 2) : 0.0f;
  }
}

// Q5_K (176 bytes: Q4_K's d, dmin and scales, 32 bytes qh, then Q4_K's nibbles): block j's
// fifth bit is bit j of qh's byte for each input.
constexpr int kQ5KBytes = 176, kQ5KHigh = 16, kQ5KQuants = 48;
inline __m256i q5kQuants(__m256i nibbles, bool high, __m256i qh, int j) {
  return __m256i((high ? q4kQuants<true>(U8x32(nibbles)) : q4kQuants<false>(U8x32(nibbles))) | (((U8x32(qh) >> j) & 1) << 4));
}

void unpackQ5K(const uint8_t* src, int K, UnpackedRow r) {
  for (int sb = 0; sb < K / 256; sb++, src += kQ5KBytes) {
    __m256 scale, min;
    q4kScales(src, &scale, &min);  // the same d, dmin and 6-bit scales as Q4_K's
    alignas(32) float sc[8], mi[8];
    _mm256_store_ps(sc, scale);
    _mm256_store_ps(mi, min);
    const __m256i h = load32(src + kQ5KHigh);
    for (int j = 0; j < 4; j++) {
      const __m256i v = load32(src + kQ5KQuants + 32 * j);
      store32(blockQ(r, 8 * sb + 2 * j), q5kQuants(v, false, h, 2 * j));
      store32(blockQ(r, 8 * sb + 2 * j + 1), q5kQuants(v, true, h, 2 * j + 1));
    }
    for (int j = 0; j < 8; j++) {
      _mm256_storeu_ps(blockDv(r, 8 * sb + j), _mm256_set1_ps(sc[j]));
      r.m[r.step * (8 * sb + j)] = mi[j];
    }
  }
}

// Every type's values as unpackRowScalar gives them.
void unpackRow(DType d, const uint8_t* src, int K, const UnpackedRow& r) {
  switch (d) {
    case DType::Q8_0: unpackQ8_0(src, K, r); return;
    case DType::Q4_0: unpackQ4<false>(src, K, r); return;
    case DType::Q4_1: unpackQ4<true>(src, K, r); return;
    case DType::Q4_K: unpackQ4K(src, K, r); return;
    case DType::Q5_K: unpackQ5K(src, K, r); return;
    case DType::Q6_K: unpackQ6K(src, K, r); return;
    default: throw std::invalid_argument("not a quantized dtype");
  }
}

// kQPanel weight rows, block-major: block b of panel column c at q + 32(4b + c),
// dv + 8(4b + c), m + 4b + c. Columns past the matrix are zeros.
struct Panel {
  int8_t* q;
  float* dv;
  float* m;
};

// How many panels ahead the weight rows are prefetched into L2. A panel's rows are short
// streams (a 1024-wide Q8_0 row is 17 cache lines), too short for the hardware prefetcher to
// ramp up on, so without this every panel starts cold: one sequence's Q8_0 matmul streamed
// 14 GB/s on the AMX development host, and 22–25 GB/s with it (2 threads).
constexpr int kPrefetchPanels = 2;

// A function whose only effect is a prefetch is found `const` by GCC 12's IPA analysis,
// and a call to it that was not inlined early is then deleted as dead: the prefetching
// methods below vanished from the tile loop (which the always_inline helpers inline
// first). Forcing them inline too keeps the prefetches.
#define WEFT_PREFETCH_INLINE __attribute__((always_inline)) inline

// Asks for [p, p + bytes) into L2; a prefetch past the mapping is dropped, never a fault.
inline void prefetchL2(const uint8_t* p, size_t bytes) {
  for (size_t at = 0; at < bytes; at += 64) _mm_prefetch(reinterpret_cast<const char*>(p + at), _MM_HINT_T1);
}

void unpackPanel(DType d, const uint8_t* src, size_t rowBytes, int K, int cols, const Panel& p) {
  const int nb = K / kQBlock;
  prefetchL2(src + rowBytes * kQPanel * kPrefetchPanels, rowBytes * kQPanel);
  for (int c = 0; c < kQPanel; c++) {
    const UnpackedRow r{p.q + 32 * c, p.dv + 8 * c, p.m + c, kQPanel};
    if (c < cols) {
      unpackRow(d, src + rowBytes * c, K, r);
      continue;
    }
    for (int b = 0; b < nb; b++) {
      std::fill(blockQ(r, b), blockQ(r, b) + 32, int8_t{0});
      std::fill(blockDv(r, b), blockDv(r, b) + 8, 0.0f);
      r.m[kQPanel * b] = 0.0f;
    }
  }
}

inline float hsum(__m256 acc) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));  // a0+a4, a1+a5, a2+a6, a3+a7
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));                                    // (a0+a4)+(a2+a6), (a1+a5)+(a3+a7)
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// Rows per register tile: each keeps one accumulator per panel column in registers.
constexpr int kTileRows = 2;
// The 8 int32 lanes of 4 products each of one block of one column (see the file's header).
// The types with a min (Q4_1, Q4_K, Q5_K) unpack to weights 0–31, never negative, where the
// sign steps change nothing (sign(x, w) is x where w > 0, and w = 0 adds 0 either way): their
// dot skips them, the same int32 lanes for two fewer instructions on the ports the FMAs use.
template <bool Unsigned>
inline __m256i dot(__m256i w, __m256i x) {
  if (Unsigned) return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

// Block b of the panel: column v's weights (as the dot takes them) and lane scales.
struct PanelSource {
  static constexpr int kGroup = 1;
  const Panel& p;
  void block(int b, std::integral_constant<int, 0>, int v, __m256i* w, __m256* dv) const {
    *w = load32(p.q + 32 * (kQPanel * b + v));
    *dv = _mm256_loadu_ps(p.dv + 8 * (kQPanel * b + v));
  }
  __m128 mins(int b, std::integral_constant<int, 0>) const { return _mm_loadu_ps(p.m + kQPanel * b); }
  void begin(int) const {}
  void prefetch(int, std::integral_constant<int, 0>) const {}  // unpackPanel asked for the rows ahead
};

// Q8_0 read in place (34-byte blocks: f16 scale, 32 int8), for steps of few rows
// (inPlaceRows), where a panel's unpacking would serve too few rows to pay off.
// The same values as unpackQ8_0 + unpackPanel give.
struct Q8Source {
  static constexpr int kGroup = 1;
  const uint8_t* rows;  // the panel's first row
  size_t rowBytes;
  int cols;  // rows present (the rest read as row 0 and are not stored)
  void block(int b, std::integral_constant<int, 0>, int c, __m256i* w, __m256* dv) const {
    const uint8_t* a = rows + rowBytes * (c < cols ? c : 0) + 34 * static_cast<size_t>(b);
    *w = load32(a + 2);
    *dv = _mm256_set1_ps(f16At(a));
  }
  __m128 mins(int, std::integral_constant<int, 0>) const { return _mm_setzero_ps(); }
  void begin(int) const {}
  // Block b of the rows kPrefetchPanels panels ahead (see kPrefetchPanels). Inlined early:
  // see WEFT_PREFETCH_INLINE.
  WEFT_PREFETCH_INLINE void prefetch(int b, std::integral_constant<int, 0>) const {
    const uint8_t* ahead = rows + rowBytes * kQPanel * kPrefetchPanels + 34 * static_cast<size_t>(b);
    for (int i = 0; i < kQPanel; i++) _mm_prefetch(reinterpret_cast<const char*>(ahead + rowBytes * i), _MM_HINT_T1);
  }
};

// Q4_0 or Q4_1 read in place, for steps of few rows (as Q8Source): the values
// unpackQ4 + unpackPanel give, so the same bits.
template <bool One>
struct Q4Source {
  static constexpr int kGroup = 1;
  static constexpr size_t kBytes = One ? 20 : 18;
  const uint8_t* rows;  // the panel's first row
  size_t rowBytes;
  int cols;  // rows present (the rest read as row 0 and are not stored)
  const uint8_t* at(int c, int b) const { return rows + rowBytes * (c < cols ? c : 0) + kBytes * static_cast<size_t>(b); }
  void block(int b, std::integral_constant<int, 0>, int c, __m256i* w, __m256* dv) const {
    *w = q4Quants<One>(at(c, b));
    *dv = _mm256_set1_ps(f16At(at(c, b)));
  }
  __m128 mins(int b, std::integral_constant<int, 0>) const {
    if (!One) return _mm_setzero_ps();
    return _mm_setr_ps(f16At(at(0, b) + 2), f16At(at(1, b) + 2), f16At(at(2, b) + 2), f16At(at(3, b) + 2));
  }
  void begin(int) const {}
  // Block b of the rows kPrefetchPanels panels ahead (as Q8Source's).
  WEFT_PREFETCH_INLINE void prefetch(int b, std::integral_constant<int, 0>) const {
    const uint8_t* ahead = rows + rowBytes * kQPanel * kPrefetchPanels + kBytes * static_cast<size_t>(b);
    for (int i = 0; i < kQPanel; i++) _mm_prefetch(reinterpret_cast<const char*>(ahead + rowBytes * i), _MM_HINT_T1);
  }
};

// One superblock of the panel's rows, decoded once per 256 inputs by KSource: where each
// row's superblock starts, its scales as floats (Q4_K: d·sc[j], j < 8; Q6_K: d·sc[i], i < 16)
// and, per block, the four columns' min terms: the values unpackQ4K/unpackQ6K write.
struct SuperBlock {
  const uint8_t* at[kQPanel];
  alignas(64) float scale[kQPanel][16];
  alignas(16) float min[8][kQPanel];
};

// Q4_K, Q5_K or Q6_K read in place, for steps of few rows (as Q8Source): block j of
// a superblock takes its quants straight from the rows and its lane scales from the decoded
// superblock, giving the values unpackQ4K/unpackQ5K/unpackQ6K + unpackPanel give, so the same bits.
template <DType D>
struct KSource {
  static constexpr int kGroup = 8;  // blocks per superblock, each with its index j known when compiled
  static constexpr bool kQ45 = D == DType::Q4_K || D == DType::Q5_K;  // Q4_K's scales and mins
  static constexpr size_t kSuperBytes = D == DType::Q4_K ? kQ4KBytes : D == DType::Q5_K ? kQ5KBytes : kQ6KBytes;
  const uint8_t* rows;  // the panel's first row
  size_t rowBytes;
  int cols;  // rows present (the rest read as row 0 and are not stored)
  SuperBlock* s;

  void begin(int b) const {
    for (int c = 0; c < kQPanel; c++) s->at[c] = rows + rowBytes * (c < cols ? c : 0) + kSuperBytes * static_cast<size_t>(b / 8);
    alignas(32) float mins[kQPanel][8];
    for (int c = 0; c < kQPanel; c++) {
      __m256 lo, hi;
      if (kQ45) {
        q4kScales(s->at[c], &lo, &hi);
        _mm256_store_ps(mins[c], hi);
      } else {
        q6kScales(s->at[c], &lo, &hi);
        _mm256_store_ps(s->scale[c] + 8, hi);
      }
      _mm256_store_ps(s->scale[c], lo);
    }
    if (kQ45)  // Q6_K has no mins (its tiles take no min chain)
      for (int j = 0; j < 8; j++)
        for (int c = 0; c < kQPanel; c++) s->min[j][c] = mins[c][j];
  }
  // Column c's 32 quants of block J, as unpackQ4K/unpackQ5K/unpackQ6K store them.
  template <int J>
  __m256i quants(int c) const {
    const uint8_t* sb = s->at[c];
    if (D == DType::Q4_K) return q4kWeights<J % 2 == 1>(load32(sb + kQ4KQuants + 32 * (J / 2)));
    if (D == DType::Q5_K) return q5kQuants(load32(sb + kQ5KQuants + 32 * (J / 2)), J % 2 == 1, load32(sb + kQ5KHigh), J);
    constexpr int n = J / 4, k = J % 4;
    return q6kQuants<k>(load32(sb + 64 * n + 32 * (k % 2)), load32(sb + kQ6KHigh + 32 * n));
  }
  // Block j's lane scales for column c: Q4_K's (Q5_K's) one scale in all 8 lanes (a broadcast
  // load: the permute it replaced cost a shuffle uop a block and column, 9–13 % of a one-row
  // Q4_K matmul here), or Q6_K's two (lanes 0–3, 4–7), which one permute picks from the floats.
  template <int J>
  static constexpr int q6kScaleAt(int lane) { return 2 * J + lane / 4; }
  template <int J>
  void block(int, std::integral_constant<int, J>, int c, __m256i* w, __m256* dv) const {
    *w = quants<J>(c);
    if constexpr (kQ45) {
      *dv = _mm256_broadcast_ss(s->scale[c] + J);
    } else {
      constexpr int base = q6kScaleAt<J>(0) / 8 * 8;  // blocks 4–7 take scales 8–15
      const __m256i idx = _mm256_setr_epi32(q6kScaleAt<J>(0) - base, q6kScaleAt<J>(1) - base, q6kScaleAt<J>(2) - base, q6kScaleAt<J>(3) - base,
                                            q6kScaleAt<J>(4) - base, q6kScaleAt<J>(5) - base, q6kScaleAt<J>(6) - base, q6kScaleAt<J>(7) - base);
      *dv = _mm256_permutevar8x32_ps(_mm256_load_ps(s->scale[c] + base), idx);
    }
  }
  template <int J>
  __m128 mins(int, std::integral_constant<int, J>) const { return _mm_load_ps(s->min[J]); }
  // At a superblock's first block, that superblock of the rows kPrefetchPanels panels ahead.
  template <int J>
  WEFT_PREFETCH_INLINE void prefetch(int, std::integral_constant<int, J>) const {
    if (J != 0) return;
    for (int c = 0; c < kQPanel; c++)
      for (size_t at = 0; at < kSuperBytes + 63; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(s->at[c] + rowBytes * kQPanel * kPrefetchPanels + at), _MM_HINT_T1);
  }
};

// Block b of the tile loop, block J of its group: every row's dots (the lane chains of quant.h),
// column by column, then the min chain, kept per column in one 4-float vector. A column's weights
// are decoded once and held only while the R rows use them: AVX2 has 16 vector registers, and
// with every column's weights and scales held at once beside the 2 × kQPanel accumulators, GCC
// kept accumulators on the stack (a store and a reload in their FMA chains).
template <int J, int R, bool Mins, typename Source>
__attribute__((always_inline)) inline void tileBlock(const Source& p, const QuantActBlock* x, int nb, int b, __m256 (&acc)[R][kQPanel], __m128 (&macc)[R]) {
  const std::integral_constant<int, J> j;
  p.prefetch(b, j);
  const QuantActBlock* xb[R];
  __m256i xv[R];
  for (int r = 0; r < R; r++) {
    xb[r] = x + static_cast<size_t>(r) * nb + b;
    xv[r] = load32(xb[r]->q);
  }
  for (int v = 0; v < kQPanel; v++) {
    __m256i w;
    __m256 dv;
    p.block(b, j, v, &w, &dv);
    for (int r = 0; r < R; r++)
      acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot<Mins>(w, xv[r])), _mm256_mul_ps(dv, _mm256_set1_ps(xb[r]->d)), acc[r][v]);
  }
  if (Mins) {
    const __m128 m = p.mins(b, j);
    for (int r = 0; r < R; r++) macc[r] = _mm_fmadd_ps(m, _mm_set1_ps(xb[r]->s), macc[r]);
  }
}

// Blocks J, J + 1, ... of the group starting at b0, each with its index known when compiled.
template <int J, int R, bool Mins, typename Source>
__attribute__((always_inline)) inline void tileGroup(const Source& p, const QuantActBlock* x, int nb, int b0, __m256 (&acc)[R][kQPanel], __m128 (&macc)[R]) {
  if constexpr (J < Source::kGroup) {
    tileBlock<J, R, Mins>(p, x, nb, b0 + J, acc, macc);
    tileGroup<J + 1, R, Mins>(p, x, nb, b0, acc, macc);
  }
}

// y[r, c] for R activation rows (x: row r's blocks at x + r·nb) × the panel's
// first `cols` columns (y: row stride N). Per output: the lane chains of quant.h,
// then its tree, plus the min chain.
template <int R, bool Mins, typename Source>
void tile(const Source& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  __m256 acc[R][kQPanel];
  __m128 macc[R];
  for (int r = 0; r < R; r++) {
    for (int v = 0; v < kQPanel; v++) acc[r][v] = _mm256_setzero_ps();
    macc[r] = _mm_setzero_ps();
  }
  for (int b0 = 0; b0 < nb; b0 += Source::kGroup) {
    p.begin(b0);
    tileGroup<0, R, Mins>(p, x, nb, b0, acc, macc);
  }
  for (int r = 0; r < R; r++) {
    float mins[kQPanel];
    _mm_storeu_ps(mins, macc[r]);
    for (int c = 0; c < cols; c++) y[static_cast<size_t>(r) * N + c] = hsum(acc[r][c]) + mins[c];
  }
}

template <bool Mins, typename Source>
void panelRows(const Source& p, const QuantActBlock* x, int T, int nb, float* y, int N, int cols) {
  for (int t = 0; t < T; t += kTileRows) {
    const QuantActBlock* xt = x + static_cast<size_t>(t) * nb;
    float* yt = y + static_cast<size_t>(t) * N;
    switch (std::min(kTileRows, T - t)) {
      case 1: tile<1, Mins, Source>(p, xt, nb, yt, N, cols); break;
      case 2: tile<2, Mins, Source>(p, xt, nb, yt, N, cols); break;
      default: break;
    }
  }
}

// The sum of eight int32 lanes.
inline int sum8(__m256i s) {
  const __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  const __m128i s2 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
  return _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 0xB1)));
}

}  // namespace

// quantizeActivations with 8-wide vectors: the same operations per element
// (roundps to nearest even is nearbyint in the default rounding mode), so the same bits.
void quantizeActivationsAvx2(const float* x, int T, int K, QuantActBlock* out) {
  const int nb = K / kQBlock;
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++)
    for (int b = 0; b < nb; b++) {
      const float* v = x + static_cast<size_t>(t) * K + b * kQBlock;
      QuantActBlock& o = out[static_cast<size_t>(t) * nb + b];
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < kQBlock; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v + i), absMask));
      const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
      o.d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(o.d != 0.0f ? 1.0f / o.d : 0.0f);
      __m256i q32[4];
      for (int i = 0; i < 4; i++) {
        const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q32[i] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
      }
      const int h0 = sum8(_mm256_add_epi32(q32[0], q32[1])), h1 = sum8(_mm256_add_epi32(q32[2], q32[3]));
      o.half[0] = static_cast<int16_t>(h0);
      o.half[1] = static_cast<int16_t>(h1);
      const int sum = h0 + h1;
      // int32 → int16 → int8 packs interleave 128-bit lanes; the permute restores the order.
      const __m256i p16a = _mm256_packs_epi32(q32[0], q32[1]), p16b = _mm256_packs_epi32(q32[2], q32[3]);
      const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
      store32(o.q, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
      o.s = o.d * static_cast<float>(sum);
    }
}

namespace {
// Steps of few rows read every type in place, in passes of one row tile (the later passes from
// cache): a panel's unpacking would serve too few rows to pay for its stores. How few, by type
// (matmul-timing, WEFT_ISA=avx2, 1024 × 3072 streamed, GB/s unpacked → in place): Q8_0 at 3, 4
// and 8 rows 10.7 → 16.1, 9.5 → 13.5, 5.9 → 7.5; Q6_K at 3 and 4 rows 8.2 → 10.2, 7.7 → 8.8 but
// at 8 rows 4.8 → 4.5; Q4_0 and Q4_1 at 3 rows 7.2 → 9.1, 6.9 → 9.1; Q4_K and Q5_K within noise at 3
// and 4 rows, Q4_K 3.5 → 3.2 at 8.
int inPlaceRows(DType d) { return d == DType::Q8_0 ? 8 : 4; }

bool inPlace(DType d, const uint8_t* rows, size_t rowBytes, int cols, const QuantActBlock* x, int T, int nb, float* y, int N) {
  static thread_local SuperBlock scales;
  switch (d) {
    case DType::Q8_0: panelRows<false>(Q8Source{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    case DType::Q4_0: panelRows<false>(Q4Source<false>{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    case DType::Q4_1: panelRows<true>(Q4Source<true>{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    case DType::Q4_K: panelRows<true>(KSource<DType::Q4_K>{rows, rowBytes, cols, &scales}, x, T, nb, y, N, cols); return true;
    case DType::Q5_K: panelRows<true>(KSource<DType::Q5_K>{rows, rowBytes, cols, &scales}, x, T, nb, y, N, cols); return true;
    case DType::Q6_K: panelRows<false>(KSource<DType::Q6_K>{rows, rowBytes, cols, &scales}, x, T, nb, y, N, cols); return true;
    default: return false;
  }
}
}  // namespace

void matmulQuantAvx2(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> dv, m;
  q.resize(static_cast<size_t>(kQPanel) * w.K);
  dv.resize(static_cast<size_t>(kQPanel) * 8 * nb);
  m.resize(static_cast<size_t>(kQPanel) * nb);
  const Panel panel{q.data(), dv.data(), m.data()};
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  const bool mins = quantHasMins(w.dtype);
  for (int n = n0; n < n1; n += kQPanel) {
    const int cols = std::min(kQPanel, n1 - n);
    const uint8_t* rows = static_cast<const uint8_t*>(w.data) + rowBytes * n;
    if (T <= inPlaceRows(w.dtype) && inPlace(w.dtype, rows, rowBytes, cols, x, T, nb, y + n, w.N)) continue;
    unpackPanel(w.dtype, rows, rowBytes, w.K, cols, panel);
    if (mins) panelRows<true>(PanelSource{panel}, x, T, nb, y + n, w.N, cols);
    else panelRows<false>(PanelSource{panel}, x, T, nb, y + n, w.N, cols);
  }
}

}  // namespace weft

#pragma GCC pop_options
