// The elementwise and sampling kernels: embedding, RMSNorm, the RoPE table, SiLU·mul and greedy;
// declared in cuda_kernels.h.
#include "cuda_device.cuh"

namespace weft::cuda {
namespace {

__global__ void embedKernel(const int32_t* tokens, const bf16* table, int hidden, float* x) {
  const bf16* row = table + static_cast<size_t>(tokens[blockIdx.x]) * hidden;
  float* out = x + static_cast<size_t>(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

__global__ void rmsnormKernel(const float* x, const int32_t* rows, int n, const float* weight, float eps, bf16* out) {
  allowDependents();  // the GEMV after it may start loading its weights
  const int row = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + static_cast<size_t>(row) * n;
  const float inv = inverseRms(xr, n, eps);
  bf16* o = out + static_cast<size_t>(blockIdx.x) * n;
  for (int i = threadIdx.x; i < n; i += blockDim.x) o[i] = normed(xr[i], weight[i], inv);
}

// One block per row: its angles in fp32 as transformers computes them, cos/sin rounded once from
// double (as the CPU path). Every layer's and head's qkvKernel reads them.
__global__ void ropeTableKernel(const int32_t* positions, const float* invFreq, float scaling, int half, float2* out) {
  const int t = blockIdx.x;
  for (int d = threadIdx.x; d < half; d += blockDim.x) {
    const float angle = static_cast<float>(positions[t]) * invFreq[d];
    out[static_cast<size_t>(t) * half + d] = make_float2(static_cast<float>(cos(static_cast<double>(angle))) * scaling,
                                                         static_cast<float>(sin(static_cast<double>(angle))) * scaling);
  }
}

// Block (row, slice of 256): one element per thread, so one row spreads over I / 256 blocks.
__global__ void siluMulKernel(const float* gu, int I, bf16* out) {
  allowDependents();  // the down projection may start loading its weights
  const int i = blockIdx.y * blockDim.x + threadIdx.x;
  if (i >= I) return;
  const float* g = gu + static_cast<size_t>(blockIdx.x) * 2 * I;
  out[static_cast<size_t>(blockIdx.x) * I + i] = siluTimes(g[i], g[I + i]);
}

// Max with the lowest index on ties.
__device__ __forceinline__ void argmaxInto(float& best, int& arg, float v, int i) {
  if (v > best || (v == best && i < arg)) {
    best = v;
    arg = i;
  }
}

// Greedy in two passes, so one row spreads over kGreedyChunks blocks (one block over a 150k vocabulary
// took 100 µs). Pass 1, block (chunk, row): the chunk's max, its lowest index, whether it is all
// finite, and the sum of exp(x − max) over the chunk.
__global__ void greedyPartKernel(const float* logits, int vocab, GreedyPart* parts) {
  const int chunk = blockIdx.x, r = blockIdx.y;
  const int len = (vocab + kGreedyChunks - 1) / kGreedyChunks;
  const int begin = chunk * len, end = min(vocab, begin + len);
  const float* row = logits + static_cast<size_t>(r) * vocab;
  float best = -INFINITY;
  int arg = vocab;
  int finite = 1;
  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const float x = row[i];
    if (!isfinite(x)) finite = 0;
    argmaxInto(best, arg, x, i);
  }
  for (int o = 16; o > 0; o >>= 1) argmaxInto(best, arg, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, arg, o));
  __shared__ float bv[32];
  __shared__ int bi[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) {
    bv[warp] = best;
    bi[warp] = arg;
  }
  finite = __syncthreads_and(finite);
  best = bv[0];
  arg = bi[0];
  for (int w = 1; w < warps; w++) argmaxInto(best, arg, bv[w], bi[w]);
  float sum = 0.0f;
  if (finite && best > -INFINITY)
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) sum += expf(row[i] - best);
  sum = blockSum(sum);
  if (threadIdx.x == 0) parts[static_cast<size_t>(r) * kGreedyChunks + chunk] = {best, arg, sum, finite};
}

// Pass 2, one warp per row: merges the chunks into the row's argmax and its log-probability.
__global__ void greedyMergeKernel(const float* logits, int vocab, const GreedyPart* parts, Greedy* out) {
  const int r = blockIdx.x, lane = threadIdx.x;
  const GreedyPart* p = parts + static_cast<size_t>(r) * kGreedyChunks;
  float best = -INFINITY;
  int arg = vocab;
  int finite = 1;
  for (int c = lane; c < kGreedyChunks; c += 32) {
    finite &= p[c].finite;
    argmaxInto(best, arg, p[c].max, p[c].arg);
  }
  for (int o = 16; o > 0; o >>= 1) argmaxInto(best, arg, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, arg, o));
  finite = __all_sync(0xffffffffu, finite);
  float sum = 0.0f;
  for (int c = lane; c < kGreedyChunks; c += 32)
    if (p[c].sum > 0.0f) sum += p[c].sum * expf(p[c].max - best);
  sum = warpSum(sum);
  if (lane == 0) out[r] = {arg, finite ? logits[static_cast<size_t>(r) * vocab + arg] - (best + logf(sum)) : 0.0f, finite};
}

__global__ void advanceDecodeKernel(const Greedy* sampled, int T, const int32_t* tables, int maxBlocks, int blockSize,
                                    int32_t* tokens, int32_t* positions, int32_t* slots) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= T) return;
  const Greedy g = sampled[i];
  tokens[i] = g.finite ? g.token : 0;
  const int p = ++positions[i];
  slots[i] = tables[static_cast<size_t>(i) * maxBlocks + p / blockSize] * blockSize + p % blockSize;
}

}  // namespace

void advanceDecode(const Greedy* sampled, int T, const int32_t* tables, int maxBlocks, int blockSize, int32_t* tokens,
                   int32_t* positions, int32_t* slots, cudaStream_t s) {
  advanceDecodeKernel<<<(T + 255) / 256, 256, 0, s>>>(sampled, T, tables, maxBlocks, blockSize, tokens, positions, slots);
  launched("advance decode");
}

void embed(const int32_t* tokens, int T, const bf16* table, int hidden, float* x, cudaStream_t s) {
  embedKernel<<<T, 256, 0, s>>>(tokens, table, hidden, x);
  launched("embed");
}

void rmsnormToBf16(const float* x, const int32_t* rows, int n, const float* weight, float eps, int count, bf16* out,
                   cudaStream_t s) {
  if (count == 0) return;
  rmsnormKernel<<<count, 256, 0, s>>>(x, rows, n, weight, eps, out);
  launched("rmsnorm");
}

void ropeTable(const int32_t* positions, const float* invFreq, float attentionScaling, int T, int half, float2* out,
               cudaStream_t s) {
  if (T == 0) return;
  ropeTableKernel<<<T, roundUp32(std::min(half, 256)), 0, s>>>(positions, invFreq, attentionScaling, half, out);
  launched("rope");
}

void siluMul(const float* gu, int T, int I, bf16* out, cudaStream_t s) {
  siluMulKernel<<<dim3(T, (I + 255) / 256), 256, 0, s>>>(gu, I, out);
  launched("siluMul");
}

void greedy(const float* logits, int S, int vocab, GreedyPart* parts, Greedy* out, cudaStream_t s) {
  if (S == 0) return;
  greedyPartKernel<<<dim3(kGreedyChunks, S), 256, 0, s>>>(logits, vocab, parts);
  greedyMergeKernel<<<S, 32, 0, s>>>(logits, vocab, parts, out);
  launched("greedy");
}

}  // namespace weft::cuda
