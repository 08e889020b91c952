// AMX-INT8 tiles for block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): the amx
// set's quantized matmul, on the matrices it holds in VNNI panels (quant_panels.h; Q6_K as
// Q6_KW). Per panel of 16 output columns and group of inputs (32; Q6_KW: 16, one per scale), a B
// tile is the weights' VNNI rows (Q8_0's and Q6_KW's as they lie, the 4- and 5-bit types'
// unpacked to bytes once per panel), an A tile 16 activation rows' int8
// quants, and one TDPBSSD/TDPBSUD gives each (row, column) the exact int32 sum of its group; then
// the fp32 operations in the order kernels_quant_panels.cpp spells out, so the tiles give the lane
// kernel's bits. Steps of fewer rows than tileRowsFrom take the lane kernel. A tile computes each
// output from its own row and column, so the set is batch-invariant; it is not bit-identical to
// the AVX2 and scalar sets (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>
#include "quant.h"
#include "quant_panels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
#include "amx_tiles.h"
#include "kquant_blocks.h"
#include "quant_panel_units.h"

namespace weft {
namespace {

constexpr int kToks = 16;  // activation rows per A tile
constexpr int kQ6KGroups = 16;  // Q6_K groups (of 16 inputs, one scale each) per superblock
// The inputs of one tile product: those sharing a weight scale (Q6_KW: 16, the others 32).
constexpr int groupBytesOf(DType d) { return d == DType::Q6_KW ? kQBlock / 2 : kQBlock; }
template <DType D>
constexpr int kGroupBytesOf = groupBytesOf(D);

// Two sets of tiles, so that one group's products run while the other's are scaled:
// A 0/1 (toks × a group's bytes), B 2/3 (bytes/4 VNNI rows), C 4/5 (toks × 16 int32). The paired
// kernels use C 4/5 and 6/7 as the two sets of their two products: panelRowPair with A 0/1 as the
// pair's row tiles (16 rows each: from 17 rows on) and B 2/3 by group, panelColPair with A 0/1 by
// group and B 2/3 as the pair's panels.
TileConfig configFor(int toks, int groupBytes) {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, toks, groupBytes);
    c.set(2 + i, groupBytes / 4, kVnniRow);
    c.set(4 + i, toks, 4 * kCols);
    c.set(6 + i, toks, 4 * kCols);
  }
  return c;
}

// Activation rows for A tiles: per tile of kToks rows and block b, the rows' 32 quants (zeros
// past the last row: they give zero sums), and the rows' scales d and s.
struct ActTiles {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  int nb = 0;
  size_t at(int tt, int b) const { return static_cast<size_t>(tt) * nb + b; }  // (tile, block) in order
  const int8_t* tile(int tt, int b) const { return q.data() + at(tt, b) * kToks * kQBlock; }
  const float* rowD(int tt, int b) const { return d.data() + at(tt, b) * kToks; }
  const float* rowS(int tt, int b) const { return s.data() + at(tt, b) * kToks; }
};

void repack(const QuantActBlock* x, int T, int nb, ActTiles& out) {
  const int tiles = (T + kToks - 1) / kToks;
  out.nb = nb;
  out.q.assign(static_cast<size_t>(tiles) * nb * kToks * kQBlock, 0);
  out.d.assign(static_cast<size_t>(tiles) * nb * kToks, 0.0f);
  out.s.assign(static_cast<size_t>(tiles) * nb * kToks, 0.0f);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < nb; b++) {
      const QuantActBlock& xb = x[static_cast<size_t>(t) * nb + b];
      const size_t at = out.at(t / kToks, b) * kToks + t % kToks;
      std::memcpy(out.q.data() + at * kQBlock, xb.q, kQBlock);
      out.d[at] = xb.d;
      out.s[at] = xb.s;
    }
}

// A panel unpacked for the B tiles: block b's 8 VNNI rows at q + 512·b (Q4_0 as the signed
// weights, stored value − kOffset), scale[g] and min[b] as 16 floats each.
struct KPanel {
  std::vector<int8_t> q;
  std::vector<float> scale, min;
};

