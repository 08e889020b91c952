// AMX-INT8 tiles for Q8_0, Q4_K and Q6_K weights: the amx set's quantized matmul.
// A tile's rows are 16 output columns' weights for one group of inputs (32; Q6_K: 16,
// one per scale), the B tiles the int8 activations (one 4-byte column per activation
// row), so one TDPBSSD/TDPBUSD gives each (column, row) the exact int32 sum of its
// group. Q8_0 rows are read in place (the tile load's stride skips each block's f16
// scale); Q4_K and Q6_K panels are unpacked to bytes first, once for all the step's
// rows. The other quantized types keep the VNNI lane kernel.
//
// The reduction order is the tiles' own, not quant.h's lane order: per output, for
// each group g in order, acc = fma(float(p_g), s_g · x.d, acc), with p_g the exact
// integer Σ w·x of the group, s_g its weight scale and x.d its activation block's
// scale; Q4_K's min terms go into a second chain, macc = fma(m_b, x_b.s, macc) per
// block b, and y = acc + macc. A tile computes each output from its own row and
// column, and every row count follows this order (steps of up to 4 rows take the same
// integer sums with vpdpbusd and the same fp32 operations), so the set is
// batch-invariant; it is not bit-identical to the other sets (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
#include "amx_tiles.h"
#include "kquant_blocks.h"

namespace weft {
namespace {

constexpr int kCols = 16;  // output columns per panel: the rows of an A tile
constexpr int kToks = 16;  // activation rows per B tile: its 4-byte columns
constexpr int kQ8Bytes = 34;  // a Q8_0 block: f16 scale, 32 int8
// The inputs of one tile product: those sharing a weight scale (Q6_K: 16, the others 32).
template <DType D>
constexpr int kGroupBytesOf = D == DType::Q6_K ? kQBlock / 2 : kQBlock;
// Weight rows are asked into L2 this many panels ahead, a share of the panel per block:
// 16 rows read a block at a time are short strided streams that the hardware
// prefetcher does not ramp up on (see kernels_quant_avx2.cpp). Four panels of Q8_0 rows
// (68 KiB at K = 1024) are more than L1 holds: with L1 as the target, one-row Q8_0 steps
// took 12 % longer.
constexpr int kPrefetchPanels = 4;

using U32x16 = uint32_t __attribute__((vector_size(64)));

// Lane i holds i · stride: the offsets of 16 rows (or columns) `stride` apart, for gathers.
inline __m512i laneOffsets(int stride) {
  return _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(stride));
}

// Two sets of tiles, so that one group's products run while the other's are scaled:
// A 0/1 (16 columns × a group's bytes), B 2/3 (bytes/4 rows × toks·4 bytes), C 4/5 (16 × toks int32).
TileConfig configFor(int toks, int groupBytes) {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, kCols, groupBytes);
    c.set(2 + i, groupBytes / 4, 4 * toks);
    c.set(4 + i, kCols, 4 * toks);
  }
  return c;
}

// 16 weight rows as the file holds them (`rows`: the first's bytes) and what to prefetch while they run.
struct Rows {
  const uint8_t* rows;
  long rowBytes;
  __m512i rowOffsets;            // byte offset of each column's row
  const char* ahead = nullptr;   // the rows kPrefetchPanels panels on (contiguous), if any
  size_t aheadBytes = 0;

  const uint8_t* row(int c) const { return rows + rowBytes * c; }
  // The 16 rows' 32-bit words at byte `at` of each.
  __m512i words(size_t at) const { return _mm512_i32gather_epi32(rowOffsets, rows + at, 1); }
};

// The rows ahead asked into L2 in n equal parts, one per call of next(): a few lines at a
// time, spread over the work on the current rows.
struct Ahead {
  const char* at = nullptr;
  const char* end = nullptr;
  size_t lines = 0;  // per part
  Ahead() = default;
  Ahead(const Rows& p, int n) : at(p.ahead), end(p.ahead + p.aheadBytes), lines((p.aheadBytes / 64 + n) / n) {}
  void next() {
    for (size_t k = 0; k < lines && at < end; k++, at += 64) _mm_prefetch(at, _MM_HINT_T1);
  }
};

