// AMX-INT8 tiles for block-quantized weights: the amx set's quantized matmul, for
// every row count. The weights are the A tiles (16 output columns × one scale
// group), the int8 activations the B tiles (one column per activation row), so one
// TDPBSSD gives each (column, row) the exact int32 sum of its group, and Q8_0 rows
// are read in place from the file's layout (a strided tile load skips the scales).
//
// The reduction order is the tiles' own, not quant.h's lane order: per output,
// for each scale group g in order (32 inputs; 16 for Q6_K, whose scales cover 16),
//   acc = fma(float(p_g), d_g · x.d, acc), then for the types with a min acc = fma(m_g, x.s, acc),
// with p_g the exact integer Σ w·x of the group. It is fixed per output whatever
// the row count, and a TDPBSSD computes each output from its own row and column
// alone, so the set is batch-invariant; it is not bit-identical to the other sets
// (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
#include "amx_tiles.h"

namespace weft {
namespace {

constexpr int kCols = 16;  // output columns per panel: the rows of an A tile
constexpr int kToks = 16;  // activation rows per B tile: its 4-byte columns
// Q8_0 rows read in place are asked into cache this many panels ahead, a share of the
// panel per group: 16 rows read a block at a time are short strided streams that the
// hardware prefetcher does not ramp up on (see kernels_quant_avx2.cpp).
constexpr int kPrefetchPanels = 4;

// Two sets of tiles, so that one group's products run while the other's are scaled:
// A 0/1 (16 columns × G int8), B 2/3 (G/4 rows × toks·4 bytes), C 4/5 (16 × toks int32).
TileConfig configFor(int group, int toks) {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, kCols, group);
    c.set(2 + i, group / 4, 4 * toks);
    c.set(4 + i, kCols, 4 * toks);
  }
  return c;
}

// Where a panel's weights come from: Q8_0 rows in place, or rows unpacked (quant.h's
// UnpackedRow, step kCols) into a zero-padded panel.
struct WeightPanel {
  const uint8_t* a;    // group 0's first byte of column 0
  long stride;         // bytes between columns
  int blockBytes;      // bytes from one 32-input block to the next, per column
  const float* dv;     // unpacked: lane scales; null when in place (Q8_0: f16 scales before each block)
  const float* m;      // unpacked: mins per block, kCols per block
  __m512i rowOffsets;  // in place: byte offset of each column's row
  const char* ahead = nullptr;  // the rows to ask into cache while this panel runs (contiguous)
  size_t aheadBytes = 0;
};

// Step g of n's share of the rows ahead (WeightPanel::ahead).
inline void prefetchShare(const WeightPanel& p, int g, int n) {
  if (!p.ahead) return;
  for (size_t at = p.aheadBytes * g / n / 64 * 64; at < p.aheadBytes * (g + 1) / n; at += 64) _mm_prefetch(p.ahead + at, _MM_HINT_T0);
}

// Group g: its A tile origin, and its 16 column scales and mins.
inline const uint8_t* groupA(const WeightPanel& p, int g, int perBlock) {
  return p.a + static_cast<size_t>(g / perBlock) * p.blockBytes + (g % perBlock) * (kQBlock / perBlock);
}

struct Scales {
  __m512 scale, min;
};

inline Scales scalesOf(const WeightPanel& p, int g, int perBlock, bool mins) {
  const int b = g / perBlock, h = g % perBlock;
  if (!p.dv) {  // Q8_0 in place: each column's f16 scale sits 2 bytes before its block's int8 values
    const __m512i h4 = _mm512_i32gather_epi32(p.rowOffsets, p.a + static_cast<size_t>(b) * p.blockBytes - 2, 1);
    return {_mm512_cvtph_ps(_mm512_cvtepi32_epi16(h4)), _mm512_setzero_ps()};
  }
  const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(8));
  const __m512 scale = _mm512_i32gather_ps(lanes, p.dv + static_cast<size_t>(8 * kCols) * b + 4 * h, 4);  // lane 4h: the group's scale
  return {scale, mins ? _mm512_loadu_ps(p.m + static_cast<size_t>(kCols) * b) : _mm512_setzero_ps()};
}

