// MLX affine-quantized weights, portable code: exact dequantization of a row (the
// embedding lookup and the scalar matmul's panel), the scalar matmul, which spells out
// the reduction order the vector sets reproduce (see mlx_quant.h), and the choice of
// matmul per kernel set.
#include <cmath>
#include <string>
#include "mlx_quant.h"

namespace weft {

void mlxDequantRow(DType d, const void* words, const void* scales, const void* biases, DType paramDtype, int group,
                   int cols, int r, float* out) {
  const int bits = mlxBits(d), perWord = 32 / bits, groups = cols / group;
  const uint32_t mask = (1u << bits) - 1;
  const uint32_t* w = static_cast<const uint32_t*>(words) + static_cast<size_t>(r) * (cols / perWord);
  for (int g = 0; g < groups; g++) {
    const float s = mlxParam(paramDtype, scales, static_cast<size_t>(r) * groups + g);
    const float b = mlxParam(paramDtype, biases, static_cast<size_t>(r) * groups + g);
    for (int k = g * group; k < (g + 1) * group; k++) {
      const float q = static_cast<float>((w[k / perWord] >> (bits * (k % perWord))) & mask);
      out[k] = std::fma(q, s, b);
    }
  }
}

void matmulMlxScalar(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  static thread_local std::vector<float> row;
  if (row.size() < static_cast<size_t>(w.K)) row.resize(w.K);
  for (int n = n0; n < n1; n++) {
    mlxDequantRow(w.dtype, w.data, w.scales, w.biases, w.paramDtype, w.group, w.K, n, row.data());
    for (int t = 0; t < T; t++) {
      const float* xr = x + static_cast<size_t>(t) * w.K;
      float acc[kMlxLanes] = {};
      for (int k = 0; k < w.K; k++) acc[k % kMlxLanes] = std::fma(row[k], xr[k], acc[k % kMlxLanes]);
      y[static_cast<size_t>(t) * w.N + n] = mlxReduceLanes(acc);
    }
  }
}

MatmulMlxFn mlxMatmulFor(const char* kernelSet) {
  const std::string set = kernelSet ? kernelSet : "";
  if (set == "scalar") return matmulMlxScalar;
  if (set == "avx2") return matmulMlxAvx2;
  return matmulMlxAvx512;  // amx, avx512bf16 and avx512: every one has AVX-512
}

}  // namespace weft