// The 16 f16 values at byte `at` (low half of each word) or at + 2 (high half).
inline __m512 f16s(__m512i words, bool high) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(high ? _mm512_srli_epi32(words, 16) : words)); }
// Byte k of each 32-bit word, unsigned or signed, as floats.
inline __m512 byteOf(U32x16 w, int k) { return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(__m512i(w), 8 * k), _mm512_set1_epi32(0xFF))); }
inline __m512 signedByteOf(__m512i w, int k) { return _mm512_cvtepi32_ps(_mm512_srai_epi32(_mm512_slli_epi32(w, 24 - 8 * k), 24)); }

// Q8_0 rows read in place: the tile source of panelRows.
struct Q8Panel {
  static constexpr int kGroupBytes = kGroupBytesOf<DType::Q8_0>;
  static constexpr bool kUnsigned = false;
  const Rows& p;
  const uint8_t* a(int b) const { return p.rows + static_cast<size_t>(b) * kQ8Bytes + 2; }
  long aStride() const { return p.rowBytes; }
  __m512 scales(int b) const { return f16s(p.words(static_cast<size_t>(b) * kQ8Bytes), false); }
  Ahead ahead(int nb) const { return Ahead(p, nb); }
};

// A K-quant superblock of the 16 rows, its scales decoded once: per group (Q4_K: 8 of 32
// inputs, Q6_K: 16 of 16) the 16 columns' scales, and Q4_K's min terms per block.
struct KScales {
  __m512 scale[16];
  __m512 min[8];
};

template <DType D>
constexpr size_t kSuperBytes = D == DType::Q4_K ? kQ4KBytes : kQ6KBytes;
template <DType D>
constexpr int kGroupsPerSuper = 256 / kGroupBytesOf<D>;

// The superblock at byte `at` of every row: d·sc and −dmin·m (Q4_K), d·sc (Q6_K), the values
// q4kScales / q6kScales give per row.
template <DType D>
void decodeScales(const Rows& p, size_t at, KScales& s) {
  if constexpr (D == DType::Q4_K) {
    U32x16 sc03, sc47, mn03, mn47;
    q4kScaleWords(U32x16(p.words(at + kQ4KScales)), U32x16(p.words(at + kQ4KScales + 4)), U32x16(p.words(at + kQ4KScales + 8)), &sc03, &sc47, &mn03, &mn47);
    const __m512i dd = p.words(at);
    const __m512 d = f16s(dd, false), negMin = _mm512_xor_ps(f16s(dd, true), _mm512_set1_ps(-0.0f));
    for (int k = 0; k < 4; k++) {
      s.scale[k] = _mm512_mul_ps(d, byteOf(sc03, k));
      s.scale[4 + k] = _mm512_mul_ps(d, byteOf(sc47, k));
      s.min[k] = _mm512_mul_ps(negMin, byteOf(mn03, k));
      s.min[4 + k] = _mm512_mul_ps(negMin, byteOf(mn47, k));
    }
  } else {
    const __m512 d = f16s(p.words(at + kQ6KD - 2), true);  // the word ending at the superblock's end
    for (int i = 0; i < 4; i++) {
      const __m512i w = p.words(at + kQ6KScales + 4 * i);
      for (int k = 0; k < 4; k++) s.scale[4 * i + k] = _mm512_mul_ps(d, signedByteOf(w, k));
    }
  }
}

// Block J of the superblock at byte `at`, vector v holding columns 2v and 2v + 1 (32 bytes
// each): Q4_K's 4-bit and Q6_K's unsigned 6-bit values.
template <DType D, int J>
__attribute__((always_inline)) inline void decodeBlock(const Rows& p, size_t at, __m512i (&w)[8]) {
  const auto pair = [&](int v, size_t off) {
    return U8x64(_mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.row(2 * v) + off))),
                                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.row(2 * v + 1) + off)), 1));
  };
  for (int v = 0; v < 8; v++) {
    if constexpr (D == DType::Q4_K) w[v] = __m512i(q4kQuants<J % 2 == 1>(pair(v, at + kQ4KQuants + 32 * (J / 2))));
    else w[v] = __m512i(q6kBits<J % 4>(pair(v, at + 64 * (J / 4) + 32 * (J % 2)), pair(v, at + kQ6KHigh + 32 * (J / 4))));
  }
}