template <DType D>
void unpackPanel(const Panel& p, int nb, KPanel& out) {
  constexpr int perUnit = kBlocksPerUnit<D>, groupsPerUnit = perUnit * kQBlock / kGroupBytesOf<D>;
  const int units = nb / perUnit;
  out.q.resize(static_cast<size_t>(nb) * 8 * kVnniRow);
  out.scale.resize(static_cast<size_t>(units) * groupsPerUnit * kCols);
  out.min.resize(static_cast<size_t>(nb) * kCols);
  eachUnit<D>(p, units, [&](int u, const uint8_t* unit, const UnitScales& s) {
    for (int g = 0; g < groupsPerUnit; g++) _mm512_storeu_ps(out.scale.data() + (static_cast<size_t>(u) * groupsPerUnit + g) * kCols, s.scale[g]);
    if (kHasMins<D>)
      for (int j = 0; j < perUnit; j++) _mm512_storeu_ps(out.min.data() + (perUnit * static_cast<size_t>(u) + j) * kCols, s.min[j]);
    eachBlock<perUnit>([&](auto j) {
      constexpr int J = decltype(j)::value;
      int8_t* dst = out.q.data() + (perUnit * static_cast<size_t>(u) + J) * 8 * kVnniRow;
      for (int r = 0; r < 8; r++) {
        const __m512i v = vnniRow<D, J>(unit, r);
        _mm512_storeu_si512(dst + kVnniRow * r, kOffset<D> ? _mm512_sub_epi8(v, _mm512_set1_epi8(static_cast<char>(kOffset<D>))) : v);
      }
    });
  });
}

// Q8_0 panels read in place: the tile source of panelRows (group g = block g).
struct Q8Source {
  static constexpr int kGroupBytes = kGroupBytesOf<DType::Q8_0>;
  static constexpr bool kUnsigned = false;
  const Panel& p;
  const uint8_t* b(int g) const { return p.at + static_cast<size_t>(g) * q8panel::kUnit + q8panel::kQ; }
  __m512 scales(int g) const { return f16x16(p.at + static_cast<size_t>(g) * q8panel::kUnit + q8panel::kD); }
  Ahead ahead(int groups) const { return Ahead(p, groups); }
};

// A Q6_KW panel's group scales d·sc (16 floats a group, 16 groups a unit), decoded once per
// panel for Q6Source.
void q6Scales(const Panel& p, int units, std::vector<float>& out) {
  constexpr int groups = kQ6KGroups;
  out.resize(static_cast<size_t>(units) * groups * kCols);
  for (int u = 0; u < units; u++) {
    UnitScales s;
    decodeScales<DType::Q6_KW>(p.at + static_cast<size_t>(u) * q6kwpanel::kUnit, s);
    for (int g = 0; g < groups; g++) _mm512_storeu_ps(out.data() + (static_cast<size_t>(u) * groups + g) * kCols, s.scale[g]);
  }
}

// Q6_KW panels read in place (their weights are signed bytes already): group g (16 inputs) is
// rows 4g..4g+3 of its unit's weight rows; the scales from q6Scales.
struct Q6Source {
  static constexpr int kGroupBytes = kGroupBytesOf<DType::Q6_KW>;
  static constexpr bool kUnsigned = false;
  const Panel& p;
  const float* scale;
  const uint8_t* b(int g) const {
    return p.at + static_cast<size_t>(g / kQ6KGroups) * q6kwpanel::kUnit + q6kwpanel::kQ + (g % kQ6KGroups) * 4 * kVnniRow;
  }
  __m512 scales(int g) const { return _mm512_loadu_ps(scale + static_cast<size_t>(g) * kCols); }
  Ahead ahead(int groups) const { return Ahead(p, groups); }
};

// An unpacked K-quant panel: the tile source of panelRows.
template <DType D>
struct KSource {
  static constexpr int kGroupBytes = kGroupBytesOf<D>;
  static constexpr bool kUnsigned = kHasMins<D>;
  static constexpr int kPerBlock = kQBlock / kGroupBytes;
  const KPanel& k;
  const Panel& p;  // the panel k was unpacked from
  const int8_t* b(int g) const { return k.q.data() + static_cast<size_t>(g / kPerBlock) * 8 * kVnniRow + (g % kPerBlock) * (kGroupBytes / 4) * kVnniRow; }
  __m512 scales(int g) const { return _mm512_loadu_ps(k.scale.data() + static_cast<size_t>(g) * kCols); }
  // The panels ahead are asked for while the tiles run, not while unpackPanel runs (see unpacked()).
  Ahead ahead(int groups) const { return Ahead(p, groups); }
};

