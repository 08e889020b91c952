#include <omp.h>
#include <algorithm>
#include <cmath>
#include <vector>
#include "ops.h"
#include "sampling.h"

namespace weft {
namespace {

// One job per sequence and run of KV heads (see headsPerJob). Its queries — every row of the
// sequence in this step × the query heads sharing each KV head — are taken in tiles of 24:
// each cached key block is fetched once per tile (and each value row once per three
// queries). Keys are stored dimension-major within a block, so a query's scores against a
// block's keys are vector lanes: no horizontal sums. A block holds each head's keys, and each
// head's values, in one contiguous run, the heads one after another. Every query goes through
// the same operations whatever else is in its tile, job or batch — scores lane by lane, a
// softmax over its own context, values accumulated in key order — so results do not depend on
// the batch or on how a prompt was chunked.
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

// One tile of a job: up to kTile queries of one KV head, their score rows and context lengths.
struct Tile {
  int kvh, nq, maxCtx;
  int t[kTile], h[kTile], ctx[kTile];
  const float* qs[kTile];
  float* sc[kTile];
};

template <class E>
struct Job {
  const AttentionArgs& a;
  const Kernels& k;
  const E* kCache;
  const E* vCache;
  const int32_t* table;
  // This head's keys (or values) in the sequence's block b: one contiguous run of hd × bs elements.
  const E* headBlock(const E* pool, int b, int kvh) const {
    return pool + (static_cast<size_t>(table[b]) * a.kvHeads + kvh) * a.hd * a.blockSize;
  }

  // Queries q0.. of head kvh in sequence s (q = row × group + head within the group).
  void fill(Tile& tl, int s, int kvh, int q0, int nQueries) const {
    const int group = a.heads / a.kvHeads;
    tl.kvh = kvh;
    tl.nq = std::min(kTile, nQueries - q0);
    tl.maxCtx = 0;
    for (int i = 0; i < tl.nq; i++) {
      tl.t[i] = a.seqStarts[s] + (q0 + i) / group;
      tl.h[i] = kvh * group + (q0 + i) % group;
      tl.ctx[i] = a.positions[tl.t[i]] + 1;  // causal: keys 0..position
      tl.maxCtx = std::max(tl.maxCtx, tl.ctx[i]);
      tl.qs[i] = a.q + (static_cast<size_t>(tl.t[i]) * a.heads + tl.h[i]) * a.hd;
    }
  }

  // Every query of the tile against key block b; `ahead` is prefetched while it runs.
  void scoreBlock(const Tile& tl, int b, const void* ahead) const {
    const int bs = a.blockSize;
    const E* kt = headBlock(kCache, b, tl.kvh);
    for (int g0 = 0; g0 < tl.nq; g0 += kMaxScoreQueries) {
      const int m = std::min(kMaxScoreQueries, tl.nq - g0);
      const int keys = std::min(bs, *std::max_element(tl.ctx + g0, tl.ctx + g0 + m) - b * bs);
      if (keys <= 0) continue;
      float* out[kMaxScoreQueries];
      for (int i = 0; i < m; i++) out[i] = tl.sc[g0 + i] + b * bs;
      scores(k, a.kvDtype, tl.qs + g0, m, kt, g0 == 0 ? ahead : nullptr, bs, a.hd, keys, a.scale, out);
    }
  }

