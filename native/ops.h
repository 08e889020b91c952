// The forward pass's primitives, one function each.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>
#include "kernels.h"
#include "weights.h"

namespace weft {

// Work on each of a step's rows that the next operation reads, done inside that operation's own
// parallel region before it: each row by one thread, then the region's barrier. On 16 cores a
// region's fork and join cost more than such a loop's work.
using RowPass = std::function<void(int row)>;
// Inside a parallel region: rows(t) for every t < T across its threads, then a barrier (none without rows).
void rowPassInRegion(const RowPass& rows, int T);

// y[T, w.N] = x[T, w.K] · wᵀ, split across threads by column groups.
// `scratch` holds the packed activations (grown as needed).
void matmulParallel(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch);

// y = xp · wᵀ for activations already in the kernel layout (see packActivations).
void matmulPacked(const Kernels& k, const float* xp, int T, const PackedMatrix& w, float* y);

// bfloat16 mode (w in pair tiles): the rows of x rounded to bf16 into `scratch`, then y = x · wᵀ
// (in one parallel region).
void matmulBf16(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<uint16_t>& scratch);

// y = xp · wᵀ for bf16 rows already rounded (see packRowBf16), split across threads by
// column tiles; `rows`, when given, writes xp's rows first in the same region.
void matmulPackedBf16(const Kernels& k, const uint16_t* xp, int T, const PackedMatrix& w, float* y, const RowPass& rows = {});
// The same for several bf16 matrices of one K that read the same rows (q/k/v, gate/up): all their
// column tiles split across the threads in one parallel region.
void matmulPackedBf16Shared(const Kernels& k, const uint16_t* xp, int T, const std::vector<MatrixProduct>& products, const RowPass& rows = {});

// float32 mode on pair tiles (k.matmulPairsF32): y = x · wᵀ, split across threads by column
// tiles; rows whose K is short of w.Kp are padded with zeros into `scratch` first.
void matmulPairsF32(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y, std::vector<float>& scratch);

// RMSNorm written straight into the kernel layout of matrices like `w`:
// normalizing and packing the activations in one pass (shared by q/k/v, gate/up).
void rmsnormPacked(const float* x, const float* weight, int T, int n, float eps, const Kernels& k, const PackedMatrix& w, std::vector<float>& out);

// out[T, n] = x * rsqrt(mean(x²) + eps) * weight, row by row (in place allowed); rmsnormRow is one
// row of it, for loops that do more to each row in the same pass.
void rmsnorm(const float* x, const float* weight, float* out, int T, int n, float eps);
void rmsnormRow(const float* x, const float* weight, float* out, int n, float eps);

// Rotates pairs (i, i + hd/2) of each of a row's heads (heads × hd) by the row's hd/2 angles.
void ropeRow(float* x, int heads, int hd, const float* cos, const float* sin);

// Causal attention of every query row over its own sequence's cached K/V,
// read through the block table.
struct AttentionArgs {
  const float* q;               // (T, heads, hd)
  float* out;                   // (T, heads, hd)
  const void* kCache;           // (numBlocks, kvHeads, hd, blockSize) of this layer: keys dimension-major
  const void* vCache;           // (numBlocks, kvHeads, blockSize, hd) of this layer: a head's values contiguous per block
  DType kvDtype;                // element of both pools: F32, or BF16/F16 widened by the kernels
  const int32_t* positions;     // (T)
  const int32_t* seqStarts;     // (B+1) rows of each sequence
  const int32_t* blockTables;   // (B, maxBlocks)
  int numSeqs, heads, kvHeads, hd, blockSize, maxBlocks;
  float scale;
};
// `inputs`, when given, prepares each query row (and its cache slot) first, in the same region.
void pagedAttention(const Kernels& k, const AttentionArgs& a, const RowPass& inputs = {});

}  // namespace weft