// Panel p unpacked into k with no prefetch of its own: the unpacking is short and the products
// long, so the panels ahead are asked for during the products (KSource::ahead), and arrive before
// their unpacking instead of stalling it (perf, Q4_K_M at 16 rows: 55 % of the unpacking's samples
// on its loads and on prefetches waiting for fill buffers, when it asked for them itself).
template <DType D>
KSource<D> unpacked(const Panel& p, int nb, KPanel& k) {
  Panel quiet = p;
  quiet.ahead = nullptr;
  quiet.aheadBytes = 0;
  unpackPanel<D>(quiet, nb, k);
  return KSource<D>{k, p};
}

// A group's products into tiles C += A · B (a macro: tile numbers are instruction operands).
// Its C is stored one group later, so that the store does not wait on the product.
#define WEFT_GROUP_PRODUCT(DP, A, B, C, aPtr, bPtr) \
  do {                                              \
    _tile_zero(C);                                  \
    _tile_loadd(A, aPtr, kQBlock);                  \
    _tile_loadd(B, bPtr, kVnniRow);                 \
    DP(C, A, B);                                    \
  } while (0)

// A group's sums are read back kLag groups after they were stored: by then the tile
// store has left the store buffer, and the vector loads need not wait on it.
constexpr int kLag = 2, kSumBufs = kLag + 1;

// The min chains (Q4_1, Q4_K, Q5_K; per output, macc = fma(m_b, x_b.s, macc) in block order), added to the
// rows' accumulators: eight rows at a time, so that eight independent chains hide the FMA latency.
// Inlined and unrolled, so that the accumulators stay in registers (see panelRows' stores).
__attribute__((always_inline)) inline void addMins(const ActTiles& xt, int tt, const float* mins, __m512 (&acc)[kToks]) {
#pragma GCC unroll 2
  for (int h = 0; h < kToks; h += 8) {
    __m512 macc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) macc[i] = _mm512_setzero_ps();
    for (int b = 0; b < xt.nb; b++) {
      const __m512 m = _mm512_loadu_ps(mins + static_cast<size_t>(b) * kCols);
      const float* s = xt.rowS(tt, b) + h;
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) macc[i] = _mm512_fmadd_ps(m, _mm512_set1_ps(s[i]), macc[i]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) acc[h + i] = _mm512_add_ps(acc[h + i], macc[i]);
  }
}

// A group's sums (c: a row of 16 per activation row) into the rows' accumulators:
// acc += float(sum) · (scale · d), the lane kernel's operations.
__attribute__((always_inline)) inline void scaleGroup(const int32_t* c, __m512 scale, const float* d, __m512 (&acc)[kToks]) {
#pragma GCC unroll 16
  for (int t = 0; t < kToks; t++)
    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kCols * t)), _mm512_mul_ps(scale, _mm512_set1_ps(d[t])), acc[t]);
}

// The min terms added, then the first `rows` rows written to y.
__attribute__((always_inline)) inline void finishRows(const ActTiles& xt, int tt, int rows, const float* mins, __m512 (&acc)[kToks], float* y,
                                                      int N, int cols) {
  if (mins) addMins(xt, tt, mins, acc);
  const __mmask16 written = static_cast<__mmask16>((1u << cols) - 1);
  // Constant indices only: one acc[t] with a run-time t would keep all sixteen in memory, and every
  // group's FMAs would then load and store them (in-cache Q8_0 at 16 rows: 15.3 → 13.3 ns a unit).
#pragma GCC unroll 16
  for (int t = 0; t < kToks; t++)
    if (t < rows) _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * N, written, acc[t]);
}

// One A tile's products with two panels' B tiles (2 and 3), into C tiles C0 and C1 (signed: Q8_0).
#define WEFT_COL_PAIR_PRODUCT(A, C0, C1, a, b0, b1) \
  do {                                               \
    _tile_loadd(A, a, kQBlock);                      \
    _tile_loadd(2, b0, kVnniRow);                    \
    _tile_zero(C0);                                  \
    _tile_dpbssd(C0, A, 2);                          \
    _tile_loadd(3, b1, kVnniRow);                    \
    _tile_zero(C1);                                  \
    _tile_dpbssd(C1, A, 3);                          \
  } while (0)

// Both row tiles' products of a group with one B tile, into C tiles C0 and C1.
#define WEFT_PAIR_PRODUCT(DP, B, C0, C1, a0, a1, b) \
  do {                                               \
    _tile_loadd(B, b, kVnniRow);                     \
    _tile_zero(C0);                                  \
    _tile_zero(C1);                                  \
    _tile_loadd(0, a0, kQBlock);                     \
    DP(C0, 0, B);                                    \
    _tile_loadd(1, a1, kQBlock);                     \
    DP(C1, 1, B);                                    \
  } while (0)