// f(std::integral_constant<int, J>()) for the blocks J = 0..7 of a superblock, in order:
// each block's index is known when compiled.
template <int J = 0, class F>
__attribute__((always_inline)) inline void eachBlock(F&& f) {
  if constexpr (J < 8) {
    f(std::integral_constant<int, J>());
    eachBlock<J + 1>(f);
  }
}

// f(sb, at, scales) for each superblock of the 16 rows (at: its byte offset in a row), its
// scales decoded, while the rows ahead are prefetched.
template <DType D, class F>
__attribute__((always_inline)) inline void eachSuperblock(const Rows& p, int nb, F&& f) {
  const int nsb = nb / 8;
  Ahead ahead(p, nsb);
  for (int sb = 0; sb < nsb; sb++) {
    ahead.next();
    const size_t at = kSuperBytes<D> * sb;
    KScales s;
    decodeScales<D>(p, at, s);
    f(sb, at, s);
  }
}

// A panel of 16 K-quant rows unpacked for the tiles: block b's quants at q + 512·b (column c's
// 32 bytes at 32c; Q6_K as signed q − kQ6KBias, its two groups the halves), scale[g] and min[b] as
// 16 floats each.
struct KPanel {
  std::vector<int8_t> q;
  std::vector<float> scale, min;
};

template <DType D>
void unpackPanel(const Rows& p, int nb, KPanel& out) {
  const int nsb = nb / 8;
  out.q.resize(static_cast<size_t>(nb) * kCols * kQBlock);
  out.scale.resize(static_cast<size_t>(nsb) * kGroupsPerSuper<D> * kCols);
  out.min.resize(static_cast<size_t>(nb) * kCols);
  eachSuperblock<D>(p, nb, [&](int sb, size_t at, const KScales& s) {
    for (int g = 0; g < kGroupsPerSuper<D>; g++) _mm512_storeu_ps(out.scale.data() + (static_cast<size_t>(sb) * kGroupsPerSuper<D> + g) * kCols, s.scale[g]);
    if (D == DType::Q4_K)
      for (int j = 0; j < 8; j++) _mm512_storeu_ps(out.min.data() + (8 * static_cast<size_t>(sb) + j) * kCols, s.min[j]);
    const auto block = [&](auto j) {
      constexpr int J = decltype(j)::value;
      __m512i w[8];
      decodeBlock<D, J>(p, at, w);
      int8_t* dst = out.q.data() + (8 * static_cast<size_t>(sb) + J) * kCols * kQBlock;
      for (int v = 0; v < 8; v++)
        _mm512_storeu_si512(dst + 64 * v, D == DType::Q6_K ? _mm512_sub_epi8(w[v], _mm512_set1_epi8(kQ6KBias)) : w[v]);
    };
    eachBlock(block);
  });
}

// An unpacked K-quant panel: the tile source of panelRows.
template <DType D>
struct KPanelSource {
  static constexpr int kGroupBytes = kGroupBytesOf<D>;
  static constexpr bool kUnsigned = D == DType::Q4_K;
  const KPanel& k;
  static constexpr int kPerBlock = kQBlock / kGroupBytes;
  const int8_t* a(int g) const { return k.q.data() + static_cast<size_t>(g / kPerBlock) * kCols * kQBlock + (g % kPerBlock) * kGroupBytes; }
  long aStride() const { return kQBlock; }
  __m512 scales(int g) const { return _mm512_loadu_ps(k.scale.data() + static_cast<size_t>(g) * kCols); }
  Ahead ahead(int) const { return {}; }  // unpackPanel asked for the rows ahead
};

// A group's products into tiles C = A · B (a macro: tile numbers are instruction operands).
// Its C is stored one group later, so that the store does not wait on the product.
#define WEFT_GROUP_PRODUCT(DP, A, B, C, aPtr, aStride, bPtr) \
  do {                                                         \
    _tile_zero(C);                                             \
    _tile_loadd(A, aPtr, aStride);                             \
    _tile_loadd(B, bPtr, 64);                                  \
    DP(C, A, B);                                               \
  } while (0)

// A group's sums are read back kLag groups after they were stored: by then the tile
// store has left the store buffer, and the vector loads need not wait on it.
constexpr int kLag = 2, kSumBufs = kLag + 1;

