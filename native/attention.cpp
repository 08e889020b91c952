#include <algorithm>
#include <cmath>
#include <vector>
#include "ops.h"
#include "sampling.h"

namespace weft {
namespace {

// One job per (sequence, KV head). Its queries — every row of the sequence in
// this step × the query heads sharing the KV head — are taken in tiles of 24:
// each cached key block is fetched once per tile (and each value row once per
// three queries). Keys are stored
// dimension-major within a block, so a query's scores against a block's keys
// are vector lanes: no horizontal sums. A block holds each head's keys, and each
// head's values, in one contiguous run: a job reads two sequential streams per
// block, which the hardware prefetcher follows (rows strided by all heads were
// latency-bound). Every query goes through the same
// operations whatever else is in its group or its batch — scores lane by lane,
// a softmax over its own context, values accumulated in key order — so
// results do not depend on the batch or on how a prompt was chunked.
// Queries per tile: several score-kernel groups share each fetched key block.
constexpr int kTile = 4 * kMaxScoreQueries;

// The score and value kernels for a pool of element E: fp32, or 16-bit widened in registers.
void scores(const Kernels& k, DType, const float* const* qs, int nq, const float* kt, const void* ahead, int bs, int hd, int n,
            float scale, float* const* out) {
  k.scores(qs, nq, kt, ahead, bs, hd, n, scale, out);
}
void scores(const Kernels& k, DType kv, const float* const* qs, int nq, const uint16_t* kt, const void* ahead, int bs, int hd, int n,
            float scale, float* const* out) {
  k.scoresHalf(qs, nq, kt, ahead, kv, bs, hd, n, scale, out);
}
void weightedSum(const Kernels& k, DType, const float* const* ps, const int* ns, int nq, const float* const* vrows, int hd,
                 float* const* outs) {
  k.weightedSum(ps, ns, nq, vrows, hd, outs);
}
void weightedSum(const Kernels& k, DType kv, const float* const* ps, const int* ns, int nq, const uint16_t* const* vrows, int hd,
                 float* const* outs) {
  k.weightedSumHalf(ps, ns, nq, vrows, kv, hd, outs);
}

template <class E>
void attend(const Kernels& k, const AttentionArgs& a) {
  const int group = a.heads / a.kvHeads;
  const int bs = a.blockSize;
  const int jobs = a.numSeqs * a.kvHeads;
  const E* kCache = static_cast<const E*>(a.kCache);
  const E* vCache = static_cast<const E*>(a.vCache);
#pragma omp parallel
  {
    // Per worker thread, kept across steps: no allocation per step.
    static thread_local std::vector<float> scoreBuf;
    static thread_local std::vector<const E*> vrows;
#pragma omp for schedule(dynamic, 1)
    for (int job = 0; job < jobs; job++) {
      const int s = job / a.kvHeads, kvh = job % a.kvHeads;
      const int32_t* table = a.blockTables + static_cast<size_t>(s) * a.maxBlocks;
      // This head's keys (or values) in the sequence's block b: one contiguous run of hd × bs elements.
      const auto headBlock = [&](const E* pool, int b) { return pool + (static_cast<size_t>(table[b]) * a.kvHeads + kvh) * a.hd * bs; };
      const int rows = a.seqStarts[s + 1] - a.seqStarts[s];
      const int nQueries = rows * group;
      for (int q0 = 0; q0 < nQueries; q0 += kTile) {
        const int nq = std::min(kTile, nQueries - q0);
        int t[kTile], h[kTile], ctx[kTile], maxCtx = 0;
        const float* qs[kTile];
        float* sc[kTile];
        for (int i = 0; i < nq; i++) {
          t[i] = a.seqStarts[s] + (q0 + i) / group;
          h[i] = kvh * group + (q0 + i) % group;
          ctx[i] = a.positions[t[i]] + 1;  // causal: keys 0..position
          maxCtx = std::max(maxCtx, ctx[i]);
          qs[i] = a.q + (static_cast<size_t>(t[i]) * a.heads + h[i]) * a.hd;
        }
        const size_t padded = (static_cast<size_t>(maxCtx) + bs - 1) / bs * bs;
        if (scoreBuf.size() < kTile * padded) scoreBuf.resize(kTile * padded);
        for (int i = 0; i < nq; i++) sc[i] = scoreBuf.data() + i * padded;
        // Block by block, every query of the tile: a key block is fetched once and reused from L1
        // by all of them, so prefill's K traffic grows with (prompt length)² / tile, not (prompt length)².
        // Each call prefetches the block read after it: the next key block, after the last one the first value block.
        for (int b = 0; b * bs < maxCtx; b++) {
          const E* kt = headBlock(kCache, b);
          const E* ahead = (b + 1) * bs < maxCtx ? headBlock(kCache, b + 1) : headBlock(vCache, 0);
          for (int g0 = 0; g0 < nq; g0 += kMaxScoreQueries) {
            const int m = std::min(kMaxScoreQueries, nq - g0);
            const int keys = std::min(bs, *std::max_element(ctx + g0, ctx + g0 + m) - b * bs);
            if (keys <= 0) continue;
            float* out[kMaxScoreQueries];
            for (int i = 0; i < m; i++) out[i] = sc[g0 + i] + b * bs;
            scores(k, a.kvDtype, qs + g0, m, kt, g0 == 0 ? ahead : nullptr, bs, a.hd, keys, a.scale, out);
          }
        }
        for (int i = 0; i < nq; i++) {
          const float inv = 1.0f / k.expSum(sc[i], ctx[i], sc[i][argmax(sc[i], ctx[i])]);  // argmax: no chain of dependent compares
          for (int j = 0; j < ctx[i]; j++) sc[i][j] *= inv;
        }
        if (vrows.size() < static_cast<size_t>(maxCtx)) vrows.resize(maxCtx);
        for (int j0 = 0; j0 < maxCtx; j0 += bs) {  // block by block: no division per key
          const E* v = headBlock(vCache, j0 / bs);
          for (int j = j0; j < std::min(maxCtx, j0 + bs); j++, v += a.hd) vrows[j] = v;
        }
        for (int i = 0; i < nq; i += 3) {  // values: three queries share each loaded V row
          const int m = std::min(3, nq - i);
          const float* ps[3];
          float* outs[3];
          for (int r = 0; r < m; r++) {
            ps[r] = sc[i + r];
            outs[r] = a.out + (static_cast<size_t>(t[i + r]) * a.heads + h[i + r]) * a.hd;
          }
          weightedSum(k, a.kvDtype, ps, ctx + i, m, vrows.data(), a.hd, outs);
        }
      }
    }
  }
}

}  // namespace

void pagedAttention(const Kernels& k, const AttentionArgs& a) {
  if (a.kvDtype == DType::F32) attend<float>(k, a);
  else attend<uint16_t>(k, a);
}

}  // namespace weft