// Up to kToks activation rows × one panel: C holds a row of the panel's 16 sums per activation
// row, and each row's accumulator is a vector over the columns. `mins` (per block × 16 columns)
// or null.
template <class S>
void panelRows(const S& p, const ActTiles& xt, int tt, int rows, const float* mins, float* y, int N, int cols) {
  constexpr int kPerBlock = kQBlock / S::kGroupBytes;
  alignas(64) int32_t sums[kSumBufs * kToks * kCols];
  __m512 acc[kToks];
#pragma GCC unroll 16
  for (int t = 0; t < kToks; t++) acc[t] = _mm512_setzero_ps();
  const int groups = xt.nb * kPerBlock;
  Ahead ahead = tt == 0 ? p.ahead(groups) : Ahead();  // the first row tile brings the panels ahead
  for (int g = 0; g <= groups + kLag; g++) {
    if (g < groups) {  // group g's products, in tile set g % 2
      ahead.next();
      const int8_t* a = xt.tile(tt, g / kPerBlock) + (g % kPerBlock) * S::kGroupBytes;
      const auto* b = p.b(g);
      if constexpr (S::kUnsigned) {
        if (g % 2 == 0) WEFT_GROUP_PRODUCT(_tile_dpbsud, 0, 2, 4, a, b);
        else WEFT_GROUP_PRODUCT(_tile_dpbsud, 1, 3, 5, a, b);
      } else {
        if (g % 2 == 0) WEFT_GROUP_PRODUCT(_tile_dpbssd, 0, 2, 4, a, b);
        else WEFT_GROUP_PRODUCT(_tile_dpbssd, 1, 3, 5, a, b);
      }
    }
    if (g >= 1 && g <= groups) {  // group g − 1's sums, stored
      int32_t* c = sums + ((g - 1) % kSumBufs) * kToks * kCols;
      if ((g - 1) % 2 == 0) _tile_stored(4, c, 4 * kCols);
      else _tile_stored(5, c, 4 * kCols);
    }
    const int s = g - 1 - kLag;  // the group scaled now
    if (s >= 0) scaleGroup(sums + (s % kSumBufs) * kToks * kCols, p.scales(s), xt.rowD(tt, s / kPerBlock), acc);
  }
  finishRows(xt, tt, rows, mins, acc, y, N, cols);
}

// The state of two tile products a group (panelRowPair, panelColPair): their sums, stored from C
// sets 4/5 (even groups) and 6/7 (odd), and the second product's accumulators, kept in L1 (32 in
// registers would leave none for the rest; the first's are the caller's registers).
struct PairSums {
  alignas(64) int32_t sums[kSumBufs][2][kToks * kCols];
  alignas(64) float acc1[kToks * kCols];

  void clear(__m512 (&acc)[kToks]) {
#pragma GCC unroll 16
    for (int t = 0; t < kToks; t++) {
      acc[t] = _mm512_setzero_ps();
      _mm512_store_ps(acc1 + kCols * t, _mm512_setzero_ps());
    }
  }
  // Group g's two products, stored (a group after they were issued: see panelRows).
  __attribute__((always_inline)) void store(int g) {
    int32_t* c0 = sums[g % kSumBufs][0];
    int32_t* c1 = sums[g % kSumBufs][1];
    if (g % 2 == 0) {
      _tile_stored(4, c0, 4 * kCols);
      _tile_stored(5, c1, 4 * kCols);
    } else {
      _tile_stored(6, c0, 4 * kCols);
      _tile_stored(7, c1, 4 * kCols);
    }
  }
  const int32_t* first(int s) const { return sums[s % kSumBufs][0]; }
  // scaleGroup's operations for group s's second product, on the accumulators in L1.
  __attribute__((always_inline)) void scaleSecond(int s, __m512 scale, const float* d) {
    const int32_t* c = sums[s % kSumBufs][1];
#pragma GCC unroll 16
    for (int t = 0; t < kToks; t++)
      _mm512_store_ps(acc1 + kCols * t, _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kCols * t)),
                                                        _mm512_mul_ps(scale, _mm512_set1_ps(d[t])), _mm512_load_ps(acc1 + kCols * t)));
  }
  void loadSecond(__m512 (&acc)[kToks]) const {
#pragma GCC unroll 16
    for (int t = 0; t < kToks; t++) acc[t] = _mm512_load_ps(acc1 + kCols * t);
  }
};

