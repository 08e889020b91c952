// MLX affine-quantized weights (mlx-community's 4- and 8-bit checkpoints), kept as
// stored: per row, K·bits/32 little-endian uint32 words, element j of a word at bits
// [bits·j, bits·(j+1)); per row and group of `group` inputs a scale and a bias.
// Weight (n, k) = scale · q + bias of its group, computed as fma(q, scale, bias) in fp32:
// with bf16/f16 scales q·scale is exact (at most 8 + 11 significant bits), so this is
// the dequantized weight MLX and the fixtures' references compute, rounded once.
//
// The matmul reduces each output in one order, which every kernel set follows, so all
// give the same bits whatever the batch:
//   acc[l] = 0 for 16 lanes l; for k = 0 .. K-1 in order: acc[k % 16] = fma(w[k], x[k], acc[k % 16])
//   s8[i] = acc[i] + acc[i + 8]; s4[i] = s8[i] + s8[i + 4]; s2[i] = s4[i] + s4[i + 2]; y = s2[0] + s2[1]
// The vector sets dequantize a panel of kMlxPanel weight rows into an fp32 buffer once
// and dot every activation row of the step against it, a register tile at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>
#include "kernels.h"

namespace weft {

constexpr int kMlxLanes = 16;
constexpr int kMlxPanel = 4;

// Group sizes and widths the kernels take (what mlx-community publishes).
inline bool mlxGroupSupported(int group) { return group == 32 || group == 64 || group == 128; }

// Bytes of the packed words of a rows × cols MLX matrix.
inline size_t mlxWordBytes(DType d, size_t rows, size_t cols) { return rows * cols * mlxBits(d) / 8; }

// Bytes of the scales (or of the biases) of a rows × cols MLX matrix.
inline size_t mlxParamBytes(DType paramDtype, size_t rows, size_t cols, int group) {
  return rows * (cols / group) * (paramDtype == DType::F32 ? 4 : 2);
}

// Scale or bias i of a group-parameter array in its stored dtype, widened exactly.
inline float mlxParam(DType d, const void* p, size_t i) {
  if (d == DType::F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return d == DType::F16 ? f16ToF32(h) : bf16ToF32(h);
}

// Row r of an MLX matrix (words, scales and biases as above) dequantized to `out` (cols floats).
void mlxDequantRow(DType d, const void* words, const void* scales, const void* biases, DType paramDtype, int group,
                   int cols, int r, float* out);

// The fixed reduction of 16 lanes spelled out above.
inline float mlxReduceLanes(const float* acc) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// The MLX matmul of each kernel set (see MatmulMlxFn in kernels.h).
void matmulMlxScalar(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
void matmulMlxAvx2(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
void matmulMlxAvx512(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1);

// y[T, w.N] = x[T, w.K] · wᵀ for an MLX w, the columns split across threads in panels
// (defined in matmul.cpp).
void matmulMlx(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y);

}  // namespace weft