  // Softmax of each query's scores, then its values accumulated in key order.
  void finish(const Tile& tl, std::vector<const E*>& vrows) const {
    const int bs = a.blockSize;
    for (int i = 0; i < tl.nq; i++) {
      float* sc = tl.sc[i];
      const float inv = 1.0f / k.expSum(sc, tl.ctx[i], sc[argmax(sc, tl.ctx[i])]);  // argmax: no chain of dependent compares
      for (int j = 0; j < tl.ctx[i]; j++) sc[j] *= inv;
    }
    if (vrows.size() < static_cast<size_t>(tl.maxCtx)) vrows.resize(tl.maxCtx);
    for (int j0 = 0; j0 < tl.maxCtx; j0 += bs) {  // block by block: no division per key
      const E* v = headBlock(vCache, j0 / bs, tl.kvh);
      for (int j = j0; j < std::min(tl.maxCtx, j0 + bs); j++, v += a.hd) vrows[j] = v;
    }
    for (int i = 0; i < tl.nq; i += 3) {  // values: three queries share each loaded V row
      const int m = std::min(3, tl.nq - i);
      const float* ps[3];
      float* outs[3];
      for (int r = 0; r < m; r++) {
        ps[r] = tl.sc[i + r];
        outs[r] = a.out + (static_cast<size_t>(tl.t[i + r]) * a.heads + tl.h[i + r]) * a.hd;
      }
      weightedSum(k, a.kvDtype, ps, tl.ctx + i, m, vrows.data(), a.hd, outs);
    }
  }
};

// KV heads per job: all of a sequence's when there are jobs enough for the threads, so that a
// job reads each key block as one run over its heads (64 KiB for qwen3-0.6b) rather than one
// 8 KiB run per head: randomly placed runs of 8 KiB read at 17-19 GB/s here, of 64 KiB at 25.
int headsPerJob(const AttentionArgs& a) {
  const int minJobs = 4 * omp_get_max_threads();
  int h = a.kvHeads;
  while (h % 2 == 0 && a.numSeqs * (a.kvHeads / h) < minJobs) h /= 2;
  return h;
}

template <class E>
void attend(const Kernels& k, const AttentionArgs& a, const RowPass& inputs) {
  const int group = a.heads / a.kvHeads, bs = a.blockSize;
  const int perJob = headsPerJob(a), jobs = a.numSeqs * (a.kvHeads / perJob);
#pragma omp parallel
  {
    rowPassInRegion(inputs, a.seqStarts[a.numSeqs]);
    // Per worker thread, kept across steps: no allocation per step.
    static thread_local std::vector<float> scoreBuf;
    static thread_local std::vector<const E*> vrows;
    static thread_local std::vector<Tile> tiles;
#pragma omp for schedule(dynamic, 1)
    for (int job = 0; job < jobs; job++) {
      const int s = job / (a.kvHeads / perJob), kvh0 = job % (a.kvHeads / perJob) * perJob;
      const Job<E> J{a, k, static_cast<const E*>(a.kCache), static_cast<const E*>(a.vCache), a.blockTables + static_cast<size_t>(s) * a.maxBlocks};
      const int nQueries = (a.seqStarts[s + 1] - a.seqStarts[s]) * group;
      // A decode step's queries (one tile a head) go through the key blocks together, head after
      // head within each block; longer chunks tile by tile, each tile reusing each key block from L1.
      const int together = nQueries <= kTile ? perJob : 1;
      tiles.resize(together);
      for (int h0 = kvh0; h0 < kvh0 + perJob; h0 += together)
        for (int q0 = 0; q0 < nQueries; q0 += kTile) {
          for (int i = 0; i < together; i++) J.fill(tiles[i], s, h0 + i, q0, nQueries);
          const size_t padded = (static_cast<size_t>(tiles[0].maxCtx) + bs - 1) / bs * bs;  // same rows: same maxCtx
          if (scoreBuf.size() < together * kTile * padded) scoreBuf.resize(together * kTile * padded);
          for (int i = 0; i < together; i++)
            for (int q = 0; q < tiles[i].nq; q++) tiles[i].sc[q] = scoreBuf.data() + (static_cast<size_t>(i) * kTile + q) * padded;
          // Each call prefetches the block read after it: the same head's next key block, after the
          // last one the head's first value block.
          for (int b = 0; b * bs < tiles[0].maxCtx; b++)
            for (const Tile& tl : tiles) {
              const bool last = (b + 1) * bs >= tl.maxCtx;
              J.scoreBlock(tl, b, last ? J.headBlock(J.vCache, 0, tl.kvh) : J.headBlock(J.kCache, b + 1, tl.kvh));
            }
          for (const Tile& tl : tiles) J.finish(tl, vrows);
        }
    }
  }
}

}  // namespace

void pagedAttention(const Kernels& k, const AttentionArgs& a, const RowPass& inputs) {
  if (a.kvDtype == DType::F32) attend<float>(k, a, inputs);
  else attend<uint16_t>(k, a, inputs);
}

}  // namespace weft
