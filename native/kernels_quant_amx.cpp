// AMX-INT8 tiles for block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): the amx
// set's quantized matmul, on the matrices it holds in VNNI panels (quant_panels.h). Per panel
// of 16 output columns and group of inputs (32; Q6_K: 16, one per scale), a B tile is the
// weights' VNNI rows (Q8_0's as they lie, the 4-, 5- and 6-bit types' unpacked to bytes once
// per panel), an A tile 16 activation rows' int8 quants, and one TDPBSSD/TDPBSUD gives each
// (row, column) the exact int32 sum of its group. Steps of up to 4 rows take the same sums with
// vpdpbusd: each VNNI row against the row's 4 inputs broadcast, one lane per column, so no
// lanes are summed across.
//
// The reduction order is the tiles' own, not quant.h's lane order: per output, for each
// group g in order, acc = fma(float(p_g), s_g · x.d, acc), with p_g the exact integer Σ w·x
// of the group, s_g its weight scale and x.d its activation block's scale; the min terms
// (Q4_1, Q4_K, Q5_K) go into a second chain, macc = fma(m_b, x_b.s, macc) per block b, and
// y = acc + macc. A tile computes each output from its own row and column, and every row count
// follows this order, so the set is batch-invariant; it is not bit-identical to the other sets
// (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>
#include "quant.h"
#include "quant_panels.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
#include "amx_tiles.h"
#include "kquant_blocks.h"

namespace weft {
namespace {

constexpr int kCols = kPanelCols;  // output columns per panel: a B tile's 4-byte columns
constexpr int kToks = 16;          // activation rows per A tile
// The inputs of one tile product: those sharing a weight scale (Q6_K: 16, the others 32).
constexpr int groupBytesOf(DType d) { return d == DType::Q6_K ? kQBlock / 2 : kQBlock; }
template <DType D>
constexpr int kGroupBytesOf = groupBytesOf(D);
template <DType D>
constexpr int kUnitBytes = D == DType::Q8_0   ? q8panel::kUnit
                           : D == DType::Q4_0 ? q40panel::kUnit
                           : D == DType::Q4_1 ? q41panel::kUnit
                           : D == DType::Q4_K ? q4kpanel::kUnit
                           : D == DType::Q5_K ? q5kpanel::kUnit
                                              : q6kpanel::kUnit;
// Unsigned values with a min term per block (the others are signed, or read with an offset).
template <DType D>
constexpr bool kHasMins = D == DType::Q4_1 || D == DType::Q4_K || D == DType::Q5_K;
// The offset a signed type's weights are read with as unsigned bytes by vpdpbusd (Q8_0 as
// w + 128; Q4_0's and Q6_K's stored values are w + 8 and w + 32): each sum then starts at
// minus the offset times its inputs' Σx.
constexpr int offsetOf(DType d) { return d == DType::Q8_0 ? 128 : d == DType::Q4_0 ? 8 : d == DType::Q6_K ? kQ6KBias : 0; }
template <DType D>
constexpr int kOffset = offsetOf(D);
// Q5_K's d, dmin and scale words lie as Q4_K's (decodeScales reads both the same way).
static_assert(q4kpanel::kD == q5kpanel::kD && q4kpanel::kDmin == q5kpanel::kDmin && q4kpanel::kScales == q5kpanel::kScales);
template <DType D>
constexpr int kBlocksPerUnit = D == DType::Q4_K || D == DType::Q5_K || D == DType::Q6_K ? 8 : 1;
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

// Two sets of tiles, so that one group's products run while the other's are scaled:
// A 0/1 (toks × a group's bytes), B 2/3 (bytes/4 VNNI rows), C 4/5 (toks × 16 int32).
TileConfig configFor(int toks, int groupBytes) {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, toks, groupBytes);
    c.set(2 + i, groupBytes / 4, kVnniRow);
    c.set(4 + i, toks, 4 * kCols);
  }
  return c;
}

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
// Q6_K: 16, of 16) and the min terms per block.
struct UnitScales {
  __m512 scale[16];
  __m512 min[8];
};

// d (Q8_0, Q4_0), d and m (Q4_1), d·sc and −dmin·m (Q4_K, Q5_K), d·sc (Q6_K): the values the
// lane kernels' unpacking and q4kScales / q6kScales give per column.
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

