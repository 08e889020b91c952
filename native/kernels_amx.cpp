// AMX-BF16 tiles: bfloat16 mode's matmul for every row count; every other loop
// is the AVX-512 set's. A TDPBF16PS computes each output row from that row of A
// alone, so a row's result does not depend on how many rows share its tile: the
// reduction order per output is tile order (see MatmulBf16Fn) whatever T is.
// One row (decode) also goes through the tiles rather than vdpbf16ps, whose
// pair order rounds differently: mixing them would make a row's logits depend
// on its batch size.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include "kernels.h"
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")
#include "amx_tiles.h"

namespace weft {
namespace {

// Tiles: C 0,1 (rows block 0 × column tiles 0,1), C 2,3 (rows block 1), A 4,5 (rows blocks), B 6,7 (column tiles).
TileConfig configFor(int m0, int m1) {
  TileConfig c;
  for (int t : {0, 1, 4}) c.set(t, m0, 64);
  for (int t : {2, 3, 5}) c.set(t, m1, 64);
  c.set(6, 16, 64);
  c.set(7, 16, 64);
  return c;
}

// Copies a C tile, stored to `buf` (16 × 16), into y at row t0 (m rows), column tile g.
inline void copyC(const float* buf, float* y, const PackedMatrix& w, int t0, int m, int g) {
  const int cols = std::min(kTileCols, w.N - g * kTileCols);
  float* out = y + static_cast<size_t>(t0) * w.N + g * kTileCols;
  for (int r = 0; r < m; r++) std::memcpy(out + static_cast<size_t>(r) * w.N, buf + r * kTileCols, cols * 4);
}

// Stores C tile `tile` (its configured rows: m) into y at row t0, column tile g: straight into y's
// rows, or through `buf` where the tile runs past the last column. The tile number is an
// instruction operand, hence a macro. Straight stores measured faster at 32 rows
// (`matmul-timing 32 1024 3072 bf16 64`, four alternating runs: 19.7–20.5 → 20.9–23.7 GB/s).
#define WEFT_STORE_C(tile, t0, m, g)                                                                   \
  do {                                                                                                 \
    if (((g) + 1) * kTileCols <= w.N) {                                                                \
      _tile_stored(tile, y + static_cast<size_t>(t0) * w.N + static_cast<size_t>(g) * kTileCols, w.N * 4); \
    } else {                                                                                           \
      _tile_stored(tile, buf, kTileCols * 4);                                                          \
      copyC(buf, y, w, t0, m, g);                                                                      \
    }                                                                                                  \
  } while (0)

constexpr int kPrefetchTiles = 4;

// Tile loads wait on memory: asks for the weights of Cols column tiles (tileStride elements
// apart) kPrefetchTiles tiles ahead of tile kb.
template <int Cols>
inline void prefetchAhead(const uint16_t* wg, int kb, int tiles, size_t tileStride) {
  if (kb + kPrefetchTiles >= tiles) return;
  const char* next = reinterpret_cast<const char*>(wg + static_cast<size_t>(kb + kPrefetchTiles) * kTileK * kTileCols);
  for (int line = 0; line < 1024; line += 64)
    for (int c = 0; c < Cols; c++) _mm_prefetch(next + tileStride * 2 * c + line, _MM_HINT_T0);
}

// Up to 32 rows × up to 2 column tiles, accumulated in tiles across the whole of K.
template <bool TwoRows, bool TwoCols>
inline void block(const uint16_t* xp, int t0, int m0, int m1, const PackedMatrix& w, int g, float* y) {
  const uint16_t* wg = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const size_t tileStride = static_cast<size_t>(w.Kp) * kTileCols, tileElems = kTileK * kTileCols;
  const long xStride = static_cast<long>(w.Kp) * 2;
  const uint16_t* x0 = xp + static_cast<size_t>(t0) * w.Kp;
  const uint16_t* x1 = x0 + static_cast<size_t>(16) * w.Kp;
  _tile_zero(0);
  if (TwoCols) _tile_zero(1);
  if (TwoRows) _tile_zero(2);
  if (TwoRows && TwoCols) _tile_zero(3);
  const int tiles = w.Kp / kTileK;
  for (int kb = 0; kb < tiles; kb++) {
    prefetchAhead<TwoCols ? 2 : 1>(wg, kb, tiles, tileStride);
    _tile_loadd(4, x0 + kb * kTileK, xStride);
    if (TwoRows) _tile_loadd(5, x1 + kb * kTileK, xStride);
    _tile_loadd(6, wg + kb * tileElems, 64);
    _tile_dpbf16ps(0, 4, 6);
    if (TwoRows) _tile_dpbf16ps(2, 5, 6);
    if (TwoCols) {
      _tile_loadd(7, wg + tileStride + kb * tileElems, 64);
      _tile_dpbf16ps(1, 4, 7);
      if (TwoRows) _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float buf[16 * kTileCols];
  WEFT_STORE_C(0, t0, m0, g);
  if (TwoCols) WEFT_STORE_C(1, t0, m0, g + 1);
  if (TwoRows) WEFT_STORE_C(2, t0 + 16, m1, g);
  if (TwoRows && TwoCols) WEFT_STORE_C(3, t0 + 16, m1, g + 1);
}

// Up to 16 rows × 4 column tiles: four weight streams in flight (one or two leave the memory
// system idle between a core's requests). C 0-3, A 4, B 5-7 (column 3 reuses B 5 after column 0's product).
TileConfig configFor4(int m) {
  TileConfig c;
  for (int t : {0, 1, 2, 3, 4}) c.set(t, m, 64);
  for (int t : {5, 6, 7}) c.set(t, 16, 64);
  return c;
}

inline void block4(const uint16_t* xp, int m, const PackedMatrix& w, int g, float* y) {
  const uint16_t* wg = static_cast<const uint16_t*>(w.data) + static_cast<size_t>(g) * w.Kp * kTileCols;
  const size_t tileStride = static_cast<size_t>(w.Kp) * kTileCols, tileElems = kTileK * kTileCols;
  const long xStride = static_cast<long>(w.Kp) * 2;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const int tiles = w.Kp / kTileK;
  for (int kb = 0; kb < tiles; kb++) {
    prefetchAhead<4>(wg, kb, tiles, tileStride);
    const uint16_t* wk = wg + kb * tileElems;
    _tile_loadd(4, xp + kb * kTileK, xStride);
    _tile_loadd(5, wk, 64);
    _tile_loadd(6, wk + tileStride, 64);
    _tile_loadd(7, wk + 2 * tileStride, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, wk + 3 * tileStride, 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float buf[16 * kTileCols];
  WEFT_STORE_C(0, 0, m, g);
  WEFT_STORE_C(1, 0, m, g + 1);
  WEFT_STORE_C(2, 0, m, g + 2);
  WEFT_STORE_C(3, 0, m, g + 3);
}

// Column tiles in fours (up to 16 rows) or pairs, outermost: their weights stay in L2 while every row passes.
void matmulBf16(const Bf16Rows& rows, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  const uint16_t* xp = rows.rounded;
  TileScope tiles;
  int c0 = -1, c1 = -1;
  if (T <= 16) {  // (more rows: two row tiles × two columns; 16-row passes over four columns measured no faster)
    tiles.load(configFor4(T));
    for (; g0 + 4 <= g1; g0 += 4) block4(xp, T, w, g0, y);
  }
  for (int g = g0; g < g1; g += 2) {
    const bool twoCols = g + 1 < g1;
    for (int t = 0; t < T; t += 32) {
      const int m0 = std::min(16, T - t), m1 = std::max(0, std::min(16, T - t - 16));
      if (m0 != c0 || m1 != c1) tiles.load(configFor(c0 = m0, c1 = m1));
      if (m1 > 0 && twoCols) block<true, true>(xp, t, m0, m1, w, g, y);
      else if (m1 > 0) block<true, false>(xp, t, m0, m1, w, g, y);
      else if (twoCols) block<false, true>(xp, t, m0, m1, w, g, y);
      else block<false, false>(xp, t, m0, m1, w, g, y);
    }
  }
}

}  // namespace

const Kernels& kernelsAmx() {
  static const Kernels k = [] {
    Kernels s = kernelsAvx512();
    s.name = "amx";
    s.matmulBf16 = matmulBf16;
    s.matmulQuant = matmulQuantAmx;
    s.bf16ByDefault = true;
    return s;
  }();
  return k;
}

}  // namespace weft

#pragma GCC pop_options
