// AMX-INT8 tiles for Q8_0 weights: the amx set's quantized matmul. The weight rows
// are the A tiles, read in place from the file's layout (16 output columns × one
// 32-input block: the tile load's stride skips each block's f16 scale), the int8
// activations the B tiles (one 4-byte column per activation row), so one TDPBSSD
// gives each (column, row) the exact int32 sum of its block. The other quantized
// types keep the VNNI lane kernel: their unpacking, not the dot, bounds them, and
// their scales (one per lane group in the unpacked panel) cost a gather per block here.
//
// The reduction order is the tiles' own, not quant.h's lane order: per output, for
// each block b in order, acc = fma(float(p_b), d_b · x_b.d, acc), with p_b the exact
// integer Σ w·x of the block. A tile computes each output from its own row and
// column, and every row count follows this order (steps of up to 4 rows take the same
// integer sums with vpdpbusd and the same fp32 operations), so the set is
// batch-invariant; it is not bit-identical to the other sets (see MatmulQuantFn).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>
#include "quant.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")
#include "amx_tiles.h"

namespace weft {
namespace {

constexpr int kCols = 16;  // output columns per panel: the rows of an A tile
constexpr int kToks = 16;  // activation rows per B tile: its 4-byte columns
constexpr int kQ8Bytes = 34;  // a Q8_0 block: f16 scale, 32 int8
// Weight rows are asked into L1 this many panels ahead, a share of the panel per block:
// 16 rows read a block at a time are short strided streams that the hardware
// prefetcher does not ramp up on (see kernels_quant_avx2.cpp).
constexpr int kPrefetchPanels = 4;

// Two sets of tiles, so that one block's products run while the other's are scaled:
// A 0/1 (16 columns × 32 int8), B 2/3 (8 rows × toks·4 bytes), C 4/5 (16 × toks int32).
TileConfig configFor(int toks) {
  TileConfig c;
  for (int i = 0; i < 2; i++) {
    c.set(i, kCols, kQBlock);
    c.set(2 + i, kQBlock / 4, 4 * toks);
    c.set(4 + i, kCols, 4 * toks);
  }
  return c;
}

// 16 Q8_0 rows (`rows`: the first's bytes) and what to prefetch while they run.
struct Panel {
  const uint8_t* rows;
  long rowBytes;
  __m512i rowOffsets;            // byte offset of each column's row
  const char* ahead = nullptr;   // the rows kPrefetchPanels panels on (contiguous), if any
  size_t aheadBytes = 0;

  const uint8_t* block(int b) const { return rows + static_cast<size_t>(b) * kQ8Bytes + 2; }
  // The 16 columns' scales of block b (one gather of each row's f16).
  __m512 scales(int b) const {
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(rowOffsets, rows + static_cast<size_t>(b) * kQ8Bytes, 1)));
  }
  // Block b of nb's share of the rows ahead.
  void prefetch(int b, int nb) const {
    if (!ahead) return;
    for (size_t at = aheadBytes * b / nb / 64 * 64; at < aheadBytes * (b + 1) / nb; at += 64) _mm_prefetch(ahead + at, _MM_HINT_T0);
  }
};

// Block sums into tiles C = A · B, stored at `c` (a macro: tile numbers are instruction operands).
#define WEFT_BLOCK_SUMS(A, B, C, aPtr, aStride, bPtr, c)      \
  do {                                                        \
    _tile_zero(C);                                            \
    _tile_loadd(A, aPtr, aStride);                            \
    _tile_loadd(B, bPtr, 64);                                 \
    _tile_dpbssd(C, A, B);                                    \
    _tile_stored(C, c, 64);                                   \
  } while (0)

// A block's sums are read back kLag blocks after they were stored: by then the tile
// store has left the store buffer, and the vector loads need not wait on it.
constexpr int kLag = 2, kSumBufs = kLag + 1;

// Activation rows repacked for B tiles: per tile of kToks rows and block b, 8 rows of
// kToks × 4 bytes (zero past the last row), and the rows' scales.
struct ActTiles {
  std::vector<int8_t> q;
  std::vector<float> d;
  int nb = 0;
  size_t at(int tt, int b) const { return static_cast<size_t>(tt) * nb + b; }  // (tile, block) in order
  const int8_t* tile(int tt, int b) const { return q.data() + at(tt, b) * (kQBlock / 4) * 64; }
  const float* rowD(int tt, int b) const { return d.data() + at(tt, b) * kToks; }
};

void repack(const QuantActBlock* x, int T, int nb, ActTiles& out) {
  const int tiles = (T + kToks - 1) / kToks;
  out.nb = nb;
  out.q.assign(static_cast<size_t>(tiles) * nb * (kQBlock / 4) * 64, 0);
  out.d.assign(static_cast<size_t>(tiles) * nb * kToks, 0.0f);
  for (int t = 0; t < T; t++)
    for (int b = 0; b < nb; b++) {
      const QuantActBlock& xb = x[static_cast<size_t>(t) * nb + b];
      const int tt = t / kToks, lane = t % kToks;
      int8_t* dst = out.q.data() + out.at(tt, b) * (kQBlock / 4) * 64 + 4 * lane;
      for (int k4 = 0; k4 < kQBlock / 4; k4++) std::memcpy(dst + 64 * k4, xb.q + 4 * k4, 4);
      out.d[out.at(tt, b) * kToks + lane] = xb.d;
    }
}

