// The quantized matmul with integer dot products for AVX2, in the orders quant.h fixes
// (bit-identical to the scalar code): 256-bit, one panel column per vector; a lane's 4
// products summed by vpmaddubsw + vpmaddwd. The 32-element types: on |w| and x with w's
// sign, where |w| ≤ 128 and |x| ≤ 127 keep the 16-bit pair sums from saturating (on w and x
// as they are for Q4_1, whose weights are never negative: see dot). The K-quants: on their
// unsigned quants, vpmaddwd by the block's integer scale lanes (see kTile).
#include <immintrin.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>
#include "kquant_rows.h"
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

// The 32-element types' values as unpackRowScalar gives them (the K-quants are read in place: kTile).
void unpackRow(DType d, const uint8_t* src, int K, const UnpackedRow& r) {
  switch (d) {
    case DType::Q8_0: unpackQ8_0(src, K, r); return;
    case DType::Q4_0: unpackQ4<false>(src, K, r); return;
    case DType::Q4_1: unpackQ4<true>(src, K, r); return;
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
// Q4_1, the 32-element type with a min, unpacks to weights 0–15, never negative, where the
// sign steps change nothing (sign(x, w) is x where w > 0, and w = 0 adds 0 either way): its
// dot skips them, the same int32 lanes for two fewer instructions on the ports the FMAs use.
template <bool Unsigned>
inline __m256i dot(__m256i w, __m256i x) {
  if (Unsigned) return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), _mm256_set1_epi16(1));
}

// Block b of the panel: column v's weights (as the dot takes them) and lane scales.
struct PanelSource {
  const Panel& p;
  void block(int b, int v, __m256i* w, __m256* dv) const {
    *w = load32(p.q + 32 * (kQPanel * b + v));
    *dv = _mm256_loadu_ps(p.dv + 8 * (kQPanel * b + v));
  }
  __m128 mins(int b) const { return _mm_loadu_ps(p.m + kQPanel * b); }
  void prefetch(int) const {}  // unpackPanel asked for the rows ahead
};

// Q8_0 read in place (34-byte blocks: f16 scale, 32 int8), for steps of few rows
// (inPlaceRows), where a panel's unpacking would serve too few rows to pay off.
// The same values as unpackQ8_0 + unpackPanel give.
struct Q8Source {
  const uint8_t* rows;  // the panel's first row
  size_t rowBytes;
  int cols;  // rows present (the rest read as row 0 and are not stored)
  void block(int b, int c, __m256i* w, __m256* dv) const {
    const uint8_t* a = rows + rowBytes * (c < cols ? c : 0) + 34 * static_cast<size_t>(b);
    *w = load32(a + 2);
    *dv = _mm256_set1_ps(f16At(a));
  }
  __m128 mins(int) const { return _mm_setzero_ps(); }
  // Block b of the rows kPrefetchPanels panels ahead (see kPrefetchPanels). Inlined early:
  // see WEFT_PREFETCH_INLINE.
  WEFT_PREFETCH_INLINE void prefetch(int b) const {
    const uint8_t* ahead = rows + rowBytes * kQPanel * kPrefetchPanels + 34 * static_cast<size_t>(b);
    for (int i = 0; i < kQPanel; i++) _mm_prefetch(reinterpret_cast<const char*>(ahead + rowBytes * i), _MM_HINT_T1);
  }
};