// Activation rows repacked for B tiles: per tile of kToks rows and block b, 8 rows of
// kToks × 4 bytes (zero past the last row), and the rows' scales d and s.
struct ActTiles {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  int nb = 0;
  size_t at(int tt, int b) const { return static_cast<size_t>(tt) * nb + b; }  // (tile, block) in order
  const int8_t* tile(int tt, int b) const { return q.data() + at(tt, b) * (kQBlock / 4) * 64; }
  const float* rowD(int tt, int b) const { return d.data() + at(tt, b) * kToks; }
  const float* rowS(int tt, int b) const { return s.data() + at(tt, b) * kToks; }
};

// Per tile and block, each of the 8 rows gathers one 4-byte word from each of the tile's rows
// (lanes past T read nothing and stay zero), as do d and s: every thread repacks the whole step,
// and word by word that was a fifth of a 32-row call's samples (`perf` on native/tools/matmul-timing).
void repack(const QuantActBlock* x, int T, int nb, ActTiles& out) {
  static_assert(sizeof(QuantActBlock) == 8 + kQBlock, "d, s, then the quants");
  const int tiles = (T + kToks - 1) / kToks;
  out.nb = nb;
  out.q.resize(static_cast<size_t>(tiles) * nb * (kQBlock / 4) * 64);
  out.d.resize(static_cast<size_t>(tiles) * nb * kToks);
  out.s.resize(static_cast<size_t>(tiles) * nb * kToks);
  const __m512i rowOffsets = laneOffsets(static_cast<int>(nb * sizeof(QuantActBlock)));
  for (int tt = 0; tt < tiles; tt++) {
    const int rows = std::min(kToks, T - tt * kToks);
    const __mmask16 live = static_cast<__mmask16>((1u << rows) - 1);
    for (int b = 0; b < nb; b++) {
      const char* first = reinterpret_cast<const char*>(x + static_cast<size_t>(tt) * kToks * nb + b);
      const auto gather = [&](int at) { return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, rowOffsets, first + at, 1); };
      int8_t* q = out.q.data() + out.at(tt, b) * (kQBlock / 4) * 64;
      for (int k4 = 0; k4 < kQBlock / 4; k4++) _mm512_storeu_si512(q + 64 * k4, gather(8 + 4 * k4));
      _mm512_storeu_si512(out.d.data() + out.at(tt, b) * kToks, gather(0));
      _mm512_storeu_si512(out.s.data() + out.at(tt, b) * kToks, gather(4));
    }
  }
}

// Q4_K's min chains (per output, macc = fma(m_b, x_b.s, macc) in block order), added to
// `out`: eight columns at a time, so that eight independent chains hide the FMA latency.
void addMins(const ActTiles& xt, int tt, const float* mins, float (&out)[kCols][kToks]) {
  for (int h = 0; h < kCols; h += 8) {
    __m512 macc[8];
    for (int i = 0; i < 8; i++) macc[i] = _mm512_setzero_ps();
    for (int b = 0; b < xt.nb; b++) {
      const __m512 xs = _mm512_loadu_ps(xt.rowS(tt, b));
#pragma GCC unroll 8
      for (int i = 0; i < 8; i++) macc[i] = _mm512_fmadd_ps(_mm512_set1_ps(mins[static_cast<size_t>(b) * kCols + h + i]), xs, macc[i]);
    }
    for (int i = 0; i < 8; i++) _mm512_store_ps(out[h + i], _mm512_add_ps(_mm512_load_ps(out[h + i]), macc[i]));
  }
}

