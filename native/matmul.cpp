#include <omp.h>
#include <algorithm>
#include <cstdint>
#include <cmath>
#include "ops.h"
#include "mlx_quant.h"
#include "quant.h"

namespace weft {

namespace {

// Splits `units` (column groups, tiles or panels) into one contiguous run per OpenMP
// thread and calls run(u0, u1) on each non-empty run: every output element is reduced
// by one thread in a fixed order, whatever the thread count.
template <class Run>
void perThreadRuns(int units, Run run) {
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), id = omp_get_thread_num();
    const int u0 = static_cast<int>(static_cast<long>(units) * id / nt);
    const int u1 = static_cast<int>(static_cast<long>(units) * (id + 1) / nt);
    if (u0 < u1) run(u0, u1);
  }
}

// 1 / √(mean(x²) + eps) of a row, the scale RMSNorm applies. Σ x² takes element i into lane
// i % 16, then folds the lanes in halves (8, 4, 2, 1): one fixed order whatever the row count or
// kernel set (this file is built for no ISA in particular, so no FMA contraction), and sixteen
// independent chains where one sum was a chain of n dependent adds (a quarter of a 32-row
// decode step's non-matmul time).
float inverseRms(const float* x, int n, float eps) {
  float lane[16] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) lane[j] += x[i + j] * x[i + j];
  for (; i < n; i++) lane[i % 16] += x[i] * x[i];
  for (int half = 8; half > 0; half /= 2)
    for (int j = 0; j < half; j++) lane[j] += lane[j + half];
  return 1.0f / std::sqrt(lane[0] / n + eps);
}

}  // namespace

void matmulParallel(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch) {
  if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
  packActivations(x, T, w.K, w.Kp, k.chunk, w.dtype, scratch.data());
  matmulPacked(k, scratch.data(), T, w, y);
}

void matmulPacked(const Kernels& k, const float* xp, int T, const PackedMatrix& w, float* y) {
  perThreadRuns(w.Np / kPackCols, [&](int g0, int g1) { k.matmul(xp, T, w, y, g0, g1); });
}

void matmulBf16(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<uint16_t>& scratch) {
  if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
  packActivationsBf16(k, x, T, w.K, w.Kp, scratch.data());
  matmulPackedBf16(k, scratch.data(), T, w, y);
}

void matmulPackedBf16(const Kernels& k, const uint16_t* xp, int T, const PackedMatrix& w, float* y) {
  perThreadRuns(w.Np / kTileCols, [&](int g0, int g1) { k.matmulBf16(xp, T, w, y, g0, g1); });
}

void matmulPairsF32(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch) {
  if (w.K != w.Kp) {  // the rows in natural order (packActivations' layout for any dtype but BF16), zero padded
    if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
    packActivations(x, T, w.K, w.Kp, k.chunk, DType::F32, scratch.data());
    x = scratch.data();
  }
  perThreadRuns(w.Np / kTileCols, [&](int g0, int g1) { k.matmulPairsF32(x, T, w, y, g0, g1); });
}

void matmulQuantized(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y) {
  matmulQuantizedShared(k, x, T, {{&w, y}});
}

namespace {

// Splits the units of several matrices, taken in a row, into one contiguous share of their bytes
// per OpenMP thread, and calls run(p, a, b) for each matrix's units [a, b) in the share: unit u of
// a matrix goes to the thread whose share holds the unit's first byte. By bytes, not count: where
// Q4_K_M's v is Q6_K (half as many bytes again per column as q/k's Q4_K), an even count left one
// thread about a quarter more to read. One parallel region for all the matrices: on 16 cores a
// region's fork and join cost about as much as reading a small matrix (k, v).
template <class Units, class Bytes, class Run>
void perThreadShares(const std::vector<MatrixProduct>& products, Units unitsOf, Bytes bytesOf, Run run) {
  uint64_t total = 0;
  for (const MatrixProduct& p : products) total += unitsOf(*p.w) * bytesOf(*p.w);
#pragma omp parallel
  {
    const uint64_t nt = static_cast<uint64_t>(omp_get_num_threads()), id = static_cast<uint64_t>(omp_get_thread_num());
    const uint64_t lo = total * id / nt, hi = total * (id + 1) / nt;
    uint64_t first = 0;  // the matrix's first byte in the row
    for (const MatrixProduct& p : products) {
      const uint64_t n = unitsOf(*p.w), c = bytesOf(*p.w);
      const auto unitAt = [&](uint64_t at) { return at <= first ? 0 : std::min(n, (at - first + c - 1) / c); };
      const uint64_t a = unitAt(lo), b = unitAt(hi);
      if (a < b) run(p, static_cast<int>(a), static_cast<int>(b));
      first += n * c;
    }
  }
}

}  // namespace