// Q4_0 or Q4_1 read in place, for steps of few rows (as Q8Source): the values
// unpackQ4 + unpackPanel give, so the same bits.
template <bool One>
struct Q4Source {
  static constexpr size_t kBytes = One ? 20 : 18;
  const uint8_t* rows;  // the panel's first row
  size_t rowBytes;
  int cols;  // rows present (the rest read as row 0 and are not stored)
  const uint8_t* at(int c, int b) const { return rows + rowBytes * (c < cols ? c : 0) + kBytes * static_cast<size_t>(b); }
  void block(int b, int c, __m256i* w, __m256* dv) const {
    *w = q4Quants<One>(at(c, b));
    *dv = _mm256_set1_ps(f16At(at(c, b)));
  }
  __m128 mins(int b) const {
    if (!One) return _mm_setzero_ps();
    return _mm_setr_ps(f16At(at(0, b) + 2), f16At(at(1, b) + 2), f16At(at(2, b) + 2), f16At(at(3, b) + 2));
  }
  // Block b of the rows kPrefetchPanels panels ahead (as Q8Source's).
  WEFT_PREFETCH_INLINE void prefetch(int b) const {
    const uint8_t* ahead = rows + rowBytes * kQPanel * kPrefetchPanels + kBytes * static_cast<size_t>(b);
    for (int i = 0; i < kQPanel; i++) _mm_prefetch(reinterpret_cast<const char*>(ahead + rowBytes * i), _MM_HINT_T1);
  }
};

// Block b of the tile loop: every row's dots (the lane chains of quant.h), column by column,
// then the min chain, kept per column in one 4-float vector. A column's weights are decoded once
// and held only while the R rows use them: AVX2 has 16 vector registers, and with every column's
// weights and scales held at once beside the 2 × kQPanel accumulators, GCC kept accumulators on
// the stack (a store and a reload in their FMA chains).
template <int R, bool Mins, typename Source>
__attribute__((always_inline)) inline void tileBlock(const Source& p, const QuantActBlock* x, int nb, int b, __m256 (&acc)[R][kQPanel], __m128 (&macc)[R]) {
  p.prefetch(b);
  const QuantActBlock* xb[R];
  __m256i xv[R];
  for (int r = 0; r < R; r++) {
    xb[r] = x + static_cast<size_t>(r) * nb + b;
    xv[r] = load32(xb[r]->q);
  }
  for (int v = 0; v < kQPanel; v++) {
    __m256i w;
    __m256 dv;
    p.block(b, v, &w, &dv);
    for (int r = 0; r < R; r++)
      acc[r][v] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot<Mins>(w, xv[r])), _mm256_mul_ps(dv, _mm256_set1_ps(xb[r]->d)), acc[r][v]);
  }
  if (Mins) {
    const __m128 m = p.mins(b);
    for (int r = 0; r < R; r++) macc[r] = _mm_fmadd_ps(m, _mm_set1_ps(xb[r]->s), macc[r]);
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
  for (int b = 0; b < nb; b++) tileBlock<R, Mins>(p, x, nb, b, acc, macc);
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

// ---- The K-quants in quant.h's K-quant order: Q6_K read in place, Q4_K and Q5_K from rows
// whose scales were decoded at load (Q4_KD, Q5_KD: kquant_rows.h) ----

// One superblock of one column as kTile reads it (D: Q4_KD, Q5_KD or Q6_K): block J's unsigned
// quants and int16 scale lanes from its bytes, and its min coefficients, d and cm (quant.h), made
// once for every row of the tile.
template <DType D>
struct KColumn {
  static constexpr size_t kBytes = D == DType::Q4_KD ? q4kdrow::kBytes : D == DType::Q5_KD ? q5kdrow::kBytes : kQ6KBytes;
  const uint8_t* sb;
  // The min coefficients, against kMatmul's table bs: Q4_KD, Q5_KD: m_j in int32 lane j (its
  // high int16 zero), against block j's whole Σx; Q6_K: c[e], e < 16, as int16, against the halves.
  __m256i coef;
  __m256i scales8;  // Q4_KD, Q5_KD: sc_j in byte j of every 64-bit lane
  __m256i q6Half[2];  // Q6_K: its int16 scales 0–7, or 8–15, in both 128-bit lanes
  __m256 d, cm;     // in every lane

  explicit KColumn(const uint8_t* at) : sb(at) {
    if constexpr (D == DType::Q6_K) {
      coef = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kQ6KScales)));
      q6Half[0] = _mm256_permute2x128_si256(coef, coef, 0x00);
      q6Half[1] = _mm256_permute2x128_si256(coef, coef, 0x11);
      const float d16 = f16At(sb + kQ6KD);
      d = _mm256_set1_ps(d16);
      cm = _mm256_set1_ps(-static_cast<float>(kQ6KBias) * d16);
    } else {
      long long sc;
      std::memcpy(&sc, sb + q4kdrow::kScales, 8);
      scales8 = _mm256_set1_epi64x(sc);
      coef = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + q4kdrow::kMins)));
      d = _mm256_broadcast_ss(reinterpret_cast<const float*>(sb + q4kdrow::kD));
      cm = _mm256_broadcast_ss(reinterpret_cast<const float*>(sb + q4kdrow::kCm));
    }
  }
  // Block J's scale S(J, l) in int16 lanes 2l and 2l + 1 (vpmaddwd's pairs), one shuffle: Q4_K's
  // byte J into every 16-bit lane, or Q6_K's scale 2J into lanes 0–7 and 2J + 1 into 8–15.
  template <int J>
  __m256i scales() const {
    if constexpr (D == DType::Q6_K) {
      constexpr char a = 4 * J % 16, b = a + 1, c = a + 2, e = a + 3;  // the bytes of int16 scales 2J, 2J + 1 within their half
      return _mm256_shuffle_epi8(q6Half[J / 4], _mm256_setr_epi8(a, b, a, b, a, b, a, b, a, b, a, b, a, b, a, b, c, e, c, e, c, e, c, e, c, e, c, e, c, e, c, e));
    } else {
      constexpr char z = -128;  // a pshufb index that writes zero
      return _mm256_shuffle_epi8(scales8, _mm256_setr_epi8(J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z, J, z));
    }
  }
  // Block J's 32 unsigned quants.
  template <int J>
  __m256i quants() const {
    if constexpr (D == DType::Q4_KD) return __m256i(q4kQuants<J % 2 == 1>(U8x32(load32(sb + q4kdrow::kQs + 32 * (J / 2)))));
    if constexpr (D == DType::Q5_KD)  // block j's fifth bit is bit j of qh's byte for each input
      return __m256i(q4kQuants<J % 2 == 1>(U8x32(load32(sb + q5kdrow::kQs + 32 * (J / 2)))) | ((U8x32(load32(sb + q5kdrow::kQh)) >> J) & 1) << 4);
    constexpr int n = J / 4, k = J % 4;
    return __m256i(q6kBits<k>(U8x32(load32(sb + 64 * n + 32 * (k % 2))), U8x32(load32(sb + kQ6KHigh + 32 * n))));
  }
};