// Two row tiles (tt, tt + 1) × one panel: each group's B tile is loaded once for both products,
// and the two products are independent, so the tile unit has more in flight than in two
// panelRows passes (matmul-timing, Q8_0 1024 × 3072 streamed at 32 rows: 0.25 → 0.21 ms; Q4_K,
// bound by its unpacking, unchanged). Every output still gets panelRows' operations in its order,
// so the same bits.
template <class S>
void panelRowPair(const S& p, const ActTiles& xt, int tt, int rows1, const float* mins, float* y, int N, int cols) {
  constexpr int kPerBlock = kQBlock / S::kGroupBytes;
  PairSums ps;
  __m512 acc[kToks];
  ps.clear(acc);
  const int groups = xt.nb * kPerBlock;
  Ahead ahead = tt == 0 ? p.ahead(groups) : Ahead();
  for (int g = 0; g <= groups + kLag; g++) {
    if (g < groups) {  // group g's two products, in C set g % 2 (4/5 or 6/7)
      ahead.next();
      const int at = (g % kPerBlock) * S::kGroupBytes;
      const int8_t* a0 = xt.tile(tt, g / kPerBlock) + at;
      const int8_t* a1 = xt.tile(tt + 1, g / kPerBlock) + at;
      const auto* b = p.b(g);
      if constexpr (S::kUnsigned) {
        if (g % 2 == 0) WEFT_PAIR_PRODUCT(_tile_dpbsud, 2, 4, 5, a0, a1, b);
        else WEFT_PAIR_PRODUCT(_tile_dpbsud, 3, 6, 7, a0, a1, b);
      } else {
        if (g % 2 == 0) WEFT_PAIR_PRODUCT(_tile_dpbssd, 2, 4, 5, a0, a1, b);
        else WEFT_PAIR_PRODUCT(_tile_dpbssd, 3, 6, 7, a0, a1, b);
      }
    }
    if (g >= 1 && g <= groups) ps.store(g - 1);
    const int s = g - 1 - kLag;
    if (s < 0) continue;
    const __m512 scale = p.scales(s);
    scaleGroup(ps.first(s), scale, xt.rowD(tt, s / kPerBlock), acc);
    ps.scaleSecond(s, scale, xt.rowD(tt + 1, s / kPerBlock));
  }
  finishRows(xt, tt, kToks, mins, acc, y, N, cols);
  ps.loadSecond(acc);
  finishRows(xt, tt + 1, rows1, mins, acc, y + static_cast<size_t>(kToks) * N, N, cols);
}

// Up to kToks rows × two panels (columns n and n + 16): the pair's products share each group's
// A tile and are independent, as in panelRowPair (bench profile, Q8_0, B=16 at context 192, three
// alternating runs: 55.3 / 59.4 / 55.1 → 52.5 / 55.6 / 53.1 ms a step). Every output gets
// panelRows' operations in its order, so the same bits.
template <class S>
void panelColPair(const S& p0, const S& p1, const ActTiles& xt, int rows, float* y, int N, int cols1) {
  constexpr int kPerBlock = kQBlock / S::kGroupBytes;
  PairSums ps;
  __m512 acc[kToks];
  ps.clear(acc);
  const int groups = xt.nb * kPerBlock;
  Ahead ahead0 = p0.ahead(groups), ahead1 = p1.ahead(groups);
  for (int g = 0; g <= groups + kLag; g++) {
    if (g < groups) {  // group g's two products: A in tile g % 2, B 2 and 3, C set g % 2 (4/5 or 6/7)
      ahead0.next();
      ahead1.next();
      const int8_t* a = xt.tile(0, g / kPerBlock) + (g % kPerBlock) * S::kGroupBytes;
      if (g % 2 == 0) WEFT_COL_PAIR_PRODUCT(0, 4, 5, a, p0.b(g), p1.b(g));
      else WEFT_COL_PAIR_PRODUCT(1, 6, 7, a, p0.b(g), p1.b(g));
    }
    if (g >= 1 && g <= groups) ps.store(g - 1);
    const int s = g - 1 - kLag;
    if (s < 0) continue;
    const float* d = xt.rowD(0, s / kPerBlock);
    scaleGroup(ps.first(s), p0.scales(s), d, acc);
    ps.scaleSecond(s, p1.scales(s), d);
  }
  finishRows(xt, 0, rows, nullptr, acc, y, N, kCols);
  ps.loadSecond(acc);
  finishRows(xt, 0, rows, nullptr, acc, y + kCols, N, cols1);
}

