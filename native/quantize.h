// Weight quantization into ggml's block formats (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K):
// the writer side of `weft quantize`. The blocks are the bytes llama.cpp reads
// (layouts in quant.h's dequantRow and docs/QUANTIZATION.md); how the scales are
// chosen is Weft's own: each minimizes the squared error of its block.
#pragma once
#include <cstddef>
#include <cstdint>
#include "kernels.h"

namespace weft {

// Whether quantizeWeights writes type d.
bool canQuantize(DType d);

// `rows` rows of `cols` floats (cols a multiple of d's block) → rows of d's blocks in `out`
// (tensorBytes(d, rows, cols) bytes). Rows are split across threads; each row's bytes do not
// depend on the split.
void quantizeWeights(DType d, const float* x, int64_t rows, int64_t cols, uint8_t* out);

}  // namespace weft