// One superblock of one column decoded into L1 for a tile of more than kKDotRows rows: block j's
// unsigned quants and scale lanes as KColumn gives them.
struct KDecoded {
  alignas(32) uint8_t w[8][32];
  alignas(32) int16_t sv[8][16];
};

template <DType D, int J = 0>
__attribute__((always_inline)) inline void kDecode(const KColumn<D>& k, KDecoded& out) {
  if constexpr (J < 8) {
    store32(out.w[J], k.template quants<J>());
    store32(out.sv[J], k.template scales<J>());
    kDecode<D, J + 1>(k, out);
  }
}

// Blocks J.. of R rows' integer lanes P (xs: row r's 8 blocks at xs + r·nb) from a column's
// bytes. A block costs each row two multiplies and an add on the unsigned quants (vpmaddubsw
// keeps its 16-bit pair sums exact: 2 · 63 · 127 < 2^15), its weights and scales made once for
// the R rows.
template <int R, int J = 0, DType D>
__attribute__((always_inline)) inline void kBlocks(const KColumn<D>& k, const QuantActBlock* xs, int nb, __m256i (&p)[R]) {
  if constexpr (J < 8) {
    const __m256i w = k.template quants<J>(), sv = k.template scales<J>();
    for (int r = 0; r < R; r++) p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w, load32(xs[static_cast<size_t>(r) * nb + J].q)), sv));
    kBlocks<R, J + 1>(k, xs, nb, p);
  }
}