// VNNI row r (inputs 4r..4r+3) of block J of a unit, 16 columns: Q8_0's signed quants, the
// other types' unsigned stored values (4, 5 or 6 bits).
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
  } else {
    constexpr int n = J / 4, k = J % 4;  // the half, and the block within it
    const U8x64 l = U8x64(load64(u + q6kpanel::kQl + kVnniRow * (8 * (2 * n + k % 2) + r)));
    const U8x64 h = U8x64(load64(u + q6kpanel::kQh + kVnniRow * (8 * n + r)));
    return __m512i(q6kBits<k>(l, h));
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

// ---- steps of up to kVecRows rows: vpdpbusd, one lane per column ----

// With this few rows a group's tile work is shared by too few of them.
constexpr int kVecRows = 4;

// Σ of each activation block's quants by halves (row-major over blocks): the corrections
// for weights that the dot reads with an offset (kOffset).
void halfSums(const QuantActBlock* x, int T, int nb, std::vector<int32_t>& out) {
  out.resize(2 * static_cast<size_t>(T) * nb);
  for (size_t i = 0; i < static_cast<size_t>(T) * nb; i++)
    for (int h = 0; h < 2; h++) {
      int32_t s = 0;
      for (int j = 0; j < kQBlock / 2; j++) s += x[i].q[kQBlock / 2 * h + j];
      out[2 * i + h] = s;
    }
}

// Block J (block b of the matrix) of unit u for R rows: per group the exact sums, one lane per
// column (the chain started at minus the offset times Σx), then the fp32 operations above.
template <DType D, int J, int R>
__attribute__((always_inline)) inline void vecBlock(const uint8_t* u, const UnitScales& s, const QuantActBlock* x, const int32_t* hs, int nb, int b,
                                                    __m512 (&acc)[R], __m512 (&macc)[R]) {
  __m512i w[8];
  for (int r = 0; r < 8; r++) {
    w[r] = vnniRow<D, J>(u, r);
    if constexpr (D == DType::Q8_0) w[r] = _mm512_xor_si512(w[r], _mm512_set1_epi8(static_cast<char>(0x80)));  // w + 128: unsigned
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
    if constexpr (D == DType::Q6_K) {
      __m512i lo = _mm512_set1_epi32(-kOffset<D> * hs[2 * i]), hi = _mm512_set1_epi32(-kOffset<D> * hs[2 * i + 1]);
      for (int r = 0; r < 4; r++) lo = _mm512_dpbusd_epi32(lo, w[r], word(r));
      for (int r = 4; r < 8; r++) hi = _mm512_dpbusd_epi32(hi, w[r], word(r));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(s.scale[2 * J], xd), acc[t]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(s.scale[2 * J + 1], xd), acc[t]);
    } else {
      __m512i p = kOffset<D> ? _mm512_set1_epi32(-kOffset<D> * (hs[2 * i] + hs[2 * i + 1])) : _mm512_setzero_si512();
      for (int r = 0; r < 8; r++) p = _mm512_dpbusd_epi32(p, w[r], word(r));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(s.scale[J], xd), acc[t]);
      if constexpr (kHasMins<D>) macc[t] = _mm512_fmadd_ps(s.min[J], _mm512_set1_ps(xb.s), macc[t]);
    }
  }
}

// R activation rows (row t's blocks at x + t·nb; y: row stride N) × one panel's first `cols` columns.
template <DType D, int R>
void vecRows(const Panel& p, const QuantActBlock* x, const int32_t* hs, int nb, float* y, int N, int cols) {
  constexpr int perUnit = kBlocksPerUnit<D>;
  __m512 acc[R], macc[R];
  for (int t = 0; t < R; t++) acc[t] = macc[t] = _mm512_setzero_ps();
  eachUnit<D>(p, nb / perUnit, [&](int u, const uint8_t* unit, const UnitScales& s) {
    eachBlock<perUnit>([&](auto j) { vecBlock<D, decltype(j)::value, R>(unit, s, x, hs, nb, perUnit * u + decltype(j)::value, acc, macc); });
  });
  const __mmask16 written = static_cast<__mmask16>((1u << cols) - 1);
  for (int t = 0; t < R; t++)
    _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * N, written, kHasMins<D> ? _mm512_add_ps(acc[t], macc[t]) : acc[t]);
}

template <DType D>
void vecRowsOf(const Panel& p, const QuantActBlock* x, const int32_t* hs, int T, int nb, float* y, int N, int cols) {
  switch (T) {
    case 1: vecRows<D, 1>(p, x, hs, nb, y, N, cols); break;
    case 2: vecRows<D, 2>(p, x, hs, nb, y, N, cols); break;
    case 3: vecRows<D, 3>(p, x, hs, nb, y, N, cols); break;
    case 4: vecRows<D, 4>(p, x, hs, nb, y, N, cols); break;
    default: break;
  }
}

void vecRowsFor(DType d, const Panel& p, const QuantActBlock* x, const int32_t* hs, int T, int nb, float* y, int N, int cols) {
  switch (d) {
    case DType::Q4_0: vecRowsOf<DType::Q4_0>(p, x, hs, T, nb, y, N, cols); break;
    case DType::Q4_1: vecRowsOf<DType::Q4_1>(p, x, hs, T, nb, y, N, cols); break;
    case DType::Q4_K: vecRowsOf<DType::Q4_K>(p, x, hs, T, nb, y, N, cols); break;
    case DType::Q5_K: vecRowsOf<DType::Q5_K>(p, x, hs, T, nb, y, N, cols); break;
    case DType::Q6_K: vecRowsOf<DType::Q6_K>(p, x, hs, T, nb, y, N, cols); break;
    default: vecRowsOf<DType::Q8_0>(p, x, hs, T, nb, y, N, cols); break;
  }
}