// Up to kToks activation rows: C holds a row of sums per column; each column's
// accumulator is a vector over the rows. `mins` (Q4_K's, per block × 16 columns) or null.
template <class S>
void panelRows(const S& p, const ActTiles& xt, int tt, int rows, const float* mins, float* y, int N, int cols) {
  constexpr int kPerBlock = kQBlock / S::kGroupBytes;
  alignas(64) int32_t sums[kSumBufs * kCols * kToks];
  alignas(64) float scale[kCols];
  __m512 acc[kCols];
#pragma GCC unroll 16
  for (int j = 0; j < kCols; j++) acc[j] = _mm512_setzero_ps();
  const int groups = xt.nb * kPerBlock;
  Ahead ahead = tt == 0 ? p.ahead(groups) : Ahead();  // the first row tile brings the rows ahead
  for (int g = 0; g <= groups + kLag; g++) {
    if (g < groups) {  // group g's products, in tile set g % 2
      ahead.next();
      const int8_t* b = xt.tile(tt, g / kPerBlock) + (g % kPerBlock) * (S::kGroupBytes / 4) * 64;
      if constexpr (S::kUnsigned) {
        if (g % 2 == 0) WEFT_GROUP_PRODUCT(_tile_dpbusd, 0, 2, 4, p.a(g), p.aStride(), b);
        else WEFT_GROUP_PRODUCT(_tile_dpbusd, 1, 3, 5, p.a(g), p.aStride(), b);
      } else {
        if (g % 2 == 0) WEFT_GROUP_PRODUCT(_tile_dpbssd, 0, 2, 4, p.a(g), p.aStride(), b);
        else WEFT_GROUP_PRODUCT(_tile_dpbssd, 1, 3, 5, p.a(g), p.aStride(), b);
      }
    }
    if (g >= 1 && g <= groups) {  // group g − 1's sums, stored
      int32_t* c = sums + ((g - 1) % kSumBufs) * kCols * kToks;
      if ((g - 1) % 2 == 0) _tile_stored(4, c, 64);
      else _tile_stored(5, c, 64);
    }
    const int s = g - 1 - kLag;  // the group scaled now
    if (s < 0) continue;
    const int32_t* c = sums + (s % kSumBufs) * kCols * kToks;
    _mm512_store_ps(scale, p.scales(s));
    const __m512 d = _mm512_loadu_ps(xt.rowD(tt, s / kPerBlock));
#pragma GCC unroll 16
    for (int j = 0; j < kCols; j++)
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kToks * j)), _mm512_mul_ps(_mm512_set1_ps(scale[j]), d), acc[j]);
  }
  alignas(64) float out[kCols][kToks];
#pragma GCC unroll 16
  for (int j = 0; j < kCols; j++) _mm512_store_ps(out[j], acc[j]);
  if (mins) addMins(xt, tt, mins, out);
  // Row r's 16 outputs gathered from the columns and stored as one vector: element by element,
  // the stores (each row's line rows apart, every line written 16 times) took half the kernel's time.
  const __m512i column = laneOffsets(kToks);
  const __mmask16 written = static_cast<__mmask16>((1u << cols) - 1);
  for (int r = 0; r < rows; r++)
    _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * N, written, _mm512_i32gather_ps(column, &out[0][r], 4));
}

// The exact totals of 8 vectors' lanes, vector v holding columns 2v and 2v + 1 (8 int32
// lanes each), in column order.
inline __m512i columnSums(const __m512i* d) {
  __m512i e[4], f[2];
  for (int i = 0; i < 4; i++) e[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_epi32(d[2 * i], d[2 * i + 1]));
  for (int i = 0; i < 2; i++) f[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(e[2 * i], e[2 * i + 1]), _mm512_unpackhi_epi64(e[2 * i], e[2 * i + 1]));
  // f[i]'s 128-bit chunks: columns (0,2,4,6)+8i over lanes 0-3, then 4-7; (1,3,5,7)+8i likewise.
  const __m512i g = _mm512_add_epi32(_mm512_shuffle_i32x4(f[0], f[1], 0x88), _mm512_shuffle_i32x4(f[0], f[1], 0xDD));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), g);
}

// The same for Q6_K's 16-input groups: each 128-bit chunk of d[v] is one (column, group)
// sum (columns 2v, 2v + 1 × groups 0, 1); lo gets group 0's sums, hi group 1's, in column order.
inline void groupSums(const __m512i* d, __m512i* lo, __m512i* hi) {
  __m512i u[2];
  for (int h = 0; h < 2; h++) {  // columns 8h..8h+7: chunk k lane i = chunk k of d[4h + i]
    const __m512i* e = d + 4 * h;
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(e[0], e[1]), _mm512_unpackhi_epi32(e[0], e[1]));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(e[2], e[3]), _mm512_unpackhi_epi32(e[2], e[3]));
    u[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
  }
  // u[h] chunk 0: group 0 of columns 8h + (0,2,4,6); chunk 1: their group 1; chunks 2, 3: columns 8h + (1,3,5,7).
  *lo = _mm512_permutex2var_epi32(u[0], _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27), u[1]);
  *hi = _mm512_permutex2var_epi32(u[0], _mm512_setr_epi32(4, 12, 5, 13, 6, 14, 7, 15, 20, 28, 21, 29, 22, 30, 23, 31), u[1]);
}