// Group sums into tiles C = A · B, stored at `c` (a macro: tile numbers are instruction operands).
#define WEFT_GROUP_SUMS(A, B, C, aPtr, aStride, bPtr, bStride, c, cStride) \
  do {                                                                    \
    _tile_zero(C);                                                        \
    _tile_loadd(A, aPtr, aStride);                                        \
    _tile_loadd(B, bPtr, bStride);                                        \
    _tile_dpbssd(C, A, B);                                                \
    _tile_stored(C, c, cStride);                                          \
  } while (0)

// A group's sums are read back kLag groups after they were stored: by then the tile
// store has left the store buffer, and the vector loads need not wait on it.
constexpr int kLag = 2, kSumBufs = kLag + 1;

// For each group g in order: its sums into sums[g % kSumBufs] (cInts ints apart, rows
// cStride bytes apart; the two tile sets alternate), then scale(g, its sums) kLag groups later.
template <class BOf, class Scale>
inline void groupPipeline(const WeightPanel& p, int groups, int perBlock, BOf bOf, long bStride, int32_t* sums, int cInts, long cStride, Scale scale) {
  for (int g = 0; g < groups + kLag; g++) {
    if (g < groups) prefetchShare(p, g, groups);
    if (g < groups) {
      int32_t* c = sums + (g % kSumBufs) * cInts;
      if (g % 2 == 0) WEFT_GROUP_SUMS(0, 2, 4, groupA(p, g, perBlock), p.stride, bOf(g), bStride, c, cStride);
      else WEFT_GROUP_SUMS(1, 3, 5, groupA(p, g, perBlock), p.stride, bOf(g), bStride, c, cStride);
    }
    if (g >= kLag) scale(g - kLag, sums + ((g - kLag) % kSumBufs) * cInts);
  }
}

// One activation row: C is one column of 16 sums, stored contiguously; the accumulator
// is a vector over the panel's columns.
void panelOneRow(const WeightPanel& p, const QuantActBlock* x, int groups, int perBlock, bool mins, float* y, int cols) {
  const int G = kQBlock / perBlock;
  alignas(64) int32_t sums[kSumBufs * kCols];
  __m512 acc = _mm512_setzero_ps();
  const auto bOf = [&](int g) { return x[g / perBlock].q + (g % perBlock) * G; };
  groupPipeline(p, groups, perBlock, bOf, 4, sums, kCols, 4, [&](int g, const int32_t* c) {
    const QuantActBlock& xb = x[g / perBlock];
    const Scales sc = scalesOf(p, g, perBlock, mins);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c)), _mm512_mul_ps(sc.scale, _mm512_set1_ps(xb.d)), acc);
    if (mins) acc = _mm512_fmadd_ps(sc.min, _mm512_set1_ps(xb.s), acc);
  });
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << cols) - 1), acc);
}

// The 16 exact lane sums' totals of 8 vectors, vector v holding columns 2v and 2v + 1
// (8 int32 lanes each), in column order.
inline __m512i columnSums(const __m512i* d) {
  __m512i e[4], f[2];
  for (int i = 0; i < 4; i++) e[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(d[2 * i], d[2 * i + 1]), _mm512_unpackhi_epi32(d[2 * i], d[2 * i + 1]));
  for (int i = 0; i < 2; i++) f[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(e[2 * i], e[2 * i + 1]), _mm512_unpackhi_epi64(e[2 * i], e[2 * i + 1]));
  // f[i]'s 128-bit chunks: columns (0,2,4,6)+8i over lanes 0-3, then 4-7; (1,3,5,7)+8i likewise.
  const __m512i g = _mm512_add_epi32(_mm512_shuffle_i32x4(f[0], f[1], 0x88), _mm512_shuffle_i32x4(f[0], f[1], 0xDD));
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), g);
}