// R rows' lanes P into `out` (the caller's memory; the sums stay in registers until done), from a
// column's bytes or, below, from its decoded superblock (a loop over the blocks: unrolled, GCC
// hoisted every block's loads and kept the sums on the stack).
template <int R, DType D>
__attribute__((always_inline)) inline void kDot(const KColumn<D>& k, const QuantActBlock* xs, int nb, __m256i* out) {
  __m256i p[R];
  for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
  kBlocks<R>(k, xs, nb, p);
  for (int r = 0; r < R; r++) out[r] = p[r];
}
template <int R>
__attribute__((always_inline)) inline void kDot(const KDecoded& k, const QuantActBlock* xs, int nb, __m256i* out) {
  __m256i p[R];
  for (int r = 0; r < R; r++) p[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
  for (int j = 0; j < 8; j++) {
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(k.w[j])), sv = _mm256_load_si256(reinterpret_cast<const __m256i*>(k.sv[j]));
    for (int r = 0; r < R; r++) p[r] = _mm256_add_epi32(p[r], _mm256_madd_epi16(_mm256_maddubs_epi16(w, load32(xs[static_cast<size_t>(r) * nb + j].q)), sv));
  }
  for (int r = 0; r < R; r++) out[r] = p[r];
}

// Rows per kDot: four sums, a weight and a scale vector in registers (with more, GCC kept the
// sums on the stack).
constexpr int kKDotRows = 4;

// Rows per K-quant tile: their lane sums and activation scales wait in L1 between superblocks.
constexpr int kKTileRows = 16;

// y[r, c] for R ≤ kKTileRows activation rows × kQPanel columns read from `rows` (the
// first `cols` present and stored), in the K-quant order. Few > 0: R = Few ≤ kKDotRows, each block
// decoded in registers; Few = 0: each superblock decoded once into L1 for all R rows, taken
// kKDotRows at a time. (One function for both, each row count's case inlined, kept the sums on the
// stack: 9 % slower at one row than the blocks it replaced.)
template <DType D, int Few>
void kTile(const uint8_t* rows, size_t rowBytes, int cols, const QuantActBlock* x, const int32_t* bs, int R, int nb, float* y, int N) {
  if constexpr (Few > 0) R = Few;
  alignas(32) float acc[kKTileRows][kQPanel][8];
  __m256 xd[kKTileRows];                  // each row's activation scale in every lane
  __m256i ps[kKTileRows];
  KDecoded dec;
  std::fill(&acc[0][0][0], &acc[0][0][0] + static_cast<size_t>(R) * kQPanel * 8, 0.0f);
  for (int s = 0; s < nb / 8; s++) {
    const QuantActBlock* xs = x + 8 * s;
    for (int r = 0; r < R; r++) xd[r] = _mm256_set1_ps(xs[static_cast<size_t>(r) * nb].d);
    for (int c = 0; c < kQPanel; c++) {
      const KColumn<D> k(rows + rowBytes * (c < cols ? c : 0) + KColumn<D>::kBytes * s);
      prefetchL2(k.sb + rowBytes * kQPanel * kPrefetchPanels, KColumn<D>::kBytes);
      if constexpr (Few > 0) {
        kDot<Few>(k, xs, nb, ps);
      } else {
        kDecode(k, dec);
        for (int r = 0; r < R; r += kKDotRows) {
          const QuantActBlock* xr = xs + static_cast<size_t>(r) * nb;
          switch (std::min(kKDotRows, R - r)) {
            case 1: kDot<1>(dec, xr, nb, ps + r); break;
            case 2: kDot<2>(dec, xr, nb, ps + r); break;
            case 3: kDot<3>(dec, xr, nb, ps + r); break;
            default: kDot<4>(dec, xr, nb, ps + r); break;
          }
        }
      }
      for (int r = 0; r < R; r++) {
        const __m256i m = _mm256_madd_epi16(k.coef, load32(bs + static_cast<size_t>(r) * nb + 8 * s));
        const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ps[r]), _mm256_mul_ps(k.d, xd[r]), _mm256_load_ps(acc[r][c]));
        _mm256_store_ps(acc[r][c], _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(k.cm, xd[r]), a));
      }
    }
  }
  for (int r = 0; r < R; r++)
    for (int c = 0; c < cols; c++) y[static_cast<size_t>(r) * N + c] = hsum(_mm256_load_ps(acc[r][c]));
}