// Up to kVecRows activation rows (row r's blocks at x + r·nb; y: row stride N), with
// AVX512-VNNI rather than tiles: per group the same exact integer sums (vpdpbusd on
// unsigned weights; signed ones as w + 128, or Q6_K's as w + kQ6KBias, the chain started at
// minus that times Σx per lane) and then panelRows' fp32 operations in its order, so the
// same bits. With this few rows a group's tile work is shared by too few of them, and tile
// loads of 16 strided rows stream slower than these vector loads.
constexpr int kVecRows = 4;

inline __m512i chainStart(__m512i xv, char offset) {
  const __m512i zero = _mm512_setzero_si512();
  return _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(offset), xv));
}
inline __m512i broadcastBlock(const QuantActBlock& xb) { return _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q))); }

template <int R>
void fewRows(const Rows& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  const Q8Panel q8{p};
  Ahead ahead(p, nb);
  for (int b = 0; b < nb; b++) {
    ahead.next();
    const uint8_t* q = q8.a(b);
    __m512i w[8];
    for (int v = 0; v < 8; v++) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.rowBytes * 2 * v));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.rowBytes * (2 * v + 1)));
      w[v] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
    }
    const __m512 scale = q8.scales(b);
    for (int r = 0; r < R; r++) {
      const QuantActBlock& xb = x[static_cast<size_t>(r) * nb + b];
      const __m512i xv = broadcastBlock(xb);
      const __m512i start = chainStart(xv, static_cast<char>(0x80));
      __m512i d[8];
      for (int v = 0; v < 8; v++) d[v] = _mm512_dpbusd_epi32(start, w[v], xv);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(columnSums(d)), _mm512_mul_ps(scale, _mm512_set1_ps(xb.d)), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * N, static_cast<__mmask16>((1u << cols) - 1), acc[r]);
}

// Block J of a superblock (first block b0) for R rows, K-quants read in place.
template <DType D, int J, int R>
__attribute__((always_inline)) inline void fewRowsBlock(const Rows& p, size_t at, const KScales& s, const QuantActBlock* x, int nb, int b0,
                                                        __m512 (&acc)[R], __m512 (&macc)[R]) {
  __m512i w[8];
  decodeBlock<D, J>(p, at, w);
  for (int r = 0; r < R; r++) {
    const QuantActBlock& xb = x[static_cast<size_t>(r) * nb + b0 + J];
    const __m512i xv = broadcastBlock(xb);
    const __m512 xd = _mm512_set1_ps(xb.d);
    __m512i d[8];
    if constexpr (D == DType::Q4_K) {
      for (int v = 0; v < 8; v++) d[v] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[v], xv);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(columnSums(d)), _mm512_mul_ps(s.scale[J], xd), acc[r]);
      macc[r] = _mm512_fmadd_ps(s.min[J], _mm512_set1_ps(xb.s), macc[r]);
    } else {
      const __m512i start = chainStart(xv, kQ6KBias);
      for (int v = 0; v < 8; v++) d[v] = _mm512_dpbusd_epi32(start, w[v], xv);
      __m512i lo, hi;
      groupSums(d, &lo, &hi);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lo), _mm512_mul_ps(s.scale[2 * J], xd), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_mul_ps(s.scale[2 * J + 1], xd), acc[r]);
    }
  }
}

template <DType D, int R>
void fewRowsK(const Rows& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  __m512 acc[R], macc[R];
  for (int r = 0; r < R; r++) acc[r] = macc[r] = _mm512_setzero_ps();
  eachSuperblock<D>(p, nb, [&](int sb, size_t at, const KScales& s) {
    eachBlock([&](auto j) { fewRowsBlock<D, decltype(j)::value, R>(p, at, s, x, nb, 8 * sb, acc, macc); });
  });
  for (int r = 0; r < R; r++) {
    const __m512 total = D == DType::Q4_K ? _mm512_add_ps(acc[r], macc[r]) : acc[r];
    _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * N, static_cast<__mmask16>((1u << cols) - 1), total);
  }
}

