#include <cmath>
#include <vector>
#include "ops.h"

namespace weft {

// One job per (sequence, KV head): its query rows × the query heads sharing
// that KV head, so the sequence's K/V rows are fetched from memory once and
// reused from cache. Each query is computed by the same sequence of
// operations whatever else is in the job — scores in key order, one softmax,
// values accumulated in key order — so results do not depend on the batch or
// on how a prompt was chunked.
void pagedAttention(const Kernels& k, const AttentionArgs& a) {
  const int group = a.heads / a.kvHeads;
  const size_t rowStride = static_cast<size_t>(a.kvHeads) * a.hd;
  const int jobs = a.numSeqs * a.kvHeads;
#pragma omp parallel
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1)
    for (int job = 0; job < jobs; job++) {
      const int s = job / a.kvHeads, kvh = job % a.kvHeads;
      const int32_t* table = a.blockTables + static_cast<size_t>(s) * a.maxBlocks;
      const size_t headOffset = static_cast<size_t>(kvh) * a.hd;
      for (int t = a.seqStarts[s]; t < a.seqStarts[s + 1]; t++) {
        const int ctx = a.positions[t] + 1;  // causal: keys 0..position
        scores.resize(ctx);
        for (int h = kvh * group; h < (kvh + 1) * group; h++) {
          const float* q = a.q + (static_cast<size_t>(t) * a.heads + h) * a.hd;
          float maxScore = -INFINITY;
          for (int j = 0; j < ctx; j++) {
            const size_t slot = static_cast<size_t>(table[j / a.blockSize]) * a.blockSize + j % a.blockSize;
            const float sc = k.dot(q, a.kCache + slot * rowStride + headOffset, a.hd) * a.scale;
            scores[j] = sc;
            maxScore = sc > maxScore ? sc : maxScore;
          }
          const float inv = 1.0f / k.expSum(scores.data(), ctx, maxScore);
          float* out = a.out + (static_cast<size_t>(t) * a.heads + h) * a.hd;
          for (int d = 0; d < a.hd; d++) out[d] = 0.0f;
          for (int j = 0; j < ctx; j++) {
            const size_t slot = static_cast<size_t>(table[j / a.blockSize]) * a.blockSize + j % a.blockSize;
            k.axpy(scores[j] * inv, a.vCache + slot * rowStride + headOffset, out, a.hd);
          }
        }
      }
    }
  }
}

}  // namespace weft