// One tile of R ≤ kKTileRows rows against one panel of K-quant columns, by its row count.
template <DType D>
void kRows(const uint8_t* rows, size_t rowBytes, int cols, const QuantActBlock* x, const int32_t* bs, int R, int nb, float* y, int N) {
  switch (R) {
    case 1: return kTile<D, 1>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    case 2: return kTile<D, 2>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    case 3: return kTile<D, 3>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    case 4: return kTile<D, 4>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    default: return kTile<D, 0>(rows, rowBytes, cols, x, bs, R, nb, y, N);
  }
}

// One tile of rows against the K-quant panel at `rows` (held as `held`: Q4_KD, Q5_KD or Q6_K).
void kPanel(DType held, const uint8_t* rows, size_t rowBytes, int cols, const QuantActBlock* x, const int32_t* bs, int R, int nb, float* y, int N) {
  switch (held) {
    case DType::Q4_KD: return kRows<DType::Q4_KD>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    case DType::Q5_KD: return kRows<DType::Q5_KD>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    case DType::Q6_K: return kRows<DType::Q6_K>(rows, rowBytes, cols, x, bs, R, nb, y, N);
    default: throw std::invalid_argument("the avx2 set reads Q4_K and Q5_K matrices only as decoded rows (Q4_KD, Q5_KD)");
  }
}

// Columns per block of a K-quant matmul over more rows than a tile holds: each block's weights
// (74–220 KiB of Q4_K at K = 1024–3072, in L2) are read once per tile of rows, whose activations
// stay in L1. Panel by panel, every tile's activations went through L1 once a panel: 720 KiB of
// them at 512 rows of K = 1024.
constexpr int kKBlockCols = 32 * kQPanel;

// Columns [n0, n1) of a K-quant matrix at `base` for all T rows, in tiles of at most kKTileRows
// rows within each block of columns (a row's result does not depend on its tile or block).
void kMatmul(DType held, const uint8_t* base, size_t rowBytes, const QuantActBlock* x, const int32_t* bs, int T, int nb, float* y, int N, int n0, int n1) {
  for (int c0 = n0; c0 < n1; c0 += kKBlockCols) {
    const int c1 = std::min(n1, c0 + kKBlockCols);
    for (int t = 0; t < T; t += kKTileRows) {
      const size_t at = static_cast<size_t>(t) * nb;
      for (int n = c0; n < c1; n += kQPanel)
        kPanel(held, base + rowBytes * n, rowBytes, std::min(kQPanel, c1 - n), x + at, bs + at, std::min(kKTileRows, T - t), nb, y + static_cast<size_t>(t) * N + n, N);
    }
  }
}

}  // namespace