// One activation row against 16 Q8_0 rows read in place, with AVX512-VNNI rather than
// tiles: per block the same exact integer sums (vpdpbusd on w + 128, started at −128·Σx
// per lane) and then panelOneRow's fp32 operations in its order, so the same bits. A
// tile load gathers 16 strided rows per group, which streams the weights slower than
// plain vector loads do when one row has no other rows to share them with.
void q8OneRow(const WeightPanel& p, const QuantActBlock* x, int nb, float* y) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    prefetchShare(p, b, nb);
    const QuantActBlock& xb = x[b];
    const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q)));
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, xv));
    const uint8_t* q = p.a + static_cast<size_t>(b) * p.blockBytes;
    __m512i d[8];
    for (int v = 0; v < 8; v++) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.stride * 2 * v));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.stride * (2 * v + 1)));
      d[v] = _mm512_dpbusd_epi32(start, _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip), xv);
    }
    const Scales sc = scalesOf(p, b, 1, false);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(columnSums(d)), _mm512_mul_ps(sc.scale, _mm512_set1_ps(xb.d)), acc);
  }
  _mm512_storeu_ps(y, acc);
}

// Activation rows repacked for B tiles: per tile of kToks rows and group g, G/4 rows
// of kToks × 4 bytes (zero past the last row), and the rows' scales and sums.
struct ActTiles {
  std::vector<int8_t> q;
  std::vector<float> d, s;
  int groups = 0, G = 0;
  const int8_t* tile(int tt, int g) const { return q.data() + (static_cast<size_t>(tt) * groups + g) * (G / 4) * 64; }
  const float* rowD(int tt, int g) const { return d.data() + (static_cast<size_t>(tt) * groups + g) * kToks; }
  const float* rowS(int tt, int g) const { return s.data() + (static_cast<size_t>(tt) * groups + g) * kToks; }
};

void repack(const QuantActBlock* x, int T, int nb, int perBlock, ActTiles& out) {
  const int G = kQBlock / perBlock, tiles = (T + kToks - 1) / kToks;
  out.G = G;
  out.groups = nb * perBlock;
  out.q.assign(static_cast<size_t>(tiles) * out.groups * (G / 4) * 64, 0);
  out.d.assign(static_cast<size_t>(tiles) * out.groups * kToks, 0.0f);
  out.s.assign(out.d.size(), 0.0f);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < nb; b++) {
      const QuantActBlock& xb = x[static_cast<size_t>(t) * nb + b];
      for (int h = 0; h < perBlock; h++) {
        const int g = b * perBlock + h, tt = t / kToks, lane = t % kToks;
        int8_t* dst = const_cast<int8_t*>(out.tile(tt, g)) + 4 * lane;
        for (int k4 = 0; k4 < G / 4; k4++) std::memcpy(dst + 64 * k4, xb.q + h * G + 4 * k4, 4);
        out.d[(static_cast<size_t>(tt) * out.groups + g) * kToks + lane] = xb.d;
        out.s[(static_cast<size_t>(tt) * out.groups + g) * kToks + lane] = xb.s;
      }
    }
}

// Up to kToks activation rows: C holds a row of sums per column; each column's
// accumulator is a vector over the rows.
void panelRows(const WeightPanel& p, const ActTiles& xt, int tt, int rows, int perBlock, bool mins, float* y, int N, int cols) {
  alignas(64) int32_t sums[kSumBufs * kCols * kToks];
  alignas(64) float scale[kCols], minv[kCols];
  __m512 acc[kCols];
  for (int j = 0; j < kCols; j++) acc[j] = _mm512_setzero_ps();
  const auto bOf = [&](int g) { return xt.tile(tt, g); };
  groupPipeline(p, xt.groups, perBlock, bOf, 64, sums, kCols * kToks, 64, [&](int g, const int32_t* c) {
    const Scales sc = scalesOf(p, g, perBlock, mins);
    _mm512_store_ps(scale, sc.scale);
    _mm512_store_ps(minv, sc.min);
    const __m512 d = _mm512_loadu_ps(xt.rowD(tt, g)), s = _mm512_loadu_ps(xt.rowS(tt, g));
    for (int j = 0; j < kCols; j++) {
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kToks * j)), _mm512_mul_ps(_mm512_set1_ps(scale[j]), d), acc[j]);
      if (mins) acc[j] = _mm512_fmadd_ps(_mm512_set1_ps(minv[j]), s, acc[j]);
    }
  });
  alignas(64) float out[kToks];
  for (int j = 0; j < cols; j++) {
    _mm512_store_ps(out, acc[j]);
    for (int r = 0; r < rows; r++) y[static_cast<size_t>(r) * N + j] = out[r];
  }
}