template <int R>
void fewRowsOf(DType d, const Rows& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  switch (d) {
    case DType::Q4_K: fewRowsK<DType::Q4_K, R>(p, x, nb, y, N, cols); break;
    case DType::Q6_K: fewRowsK<DType::Q6_K, R>(p, x, nb, y, N, cols); break;
    default: fewRows<R>(p, x, nb, y, N, cols); break;
  }
}

void vecRows(DType d, const Rows& p, const QuantActBlock* x, int T, int nb, float* y, int N, int cols) {
  switch (T) {
    case 1: fewRowsOf<1>(d, p, x, nb, y, N, cols); break;
    case 2: fewRowsOf<2>(d, p, x, nb, y, N, cols); break;
    case 3: fewRowsOf<3>(d, p, x, nb, y, N, cols); break;
    case 4: fewRowsOf<4>(d, p, x, nb, y, N, cols); break;
    default: break;
  }
}

// Every token tile of the step against one panel of rows.
void tileRows(DType d, const Rows& p, const ActTiles& xt, int T, float* y, int N, int cols) {
  static thread_local KPanel k;
  const auto each = [&](const auto& src, const float* mins) {
    for (int tt = 0; tt * kToks < T; tt++)
      panelRows(src, xt, tt, std::min(kToks, T - tt * kToks), mins, y + static_cast<size_t>(tt) * kToks * N, N, cols);
  };
  switch (d) {
    case DType::Q4_K:
      unpackPanel<DType::Q4_K>(p, xt.nb, k);
      each(KPanelSource<DType::Q4_K>{k}, k.min.data());
      break;
    case DType::Q6_K:
      unpackPanel<DType::Q6_K>(p, xt.nb, k);
      each(KPanelSource<DType::Q6_K>{k}, nullptr);
      break;
    default: each(Q8Panel{p}, nullptr); break;
  }
}

bool onTiles(DType d) { return d == DType::Q8_0 || d == DType::Q4_K || d == DType::Q6_K; }
int groupBytes(DType d) {
  switch (d) {
    case DType::Q4_K: return kGroupBytesOf<DType::Q4_K>;
    case DType::Q6_K: return kGroupBytesOf<DType::Q6_K>;
    default: return kGroupBytesOf<DType::Q8_0>;
  }
}

}  // namespace

void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (!onTiles(w.dtype)) {
    (hasAvx512Vnni() ? matmulQuantVnni : matmulQuantAvx2)(x, T, w, y, n0, n1);
    return;
  }
  const int nb = w.K / kQBlock;
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  static thread_local ActTiles xt;
  static thread_local std::vector<uint8_t> tail;  // a last panel of fewer than 16 rows, zero-padded
  std::optional<TileScope> tiles;  // steps of up to kVecRows rows use no tiles
  if (T > kVecRows) {
    repack(x, T, nb, xt);
    asm volatile("" ::: "memory");  // the tile loads' asm does not tell the compiler it reads memory
    tiles.emplace();
    tiles->load(configFor(std::min(T, kToks), groupBytes(w.dtype)));
  }
  const __m512i rowOffsets = laneOffsets(static_cast<int>(rowBytes));
  for (int n = n0; n < n1; n += kCols) {
    const int cols = std::min(kCols, n1 - n);
    Rows p{static_cast<const uint8_t*>(w.data) + rowBytes * n, static_cast<long>(rowBytes), rowOffsets};
    if (cols < kCols) {
      tail.assign(rowBytes * kCols, 0);
      std::memcpy(tail.data(), p.rows, rowBytes * cols);
      p.rows = tail.data();
      asm volatile("" ::: "memory");
    } else if (n + (kPrefetchPanels + 1) * kCols <= n1) {
      p.ahead = reinterpret_cast<const char*>(p.rows + rowBytes * kPrefetchPanels * kCols);
      p.aheadBytes = rowBytes * kCols;
    }
    if (T <= kVecRows) vecRows(w.dtype, p, x, T, nb, y + n, w.N, cols);
    else tileRows(w.dtype, p, xt, T, y + n, w.N, cols);
  }
}

}  // namespace weft

#pragma GCC pop_options