// Up to kToks activation rows: C holds a row of sums per column; each column's
// accumulator is a vector over the rows.
void panelRows(const Panel& p, const ActTiles& xt, int tt, int rows, float* y, int N, int cols) {
  alignas(64) int32_t sums[kSumBufs * kCols * kToks];
  alignas(64) float scale[kCols];
  __m512 acc[kCols];
  for (int j = 0; j < kCols; j++) acc[j] = _mm512_setzero_ps();
  const int nb = xt.nb;
  for (int b = 0; b < nb + kLag; b++) {
    if (b < nb) {
      p.prefetch(b, nb);
      int32_t* c = sums + (b % kSumBufs) * kCols * kToks;
      if (b % 2 == 0) WEFT_BLOCK_SUMS(0, 2, 4, p.block(b), p.rowBytes, xt.tile(tt, b), c);
      else WEFT_BLOCK_SUMS(1, 3, 5, p.block(b), p.rowBytes, xt.tile(tt, b), c);
    }
    if (b < kLag) continue;
    const int s = b - kLag;
    const int32_t* c = sums + (s % kSumBufs) * kCols * kToks;
    _mm512_store_ps(scale, p.scales(s));
    const __m512 d = _mm512_loadu_ps(xt.rowD(tt, s));
    for (int j = 0; j < kCols; j++)
      acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + kToks * j)), _mm512_mul_ps(_mm512_set1_ps(scale[j]), d), acc[j]);
  }
  alignas(64) float out[kToks];
  for (int j = 0; j < cols; j++) {
    _mm512_store_ps(out, acc[j]);
    for (int r = 0; r < rows; r++) y[static_cast<size_t>(r) * N + j] = out[r];
  }
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

// Up to kVecRows activation rows (row r's blocks at x + r·nb; y: row stride N), with
// AVX512-VNNI rather than tiles: per block the same exact integer sums (vpdpbusd on w + 128,
// started at −128·Σx per lane) and then panelRows' fp32 operations in its order, so the
// same bits. With this few rows a block's tile work is shared by too few of them, and tile
// loads of 16 strided rows stream slower than these vector loads.
constexpr int kVecRows = 4;

template <int R>
void fewRows(const Panel& p, const QuantActBlock* x, int nb, float* y, int N, int cols) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[R];
  for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
  for (int b = 0; b < nb; b++) {
    p.prefetch(b, nb);
    const uint8_t* q = p.block(b);
    __m512i w[8];
    for (int v = 0; v < 8; v++) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.rowBytes * 2 * v));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + p.rowBytes * (2 * v + 1)));
      w[v] = _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), flip);
    }
    const __m512 scale = p.scales(b);
    for (int r = 0; r < R; r++) {
      const QuantActBlock& xb = x[static_cast<size_t>(r) * nb + b];
      const __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q)));
      const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, xv));
      __m512i d[8];
      for (int v = 0; v < 8; v++) d[v] = _mm512_dpbusd_epi32(start, w[v], xv);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(columnSums(d)), _mm512_mul_ps(scale, _mm512_set1_ps(xb.d)), acc[r]);
    }
  }
  for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * N, static_cast<__mmask16>((1u << cols) - 1), acc[r]);
}

void vecRows(const Panel& p, const QuantActBlock* x, int T, int nb, float* y, int N, int cols) {
  switch (T) {
    case 1: fewRows<1>(p, x, nb, y, N, cols); break;
    case 2: fewRows<2>(p, x, nb, y, N, cols); break;
    case 3: fewRows<3>(p, x, nb, y, N, cols); break;
    case 4: fewRows<4>(p, x, nb, y, N, cols); break;
    default: break;
  }
}

}  // namespace

void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  if (w.dtype != DType::Q8_0) {
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
    tiles->load(configFor(std::min(T, kToks)));
  }
  const __m512i rowOffsets = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32(static_cast<int>(rowBytes)));
  for (int n = n0; n < n1; n += kCols) {
    const int cols = std::min(kCols, n1 - n);
    Panel p{static_cast<const uint8_t*>(w.data) + rowBytes * n, static_cast<long>(rowBytes), rowOffsets};
    if (cols < kCols) {
      tail.assign(rowBytes * kCols, 0);
      std::memcpy(tail.data(), p.rows, rowBytes * cols);
      p.rows = tail.data();
      asm volatile("" ::: "memory");
    } else if (n + (kPrefetchPanels + 1) * kCols <= n1) {
      p.ahead = reinterpret_cast<const char*>(p.rows + rowBytes * kPrefetchPanels * kCols);
      p.aheadBytes = rowBytes * kCols;
    }
    if (T <= kVecRows) {
      vecRows(p, x, T, nb, y + n, w.N, cols);
      continue;
    }
    for (int tt = 0; tt * kToks < T; tt++)
      panelRows(p, xt, tt, std::min(kToks, T - tt * kToks), y + static_cast<size_t>(tt) * kToks * w.N + n, w.N, cols);
  }
}

}  // namespace weft

#pragma GCC pop_options
