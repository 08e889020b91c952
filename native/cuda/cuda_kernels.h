// The CUDA backend's device kernels, one launcher each: cuda_kernels.cu (elementwise and sampling),
// cuda_attention.cu (the q/k/v epilogue and paged attention), cuda_gemv.cu (the GEMMs of a few rows).
// Activations between kernels: the residual stream and every GEMM output in fp32, each
// GEMM input in bf16 (as transformers runs a bf16 model, with fp32 accumulation).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdint>

namespace weft::cuda {

using bf16 = __nv_bfloat16;

// The KV pools' element: float, __nv_bfloat16 or __half.
enum class KvElem { F32, BF16, F16 };

// x[t] = embed[tokens[t]] widened to fp32.
void embed(const int32_t* tokens, int T, const bf16* table, int hidden, float* x, cudaStream_t s);

// out[r] = bf16(weight * x[row] * rsqrt(mean(x[row]²) + eps)); row = rows ? rows[r] : r.
void rmsnormToBf16(const float* x, const int32_t* rows, int n, const float* weight, float eps, int count, bf16* out,
                   cudaStream_t s);

// The fused q/k/v output (T × (heads + 2·kvHeads)·hd, fp32): adds the biases, applies the per-head
// q/k RMSNorm and RoPE to q and k in place, and writes k and v into their cache slots.
struct QkvArgs {
  float* qkv;
  const float* bias;                  // (heads + 2·kvHeads)·hd, or null
  const float *qNorm, *kNorm;         // (hd) each, or null
  const float2* rope;                 // (T, hd / 2): each row's cos and sin, from ropeTable
  float eps;
  const int32_t* slots;               // (T)
  void *kCache, *vCache;              // this layer's pools: (slots, kvHeads, hd)
  KvElem kv;
  int T, heads, kvHeads, hd;
};
void qkvNormRopeCache(const QkvArgs& a, cudaStream_t s);
// Each row's RoPE cos and sin, (T, hd / 2), made once a step for every layer and head that reads them.
void ropeTable(const int32_t* positions, const float* invFreq, float attentionScaling, int T, int half, float2* out,
               cudaStream_t s);

// Causal attention of every row over its sequence's cached K/V (itself included), read through
// the block table; out is (T, heads·hd) in bf16, the output projection's input.
struct AttentionArgs {
  const float* qkv;                   // q at row stride (heads + 2·kvHeads)·hd
  const void *kCache, *vCache;
  KvElem kv;
  const int32_t *positions, *seqOf, *blockTables;  // (T), (T), (B × maxBlocks)
  bf16* out;
  int T, heads, kvHeads, hd, blockSize, maxBlocks;
  float scale;
  // A row with more than kAttnChunk keys is split into chunks of them, one block each, whose partial
  // (max, sum, unnormalised output) land here, (T, heads, chunks, hd + 2), and are merged after.
  float* partial;
  int chunks;  // attentionChunks(maxBlocks · blockSize): the longest row the block tables can hold
};
void pagedAttention(const AttentionArgs& a, cudaStream_t s);
// qkvNormRopeCache and then pagedAttention in one kernel, the same bits, for a decode step: every row
// its sequence's only new token (the caller's guarantee), at most kFewRows rows, hd 16, 64 or 128. False
// (nothing launched) for other shapes.
bool decodeAttention(const QkvArgs& e, const AttentionArgs& a, cudaStream_t s);
constexpr int kAttnChunk = 512;
// The chunks of kAttnChunk keys a row of `keys` keys is split into (1: not split): its length alone
// decides, never its batch.
__host__ __device__ inline int attentionChunks(int keys) { return (keys + kAttnChunk - 1) / kAttnChunk; }

// y (T × N, fp32) = x (T × K, bf16) · wᵀ (N × K, bf16) + beta · y, for one or two rows (T <= kSkinnyRows,
// K a multiple of 8): one warp per output column streams its weight row once with 16-byte loads, so a
// decode step of one or two sequences reads the weights at close to the memory's bandwidth. From three
// rows on it loses to the tensor cores (H200, qwen3-0.6b decode steps at 128 keys, backend µs a step,
// this kernel → cuBLAS: 3 rows 1,519 → 1,441, 4 rows 1,589 → 1,429, 6 rows 2,131 → 1,399, 8 rows 2,459 →
// 1,338; 2 rows 1,239 → 1,475): at 6 and 8 rows this kernel was compute-bound.
constexpr int kSkinnyRows = 2;
// Steps of up to kFewRows rows launch the q/k/v kernel and attention early (PDL), and as decode steps
// fold the q/k/v epilogue into attention (decodeAttention).
constexpr int kFewRows = 8;
void skinnyGemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s);
// y = x · wᵀ + beta · y as skinnyGemm, for kSkinnyRows + 1 to kMmaRows rows (K a multiple of 256) on the
// tensor cores, streaming each weight once (H200, qwen3-0.6b decode at 128 keys, backend µs a step,
// cuBLAS → this kernel: 3 rows 1,464 → 1,022, 8 rows 1,344 → 1,082, 16 rows 1,459 → 1,348). A row's bits
// are the same at every row count in that range. False (nothing launched) for other row counts or K.
constexpr int kMmaRows = 16;
bool mmaRowsGemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s);

// One or two rows (T <= kSkinnyRows): y (T × N, fp32) = bf16(RMSNorm(x) · norm) · wᵀ + beta · y in one
// kernel, the same bits as rmsnormToBf16 and then skinnyGemm. False (nothing launched) unless K is a
// multiple of 256, at most 4096.
bool normedGemv(const float* x, int T, const float* norm, float eps, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s);
// One or two rows: y (T × N, fp32) = siluMul(gu) · wᵀ + beta · y in one kernel (gu: the fused gate/up
// output, T × 2I floats), the same bits as siluMul and then skinnyGemm. False (nothing launched)
// unless I is a multiple of 256, at most 4096.
bool siluMulGemv(const float* gu, int T, const bf16* w, int N, int I, float* y, float beta, cudaStream_t s);

// out[t, i] = bf16(silu(gu[t, i]) · gu[t, I + i]) for the fused gate/up output (T × 2I).
void siluMul(const float* gu, int T, int I, bf16* out, cudaStream_t s);

// Per row of logits (S × vocab): the lowest-index argmax, its log-probability, and whether the row is all finite.
struct Greedy {
  int32_t token;
  float logprob;
  int32_t finite;
};
// Each row spreads over kGreedyChunks blocks; parts is their scratch, S × kGreedyChunks.
constexpr int kGreedyChunks = 64;
struct GreedyPart {
  float max;
  int32_t arg;
  float sum;
  int32_t finite;
};
void greedy(const float* logits, int S, int vocab, GreedyPart* parts, Greedy* out, cudaStream_t s);

// The next step of a multi-step decode (StepInput::decodeSteps), in the step's device inputs: row i (its
// sequence's one row) takes the token it sampled (0 where its logits were not finite), the next position,
// and that position's slot from its block table (row i's, maxBlocks wide).
void advanceDecode(const Greedy* sampled, int T, const int32_t* tables, int maxBlocks, int blockSize, int32_t* tokens,
                   int32_t* positions, int32_t* slots, cudaStream_t s);

}  // namespace weft::cuda
