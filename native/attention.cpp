#include <algorithm>
#include <cmath>
#include <vector>
#include "ops.h"

namespace weft {

// One job per (sequence, KV head). Its queries — every row of the sequence in
// this step × the query heads sharing the KV head — are taken six at a time,
// so each cached key is loaded once for six queries (and each value row once for three). Keys are stored
// dimension-major within a block, so a query's scores against a block's keys
// are vector lanes: no horizontal sums. Every query goes through the same
// operations whatever else is in its group or its batch — scores lane by lane,
// a softmax over its own context, values accumulated in key order — so
// results do not depend on the batch or on how a prompt was chunked.
void pagedAttention(const Kernels& k, const AttentionArgs& a) {
  const int group = a.heads / a.kvHeads;
  const int bs = a.blockSize;
  const size_t vRow = static_cast<size_t>(a.kvHeads) * a.hd;
  const int jobs = a.numSeqs * a.kvHeads;
#pragma omp parallel
  {
    // Per worker thread, kept across steps: no allocation per step.
    static thread_local std::vector<float> scoreBuf;
    static thread_local std::vector<const float*> vrows;
#pragma omp for schedule(dynamic, 1)
    for (int job = 0; job < jobs; job++) {
      const int s = job / a.kvHeads, kvh = job % a.kvHeads;
      const int32_t* table = a.blockTables + static_cast<size_t>(s) * a.maxBlocks;
      const int rows = a.seqStarts[s + 1] - a.seqStarts[s];
      const int nQueries = rows * group;
      for (int q0 = 0; q0 < nQueries; q0 += kMaxScoreQueries) {
        const int nq = std::min(kMaxScoreQueries, nQueries - q0);
        int t[kMaxScoreQueries], h[kMaxScoreQueries], ctx[kMaxScoreQueries], maxCtx = 0;
        const float* qs[kMaxScoreQueries];
        float* sc[kMaxScoreQueries];
        for (int i = 0; i < nq; i++) {
          t[i] = a.seqStarts[s] + (q0 + i) / group;
          h[i] = kvh * group + (q0 + i) % group;
          ctx[i] = a.positions[t[i]] + 1;  // causal: keys 0..position
          maxCtx = std::max(maxCtx, ctx[i]);
          qs[i] = a.q + (static_cast<size_t>(t[i]) * a.heads + h[i]) * a.hd;
        }
        const size_t padded = (static_cast<size_t>(maxCtx) + bs - 1) / bs * bs;
        if (scoreBuf.size() < kMaxScoreQueries * padded) scoreBuf.resize(kMaxScoreQueries * padded);
        for (int i = 0; i < nq; i++) sc[i] = scoreBuf.data() + i * padded;
        for (int b = 0; b * bs < maxCtx; b++) {
          const float* kt = a.kCache + (static_cast<size_t>(table[b]) * a.kvHeads + kvh) * a.hd * bs;
          float* out[kMaxScoreQueries];
          for (int i = 0; i < nq; i++) out[i] = sc[i] + b * bs;
          k.scores(qs, nq, kt, bs, a.hd, std::min(bs, maxCtx - b * bs), a.scale, out);
        }
        for (int i = 0; i < nq; i++) {
          const float maxScore = *std::max_element(sc[i], sc[i] + ctx[i]);
          const float inv = 1.0f / k.expSum(sc[i], ctx[i], maxScore);
          for (int j = 0; j < ctx[i]; j++) sc[i][j] *= inv;
        }
        if (vrows.size() < static_cast<size_t>(maxCtx)) vrows.resize(maxCtx);
        for (int j = 0; j < maxCtx; j++)
          vrows[j] = a.vCache + (static_cast<size_t>(table[j / bs]) * bs + j % bs) * vRow + static_cast<size_t>(kvh) * a.hd;
        for (int i = 0; i < nq; i += 3) {  // values: three queries share each loaded V row
          const int m = std::min(3, nq - i);
          const float* ps[3];
          float* outs[3];
          for (int r = 0; r < m; r++) {
            ps[r] = sc[i + r];
            outs[r] = a.out + (static_cast<size_t>(t[i + r]) * a.heads + h[i + r]) * a.hd;
          }
          k.weightedSum(ps, ctx + i, m, vrows.data(), a.hd, outs);
        }
      }
    }
  }
}

}  // namespace weft