// Panel columns [n, n + cols) unpacked (scalar-equal AVX2 code), zeros past `cols`.
void unpackPanel(const PackedMatrix& w, size_t rowBytes, int n, int cols, int8_t* q, float* dv, float* m) {
  const int nb = w.K / kQBlock;
  for (int j = 0; j < kCols; j++) {
    const UnpackedRow r{q + kQBlock * j, dv + 8 * j, m + j, kCols};
    if (j < cols) {
      unpackRowAvx2(w.dtype, static_cast<const uint8_t*>(w.data) + rowBytes * (n + j), w.K, r);
      continue;
    }
    for (int b = 0; b < nb; b++) {
      std::memset(r.q + static_cast<size_t>(kQBlock) * kCols * b, 0, kQBlock);
      std::fill(r.dv + static_cast<size_t>(8) * kCols * b, r.dv + static_cast<size_t>(8) * kCols * b + 8, 0.0f);
      r.m[static_cast<size_t>(kCols) * b] = 0.0f;
    }
  }
}

}  // namespace

void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock, perBlock = w.dtype == DType::Q6_K ? 2 : 1, groups = nb * perBlock;
  const bool mins = quantHasMins(w.dtype);
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> dv, m;
  static thread_local ActTiles xt;
  q.resize(static_cast<size_t>(kCols) * w.K);
  dv.resize(static_cast<size_t>(kCols) * 8 * nb);
  m.resize(static_cast<size_t>(kCols) * nb);
  if (T > 1) repack(x, T, nb, perBlock, xt);
  asm volatile("" ::: "memory");  // the tile loads' asm does not tell the compiler it reads memory
  TileScope tiles;
  tiles.load(configFor(kQBlock / perBlock, T > 1 ? std::min(T, kToks) : 1));
  const __m512i rowOffsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32(static_cast<int>(rowBytes)));
  for (int n = n0; n < n1; n += kCols) {
    const int cols = std::min(kCols, n1 - n);
    WeightPanel p{};
    if (w.dtype == DType::Q8_0 && cols == kCols) {
      p = {static_cast<const uint8_t*>(w.data) + rowBytes * n + 2, static_cast<long>(rowBytes), 34, nullptr, nullptr, rowOffsets};
      if (n + (kPrefetchPanels + 1) * kCols <= n1) {
        p.ahead = static_cast<const char*>(w.data) + rowBytes * (n + kPrefetchPanels * kCols);
        p.aheadBytes = rowBytes * kCols;
      }
    } else {
      unpackPanel(w, rowBytes, n, cols, q.data(), dv.data(), m.data());
      p = {reinterpret_cast<const uint8_t*>(q.data()), kQBlock, kQBlock * kCols, dv.data(), m.data(), rowOffsets};
    }
    if (T == 1 && !p.dv) {
      q8OneRow(p, x, nb, y + n);
      continue;
    }
    if (T == 1) {
      panelOneRow(p, x, groups, perBlock, mins, y + n, cols);
      continue;
    }
    for (int tt = 0; tt * kToks < T; tt++)
      panelRows(p, xt, tt, std::min(kToks, T - tt * kToks), perBlock, mins, y + static_cast<size_t>(tt) * kToks * w.N + n, w.N, cols);
  }
}

}  // namespace weft

#pragma GCC pop_options