void matmulQuantizedShared(const Kernels& k, const float* x, int T, const std::vector<MatrixProduct>& products) {
  // The rows quantized once for each activation scale run the matrices ask for (32 or 256
  // inputs), into buffers grown to the largest step, per calling thread.
  static thread_local std::vector<QuantActBlock> acts[2];
  const int K = products.front().w->K;
  const size_t blocks = static_cast<size_t>(T) * (K / kQBlock);
  const auto slot = [](const PackedMatrix& w) { return actScaleBlocks(w.dtype) == 1 ? 0 : 1; };
  const QuantActBlock* xq[2] = {nullptr, nullptr};  // the workers' own `acts` are other objects
  for (const MatrixProduct& p : products) {
    const int i = slot(*p.w);
    if (xq[i]) continue;
    if (acts[i].size() < blocks) acts[i].resize(blocks);
    if (k.matmulQuant == matmulQuantScalar) quantizeActivations(x, T, K, actScaleBlocks(p.w->dtype), acts[i].data());  // the reference, also here
    else quantizeActivationsAvx2(x, T, K, actScaleBlocks(p.w->dtype), acts[i].data());
    xq[i] = acts[i].data();
  }
  // Units of kQuantSplitCols columns.
  perThreadShares(
      products, [](const PackedMatrix& w) { return static_cast<uint64_t>((w.N + kQuantSplitCols - 1) / kQuantSplitCols); },
      [](const PackedMatrix& w) { return static_cast<uint64_t>(tensorBytes(w.dtype, kQuantSplitCols, w.K)); },
      [&](const MatrixProduct& p, int a, int b) {
        k.matmulQuant(xq[slot(*p.w)], T, *p.w, p.y, a * kQuantSplitCols, std::min(p.w->N, b * kQuantSplitCols));
      });
}

void matmulPackedBf16Shared(const Kernels& k, const uint16_t* xp, int T, const std::vector<MatrixProduct>& products) {
  perThreadShares(
      products, [](const PackedMatrix& w) { return static_cast<uint64_t>(w.Np / kTileCols); },
      [](const PackedMatrix& w) { return static_cast<uint64_t>(w.Kp) * kTileCols * 2; },
      [&](const MatrixProduct& p, int g0, int g1) { k.matmulBf16(xp, T, *p.w, p.y, g0, g1); });
}

void matmulMlx(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y) {
  perThreadRuns((w.N + kMlxPanel - 1) / kMlxPanel,
                [&](int p0, int p1) { k.matmulMlx(x, T, w, y, p0 * kMlxPanel, std::min(w.N, p1 * kMlxPanel)); });
}

void rmsnormPacked(const float* x, const float* weight, int T, int n, float eps, const Kernels& k, const PackedMatrix& w, std::vector<float>& out) {
  if (out.size() < static_cast<size_t>(T) * w.Kp) out.resize(static_cast<size_t>(T) * w.Kp);
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++) {
    const float* xr = x + static_cast<size_t>(t) * n;
    float* o = out.data() + static_cast<size_t>(t) * w.Kp;
    const float inv = inverseRms(xr, n, eps);
    std::fill(o, o + w.Kp, 0.0f);
    for (int i = 0; i < n; i++) o[packedIndex(i, k.chunk, w.dtype)] = weight[i] * (xr[i] * inv);
  }
}

void rmsnormRow(const float* x, const float* weight, float* out, int n, float eps) {
  const float inv = inverseRms(x, n, eps);
  for (int i = 0; i < n; i++) out[i] = weight[i] * (x[i] * inv);
}

void rmsnorm(const float* x, const float* weight, float* out, int T, int n, float eps) {
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++) rmsnormRow(x + static_cast<size_t>(t) * n, weight, out + static_cast<size_t>(t) * n, n, eps);
}

void ropeRow(float* x, int heads, int hd, const float* cos, const float* sin) {
  const int half = hd / 2;
  for (int h = 0; h < heads; h++) {
    float* v = x + static_cast<size_t>(h) * hd;
    for (int i = 0; i < half; i++) {
      float a = v[i], b = v[i + half];
      v[i] = a * cos[i] - b * sin[i];
      v[i + half] = b * cos[i] + a * sin[i];
    }
  }
}

}  // namespace weft