// quantizeActivations with 8-wide vectors: the same operations per element
// (roundps to nearest even is nearbyint in the default rounding mode), so the same bits.
void quantizeActivationsAvx2(const float* x, int T, int K, int scaleBlocks, QuantActBlock* out) {
  const int nb = K / kQBlock;
  const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++)
    for (int b0 = 0; b0 < nb; b0 += scaleBlocks) {
      const float* v0 = x + static_cast<size_t>(t) * K + b0 * kQBlock;
      __m256 m = _mm256_setzero_ps();
      for (int i = 0; i < kQBlock * scaleBlocks; i += 8) m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(v0 + i), absMask));
      const __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      const __m128 m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      const float amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
      const float d = amax / 127.0f;
      const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
      for (int b = 0; b < scaleBlocks; b++) {
        const float* v = v0 + kQBlock * b;
        QuantActBlock& o = out[static_cast<size_t>(t) * nb + b0 + b];
        o.d = d;
        __m256i q32[4];
        for (int i = 0; i < 4; i++) {
          const __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
          q32[i] = _mm256_cvtps_epi32(_mm256_min_ps(hi, _mm256_max_ps(lo, r)));
        }
        const int h0 = sum8(_mm256_add_epi32(q32[0], q32[1])), h1 = sum8(_mm256_add_epi32(q32[2], q32[3]));
        o.half[0] = static_cast<int16_t>(h0);
        o.half[1] = static_cast<int16_t>(h1);
        // int32 → int16 → int8 packs interleave 128-bit lanes; the permute restores the order.
        const __m256i p16a = _mm256_packs_epi32(q32[0], q32[1]), p16b = _mm256_packs_epi32(q32[2], q32[3]);
        const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
        store32(o.q, _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
        o.s = o.d * static_cast<float>(h0 + h1);
      }
    }
}

namespace {
// Steps of few rows read the 32-element types in place, in passes of one row tile (the later
// passes from cache): a panel's unpacking would serve too few rows to pay for its stores. How
// few, by type (matmul-timing, WEFT_ISA=avx2, 1024 × 3072 streamed, GB/s unpacked → in place):
// Q8_0 at 3, 4 and 8 rows 10.7 → 16.1, 9.5 → 13.5, 5.9 → 7.5; Q4_0 and Q4_1 at 3 rows 7.2 → 9.1,
// 6.9 → 9.1.
int inPlaceRows(DType d) { return d == DType::Q8_0 ? 8 : 4; }

bool inPlace(DType d, const uint8_t* rows, size_t rowBytes, int cols, const QuantActBlock* x, int T, int nb, float* y, int N) {
  switch (d) {
    case DType::Q8_0: panelRows<false>(Q8Source{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    case DType::Q4_0: panelRows<false>(Q4Source<false>{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    case DType::Q4_1: panelRows<true>(Q4Source<true>{rows, rowBytes, cols}, x, T, nb, y, N, cols); return true;
    default: return false;
  }
}
}  // namespace

void matmulQuantAvx2(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  if (actScaleBlocks(w.dtype) > 1) {
    // The K-quant order's bs (quant.h) of every block in one place, one int32 a block: `half` as it
    // is for Q6_K, whose int16 coefficients take each half; for Q4_KD and Q5_KD, whose one int32
    // coefficient m_j a block takes both, their sum (m_j·(h0 + h1) = m_j·h0 + m_j·h1, the same
    // exact int32). A superblock's eight are one load in kTile (gathered there, once a panel,
    // they cost 13–16 %).
    static thread_local std::vector<int32_t> bs;
    bs.resize(static_cast<size_t>(T) * nb);
    if (w.panelType == DType::Q6_K)
      for (size_t b = 0; b < bs.size(); b++) std::memcpy(&bs[b], x[b].half, sizeof(int32_t));
    else
      for (size_t b = 0; b < bs.size(); b++) bs[b] = x[b].half[0] + x[b].half[1];
    const size_t rowBytes = w.panelType == DType::Q6_K ? tensorBytes(w.dtype, 1, w.K) : decodedRowBytes(w.panelType, w.K);
    return kMatmul(w.panelType, static_cast<const uint8_t*>(w.data), rowBytes, x, bs.data(), T, nb, y, w.N, n0, n1);
  }
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> dv, m;
  q.resize(static_cast<size_t>(kQPanel) * w.K);
  dv.resize(static_cast<size_t>(kQPanel) * 8 * nb);
  m.resize(static_cast<size_t>(kQPanel) * nb);
  const Panel panel{q.data(), dv.data(), m.data()};
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