// ---- more rows: AMX tiles ----

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

// A panel unpacked for the B tiles: block b's 8 VNNI rows at q + 512·b (Q4_0 and Q6_K as the
// signed weights, stored value − kOffset; Q6_K's two groups rows 0–3 and 4–7), scale[g] and
// min[b] as 16 floats each.
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

// An unpacked K-quant panel: the tile source of panelRows.
template <DType D>
struct KSource {
  static constexpr int kGroupBytes = kGroupBytesOf<D>;
  static constexpr bool kUnsigned = kHasMins<D>;
  static constexpr int kPerBlock = kQBlock / kGroupBytes;
  const KPanel& k;
  const int8_t* b(int g) const { return k.q.data() + static_cast<size_t>(g / kPerBlock) * 8 * kVnniRow + (g % kPerBlock) * (kGroupBytes / 4) * kVnniRow; }
  __m512 scales(int g) const { return _mm512_loadu_ps(k.scale.data() + static_cast<size_t>(g) * kCols); }
  Ahead ahead(int) const { return {}; }  // unpackPanel asked for the panels ahead
};

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
    if (s < 0) continue;
    const int32_t* c = sums + (s % kSumBufs) * kToks * kCols;
    const __m512 scale = p.scales(s);
    const float* d = xt.rowD(tt, s / kPerBlock);
#pragma GCC unroll 16
    for (int t = 0; t < kToks; t++)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kCols * t)), _mm512_mul_ps(scale, _mm512_set1_ps(d[t])), acc[t]);
  }
  if (mins) addMins(xt, tt, mins, acc);
  const __mmask16 written = static_cast<__mmask16>((1u << cols) - 1);
  // Constant indices only: one acc[t] with a run-time t would keep all sixteen in memory, and every
  // group's FMAs would then load and store them (in-cache Q8_0 at 16 rows: 15.3 → 13.3 ns a unit).
#pragma GCC unroll 16
  for (int t = 0; t < kToks; t++)
    if (t < rows) _mm512_mask_storeu_ps(y + static_cast<size_t>(t) * N, written, acc[t]);
}

// Every token tile of the step against one panel.
void tileRows(DType d, const Panel& p, const ActTiles& xt, int T, float* y, int N, int cols) {
  static thread_local KPanel k;
  const auto each = [&](const auto& src, const float* mins) {
    for (int tt = 0; tt * kToks < T; tt++)
      panelRows(src, xt, tt, std::min(kToks, T - tt * kToks), mins, y + static_cast<size_t>(tt) * kToks * N, N, cols);
  };
  switch (d) {
    case DType::Q4_0:
      unpackPanel<DType::Q4_0>(p, xt.nb, k);
      each(KSource<DType::Q4_0>{k}, nullptr);
      break;
    case DType::Q4_1:
      unpackPanel<DType::Q4_1>(p, xt.nb, k);
      each(KSource<DType::Q4_1>{k}, k.min.data());
      break;
    case DType::Q4_K:
      unpackPanel<DType::Q4_K>(p, xt.nb, k);
      each(KSource<DType::Q4_K>{k}, k.min.data());
      break;
    case DType::Q5_K:
      unpackPanel<DType::Q5_K>(p, xt.nb, k);
      each(KSource<DType::Q5_K>{k}, k.min.data());
      break;
    case DType::Q6_K:
      unpackPanel<DType::Q6_K>(p, xt.nb, k);
      each(KSource<DType::Q6_K>{k}, nullptr);
      break;
    default: each(Q8Source{p}, nullptr); break;
  }
}

}  // namespace

void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  const size_t panelBytes = tensorBytes(w.dtype, kCols, w.K);
  static thread_local ActTiles xt;
  static thread_local std::vector<int32_t> hs;
  std::optional<TileScope> tiles;  // steps of up to kVecRows rows use no tiles
  if (T > kVecRows) {
    repack(x, T, nb, xt);
    asm volatile("" ::: "memory");  // the tile loads' asm does not tell the compiler it reads memory
    tiles.emplace();
    tiles->load(configFor(std::min(T, kToks), groupBytesOf(w.dtype)));
  } else if (offsetOf(w.dtype) != 0) {
    halfSums(x, T, nb, hs);
  }
  for (int n = n0; n < n1; n += kCols) {
    Panel p{static_cast<const uint8_t*>(w.data) + panelBytes * (n / kCols)};
    if (n + (kPrefetchPanels + 1) * kCols <= n1) {
      p.ahead = reinterpret_cast<const char*>(p.at + panelBytes * kPrefetchPanels);
      p.aheadBytes = panelBytes;
    }
    const int cols = std::min(kCols, n1 - n);
    if (T <= kVecRows) vecRowsFor(w.dtype, p, x, hs.data(), T, nb, y + n, w.N, cols);
    else tileRows(w.dtype, p, xt, T, y + n, w.N, cols);
  }
}

}  // namespace weft

#pragma GCC pop_options
