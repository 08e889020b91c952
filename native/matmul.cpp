#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include "ops.h"
#include "mlx_quant.h"
#include "quant.h"

namespace weft {

namespace {

// The shortest run a thread claims: long enough that its weight streams get going (a run's first
// tiles are demand misses).
constexpr size_t kMinRunBytes = size_t{128} << 10;

// Hands `units` (column groups, tiles or panels of about unitBytes of weights each) out to the
// OpenMP threads in runs, in order: a free thread claims the next max(shortest, remaining / (2 ×
// threads)) units. Runs start long (a weight stream each) and shrink toward the end, where a
// thread that fell behind, its core taken by another tenant on a shared host, is helped rather
// than waited for: on the 16-core AMX host 32-row matmuls streamed 63–69 GB/s with one fixed run a
// thread and 76–92 with claims (docs/PERFORMANCE.md, session 39). Each unit goes to one run(u0, u1)
// call, and the kernels reduce each output in one fixed order: results do not depend on who takes
// what. `rows` (T of them), when given, runs first in the same region (see RowPass).
template <class Run>
void claimRuns(int units, size_t unitBytes, Run run, const RowPass& rows = {}, int T = 0) {
  const int shortest = static_cast<int>(std::max<size_t>(1, kMinRunBytes / std::max<size_t>(1, unitBytes)));
  std::atomic<int> next{0};
#pragma omp parallel
  {
    rowPassInRegion(rows, T);
    const int nt = omp_get_num_threads();
    int at = next.load(std::memory_order_relaxed);
    while (at < units) {
      const int take = std::min(units - at, std::max(shortest, (units - at) / (2 * nt)));
      if (!next.compare_exchange_weak(at, at + take, std::memory_order_relaxed)) continue;  // `at` now holds the newer claim
      run(at, at + take);
      at = next.load(std::memory_order_relaxed);
    }
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

void rowPassInRegion(const RowPass& rows, int T) {
  if (!rows) return;
#pragma omp for
  for (int t = 0; t < T; t++) rows(t);
}

void matmulParallel(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch) {
  if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
  packActivations(x, T, w.K, w.Kp, k.chunk, w.dtype, scratch.data());
  matmulPacked(k, scratch.data(), T, w, y);
}

void matmulPacked(const Kernels& k, const float* xp, int T, const PackedMatrix& w, float* y) {
  claimRuns(w.Np / kPackCols, tensorBytes(w.dtype, kPackCols, w.Kp), [&](int g0, int g1) { k.matmul(xp, T, w, y, g0, g1); });
}

void matmulBf16(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<uint16_t>& scratch) {
  if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
  uint16_t* xp = scratch.data();
  matmulPackedBf16(k, xp, T, w, y, [&](int t) {
    packRowBf16(k, x + static_cast<size_t>(t) * w.K, w.K, w.Kp, xp + static_cast<size_t>(t) * w.Kp);
  });
}

namespace {

// Runs run(x, pass) with the rows as the set's bf16 matmul reads them: where it reads them widened,
// each row is widened in the row pass right after `rows` rounds it, by the thread that rounded
// it (once a matmul, not once a claim: 3-17 % of a 32- to 64-row matmul on the avx512 set).
template <class Run>
void withBf16Rows(const Kernels& k, const uint16_t* xp, int T, int Kp, const RowPass& rows, Run run) {
  if (!k.widensBf16Rows()) return run(Bf16Rows{xp, nullptr, 0}, rows);
  static thread_local std::vector<float> wide;  // the calling thread's; its workers write their rows
  const size_t ld = widenedRowStride(Kp);
  if (wide.size() < T * ld) wide.resize(T * ld);
  float* out = wide.data();
  run(Bf16Rows{xp, out, ld}, [&](int t) {
    if (rows) rows(t);
    widenBf16Row(xp + static_cast<size_t>(t) * Kp, Kp, out + t * ld);
  });
}

}  // namespace

void matmulPackedBf16(const Kernels& k, const uint16_t* xp, int T, const PackedMatrix& w, float* y, const RowPass& rows) {
  withBf16Rows(k, xp, T, w.Kp, rows, [&](const Bf16Rows& x, const RowPass& pass) {
    claimRuns(
        w.Np / kTileCols, tensorBytes(DType::BF16, kTileCols, w.Kp), [&](int g0, int g1) { k.matmulBf16(x, T, w, y, g0, g1); }, pass, T);
  });
}

void matmulPairsF32(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch) {
  if (w.K != w.Kp) {  // the rows in natural order (packActivations' layout for any dtype but BF16), zero padded
    if (scratch.size() < static_cast<size_t>(T) * w.Kp) scratch.resize(static_cast<size_t>(T) * w.Kp);
    packActivations(x, T, w.K, w.Kp, k.chunk, DType::F32, scratch.data());
    x = scratch.data();
  }
  claimRuns(w.Np / kTileCols, tensorBytes(DType::BF16, kTileCols, w.Kp), [&](int g0, int g1) { k.matmulPairsF32(x, T, w, y, g0, g1); });
}

void matmulQuantized(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y) {
  matmulQuantizedShared(k, x, T, {{&w, y}});
}

namespace {

// claimRuns over the units of several matrices taken in a row (one parallel region for all of
// them: on 16 cores a region's fork and join cost about as much as reading a small matrix such as
// k or v); run(p, a, b) gets each matrix's units [a, b) of a claimed run. Units may differ in
// bytes between the matrices (Q4_K_M's v is Q6_K): the claims even that out.
template <class Units, class Bytes, class Run>
void claimShares(const std::vector<MatrixProduct>& products, Units unitsOf, Bytes bytesOf, Run run, const RowPass& rows = {}, int T = 0) {
  int units = 0;
  size_t unitBytes = 0;
  for (const MatrixProduct& p : products) {
    units += static_cast<int>(unitsOf(*p.w));
    unitBytes = std::max<size_t>(unitBytes, bytesOf(*p.w));
  }
  claimRuns(units, unitBytes, [&](int a, int b) {
    int first = 0;  // the matrix's first unit in the row
    for (const MatrixProduct& p : products) {
      const int n = static_cast<int>(unitsOf(*p.w)), lo = std::max(a, first), hi = std::min(b, first + n);
      if (lo < hi) run(p, lo - first, hi - first);
      first += n;
    }
  }, rows, T);
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
  claimShares(
      products, [](const PackedMatrix& w) { return static_cast<uint64_t>((w.N + kQuantSplitCols - 1) / kQuantSplitCols); },
      [](const PackedMatrix& w) { return static_cast<uint64_t>(tensorBytes(w.dtype, kQuantSplitCols, w.K)); },
      [&](const MatrixProduct& p, int a, int b) {
        k.matmulQuant(xq[slot(*p.w)], T, *p.w, p.y, a * kQuantSplitCols, std::min(p.w->N, b * kQuantSplitCols));
      });
}

void matmulPackedBf16Shared(const Kernels& k, const uint16_t* xp, int T, const std::vector<MatrixProduct>& products, const RowPass& rows) {
  withBf16Rows(k, xp, T, products.front().w->Kp, rows, [&](const Bf16Rows& x, const RowPass& pass) {
    claimShares(
        products, [](const PackedMatrix& w) { return static_cast<uint64_t>(w.Np / kTileCols); },
        [](const PackedMatrix& w) { return static_cast<uint64_t>(w.Kp) * kTileCols * 2; },
        [&](const MatrixProduct& p, int g0, int g1) { k.matmulBf16(x, T, *p.w, p.y, g0, g1); }, pass, T);
  });
}

void matmulMlx(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y) {
  claimRuns((w.N + kMlxPanel - 1) / kMlxPanel, mlxWordBytes(w.dtype, kMlxPanel, w.K),
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
