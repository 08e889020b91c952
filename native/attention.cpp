#include <cmath>
#include <vector>
#include "ops.h"

namespace weft {

void pagedAttention(const Kernels& k, const AttentionArgs& a) {
  const int group = a.heads / a.kvHeads;
  const size_t rowStride = static_cast<size_t>(a.kvHeads) * a.hd;
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int job = 0; job < a.T * a.heads; job++) {
      int t = job / a.heads, h = job % a.heads, kvh = h / group;
      int ctx = a.positions[t] + 1;  // causal: keys 0..position
      const float* q = a.q + (static_cast<size_t>(t) * a.heads + h) * a.hd;
      const int32_t* table = a.blockTables + static_cast<size_t>(a.rowSeq[t]) * a.maxBlocks;
      scores.resize(ctx);
      float maxScore = -INFINITY;
      for (int j = 0; j < ctx; j++) {
        size_t slot = static_cast<size_t>(table[j / a.blockSize]) * a.blockSize + j % a.blockSize;
        float s = k.dot(q, a.kCache + slot * rowStride + static_cast<size_t>(kvh) * a.hd, a.hd) * a.scale;
        scores[j] = s;
        if (s > maxScore) maxScore = s;
      }
      float sum = 0.0f;
      for (int j = 0; j < ctx; j++) sum += scores[j] = std::exp(scores[j] - maxScore);
      float* out = a.out + (static_cast<size_t>(t) * a.heads + h) * a.hd;
      for (int d = 0; d < a.hd; d++) out[d] = 0.0f;
      for (int j = 0; j < ctx; j++) {
        size_t slot = static_cast<size_t>(table[j / a.blockSize]) * a.blockSize + j % a.blockSize;
        k.axpy(scores[j] / sum, a.vCache + slot * rowStride + static_cast<size_t>(kvh) * a.hd, out, a.hd);
      }
    }
  }
}

}  // namespace weft