// Every token tile of the step against one panel.
void tileRows(DType d, const Panel& p, const ActTiles& xt, int T, float* y, int N, int cols) {
  static thread_local KPanel k;
  const auto each = [&](const auto& src, const float* mins) {
    for (int tt = 0; tt * kToks < T;) {
      float* yt = y + static_cast<size_t>(tt) * kToks * N;
      const int rows = T - tt * kToks;
      if (rows > kToks) {
        panelRowPair(src, xt, tt, std::min(kToks, rows - kToks), mins, yt, N, cols);
        tt += 2;
      } else {
        panelRows(src, xt, tt, rows, mins, yt, N, cols);
        tt++;
      }
    }
  };
  // The unpacking first: it sizes k.min, which the mins pointer is taken from after it.
  const auto eachUnpacked = [&](auto src, bool mins) { each(src, mins ? k.min.data() : nullptr); };
  switch (d) {
    case DType::Q4_0: eachUnpacked(unpacked<DType::Q4_0>(p, xt.nb, k), false); break;
    case DType::Q4_1: eachUnpacked(unpacked<DType::Q4_1>(p, xt.nb, k), true); break;
    case DType::Q4_K: eachUnpacked(unpacked<DType::Q4_K>(p, xt.nb, k), true); break;
    case DType::Q5_K: eachUnpacked(unpacked<DType::Q5_K>(p, xt.nb, k), true); break;
    case DType::Q6_KW:
      q6Scales(p, xt.nb / kBlocksPerUnit<DType::Q6_KW>, k.scale);
      each(Q6Source{p, k.scale.data()}, nullptr);
      break;
    default: each(Q8Source{p}, nullptr); break;
  }
}

// The row count from which the tiles beat the lane kernel (matmulQuantPanels, the same bits): a
// tile product and its scaling serve 16 rows whatever the step has, and the 4-, 5- and 6-bit
// types' panels are unpacked once per call for them. matmul-timing, 1024 × 3072 streamed, GB/s of
// weights, tiles / lanes: Q8_0 at 5 rows 24.2 / 23.8 and 8 rows 23.6 / 20.6; Q4_K at 12 rows
// 10.5 / 11.5 and 16 rows 9.7 / 9.0 (Q4_0, Q5_K and Q6_K alike). Q6_KW, read in place as Q8_0,
// ms a call: 5 rows 0.164 / 0.165, 6 rows 0.167 / 0.176, 12 rows 0.179 / 0.236.
int tileRowsFrom(DType d) { return d == DType::Q8_0 || d == DType::Q6_KW ? 5 : 13; }

}  // namespace

void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (T < tileRowsFrom(w.panelType)) return matmulQuantPanels(x, T, w, y, n0, n1);
  static thread_local ActTiles xt;
  repack(x, T, w.K / kQBlock, xt);
  asm volatile("" ::: "memory");  // the tile loads' asm does not tell the compiler it reads memory
  TileScope tiles;
  tiles.load(configFor(std::min(T, kToks), groupBytesOf(w.panelType)));
  int n = n0;
  // Panels read in place (Q8_0, Q6_KW) in pairs. The unpacked types measured no gain (matmul-timing,
  // 1024 × 3072 streamed at 16 rows, single / paired panels: Q4_K 0.176-0.180 / 0.190-0.196 ms, Q5_K
  // 0.214-0.216 / 0.223-0.229, and a Q4_K_M step at B=16 unchanged).
  if ((w.panelType == DType::Q8_0 || w.panelType == DType::Q6_KW) && T <= kToks)
    for (; n + kCols < n1; n += 2 * kCols) {
      const Panel p0 = panelOf(w, n, n1), p1 = panelOf(w, n + kCols, n1);
      const int cols1 = std::min(kCols, n1 - n - kCols);
      if (w.panelType == DType::Q8_0) {
        panelColPair(Q8Source{p0}, Q8Source{p1}, xt, T, y + n, w.N, cols1);
        continue;
      }
      static thread_local std::vector<float> s0, s1;
      q6Scales(p0, xt.nb / kBlocksPerUnit<DType::Q6_KW>, s0);
      q6Scales(p1, xt.nb / kBlocksPerUnit<DType::Q6_KW>, s1);
      panelColPair(Q6Source{p0, s0.data()}, Q6Source{p1, s1.data()}, xt, T, y + n, w.N, cols1);
    }
  for (; n < n1; n += kCols) tileRows(w.panelType, panelOf(w, n, n1), xt, T, y + n, w.N, std::min(kCols, n1 - n));
}

}  // namespace weft

#pragma GCC pop_options
