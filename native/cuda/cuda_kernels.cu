#include "cuda_kernels.h"
#include <cuda_fp16.h>
#include <cfloat>
#include <stdexcept>
#include <string>
#include <utility>

namespace weft::cuda {
namespace {

__device__ __forceinline__ float warpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float blockSum(float v) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warpSum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float p = lane < static_cast<int>(blockDim.x >> 5) ? partial[lane] : 0.0f;
    p = warpSum(p);
    if (lane == 0) total = p;
  }
  __syncthreads();
  const float r = total;
  __syncthreads();  // partial/total may be reused by a second call
  return r;
}

// Hopper's programmatic dependent launch (PDL). A kernel launched with it may be scheduled while the
// kernel before it still runs, once that one has allowed dependents; it must wait for it (its whole
// grid finished, its writes visible) before reading or writing anything the step computes. Compiled
// for sm_90 and later only: elsewhere both are no-ops and such kernels are launched without PDL.
__device__ __forceinline__ void allowDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void awaitPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

template <class E> __device__ __forceinline__ float load(const E* p);
template <> __device__ __forceinline__ float load<float>(const float* p) { return *p; }
template <> __device__ __forceinline__ float load<bf16>(const bf16* p) { return __bfloat162float(*p); }
template <> __device__ __forceinline__ float load<__half>(const __half* p) { return __half2float(*p); }

template <class E> __device__ __forceinline__ E store(float v);
template <> __device__ __forceinline__ float store<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 store<bf16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half store<__half>(float v) { return __float2half_rn(v); }

int roundUp32(int n) { return (n + 31) / 32 * 32; }

__global__ void embedKernel(const int32_t* tokens, const bf16* table, int hidden, float* x) {
  const bf16* row = table + static_cast<size_t>(tokens[blockIdx.x]) * hidden;
  float* out = x + static_cast<size_t>(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

// RMSNorm's parts, shared by rmsnormKernel and the one-row GEMV that folds the norm in, so both give
// the same bits: the inverse RMS of x (n floats; a thread adds the squares of x[i], i = threadIdx.x,
// + blockDim.x, ..., in that order, then the block sums them) and one normalized element, rounded to
// bf16 for the GEMM after it.
__device__ __forceinline__ float addSquare(float ss, float x) { return __fmaf_rn(x, x, ss); }
__device__ float inverseRmsOf(float ss, int n, float eps) { return 1.0f / sqrtf(blockSum(ss) / n + eps); }
__device__ float inverseRms(const float* x, int n, float eps) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) ss = addSquare(ss, x[i]);
  return inverseRmsOf(ss, n, eps);
}
__device__ __forceinline__ bf16 normed(float x, float weight, float inv) { return __float2bfloat16_rn(weight * (x * inv)); }

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

// One block per (row, head of q, k or v); blockDim.x = hd rounded up to a warp. Early: launched with
// PDL (earlyAttention).
template <class E, bool Early>
__global__ void qkvKernel(QkvArgs a) {
  extern __shared__ float v[];  // hd
  const int t = blockIdx.x, head = blockIdx.y, d = threadIdx.x, hd = a.hd;
  const int qkvDim = (a.heads + 2 * a.kvHeads) * hd;
  float* row = a.qkv + static_cast<size_t>(t) * qkvDim + static_cast<size_t>(head) * hd;
  if constexpr (Early) {
    awaitPrerequisites();  // the q/k/v GEMV
    allowDependents();     // attention may be scheduled
  }
  float x = 0.0f;
  if (d < hd) x = row[d] + (a.bias ? a.bias[head * hd + d] : 0.0f);
  const int slot = a.slots[t];
  const size_t cacheAt = (static_cast<size_t>(slot) * a.kvHeads) * hd;
  if (head >= a.heads + a.kvHeads) {  // v: straight into the cache
    if (d < hd) static_cast<E*>(a.vCache)[cacheAt + static_cast<size_t>(head - a.heads - a.kvHeads) * hd + d] = store<E>(x);
    return;
  }
  const bool isQ = head < a.heads;
  const float* norm = isQ ? a.qNorm : a.kNorm;
  if (norm) {  // block-uniform branch
    const float inv = 1.0f / sqrtf(blockSum(x * x) / hd + a.eps);
    if (d < hd) x = norm[d] * (x * inv);
  }
  if (d < hd) v[d] = x;
  __syncthreads();
  const int half = hd / 2;
  if (d < half) {
    const float2 cs = a.rope[static_cast<size_t>(t) * half + d];
    const float c = cs.x, s = cs.y;
    const float lo = v[d], hi = v[d + half];
    // Products rounded before the sum, as transformers and the CPU path (no FMA contraction) compute it.
    const float rlo = __fsub_rn(__fmul_rn(lo, c), __fmul_rn(hi, s)), rhi = __fadd_rn(__fmul_rn(hi, c), __fmul_rn(lo, s));
    if (isQ) {
      row[d] = rlo;
      row[d + half] = rhi;
    } else {
      E* k = static_cast<E*>(a.kCache) + cacheAt + static_cast<size_t>(head - a.heads) * hd;
      k[d] = store<E>(rlo);
      k[d + half] = store<E>(rhi);
    }
  }
}

// A key's cache slot: its block's table entry and its offset there. For a power-of-two block size (the
// default 32) a shift and a mask replace the integer division and remainder, which attention paid on
// every key (2-3 % of a decode step on the H200: docs/GPU.md). The same slot either way.
__device__ __forceinline__ size_t slotOf(const int32_t* table, int key, int blockSize) {
  if ((blockSize & (blockSize - 1)) == 0) {
    const int shift = __ffs(blockSize) - 1;
    return static_cast<size_t>(table[key >> shift]) * blockSize + (key & (blockSize - 1));
  }
  return static_cast<size_t>(table[key / blockSize]) * blockSize + key % blockSize;
}

constexpr int kAttnWarps = 8;
// Keys a warp takes per iteration, their loads in flight together. A step of a few rows (Early) has
// one block per head and a handful of keys per warp, so it takes more at once: fewer round trips to
// memory in a row, at registers that only its few blocks spend. Every key's operations and their order
// are the same either way, so the same bits.
constexpr int kAttnUnroll = 4, kAttnUnrollEarly = 16;

// One block per (row, KV head, chunk of kAttnChunk keys) and the G query heads sharing it (G = 1:
// one block per query head), kAttnWarps warps splitting the chunk's keys; each lane holds head
// dimensions lane, lane + 32, ... (DPL of them). Each key and value is loaded once for the G heads.
// Online softmax in fp32, merged across warps at the end. Per query head the operations and their
// order do not depend on G.
// Early: launched with PDL (earlyAttention).
template <class E, int DPL, int G, bool Early>
__global__ void __launch_bounds__(kAttnWarps * 32) attentionKernel(AttentionArgs a) {
  allowDependents();  // the output projection may start loading its weights
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = a.hd, group = a.heads / a.kvHeads;
  const int h0 = blockIdx.y * G, kvh = h0 / group;  // G divides group: the G heads share kvh
  const int qkvDim = (a.heads + 2 * a.kvHeads) * hd;
  if constexpr (Early) awaitPrerequisites();  // the q/k/v kernel
  float qr[G][DPL], acc[G][DPL], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float* q = a.qkv + static_cast<size_t>(t) * qkvDim + static_cast<size_t>(h0 + g) * hd;
#pragma unroll
    for (int j = 0; j < DPL; j++) {
      const int d = lane + 32 * j;
      qr[g][j] = d < hd ? q[d] * a.scale : 0.0f;
      acc[g][j] = 0.0f;
    }
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
  }
  const int last = a.positions[t];  // keys 0 .. last (causal: the row's own position included)
  // This block's keys k0 .. k1; a row of one chunk is computed as it was before chunks existed.
  const int chunks = attentionChunks(last + 1), c = blockIdx.z;
  if (c >= chunks) return;
  const int k0 = c * kAttnChunk, k1 = min(last, k0 + kAttnChunk - 1);
  const int32_t* table = a.blockTables + static_cast<size_t>(a.seqOf[t]) * a.maxBlocks;
  const E* K = static_cast<const E*>(a.kCache);
  const E* V = static_cast<const E*>(a.vCache);
  // Warp w takes keys w, w + kAttnWarps, ...; U of them per iteration, loaded before any is used.
  constexpr int U = Early ? kAttnUnrollEarly : kAttnUnroll;
  for (int base = k0 + warp; base <= k1; base += kAttnWarps * U) {
    float kr[U][DPL], vr[U][DPL];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int key = min(base + u * kAttnWarps, k1);  // past the end: a valid key, ignored below
      const size_t at = (slotOf(table, key, a.blockSize) * a.kvHeads + kvh) * hd;
#pragma unroll
      for (int j = 0; j < DPL; j++) {
        const int d = lane + 32 * j;
        kr[u][j] = d < hd ? load<E>(K + at + d) : 0.0f;
        vr[u][j] = d < hd ? load<E>(V + at + d) : 0.0f;
      }
    }
#pragma unroll
    for (int g = 0; g < G; g++) {
      float score[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < DPL; j++) dot += qr[g][j] * kr[u][j];
        score[u] = warpSum(dot);
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (base + u * kAttnWarps > k1) break;
        const float mNew = fmaxf(m[g], score[u]);
        const float corr = __expf(m[g] - mNew), p = __expf(score[u] - mNew);
        l[g] = l[g] * corr + p;
#pragma unroll
        for (int j = 0; j < DPL; j++) acc[g][j] = acc[g][j] * corr + p * vr[u][j];
        m[g] = mNew;
      }
    }
  }
  __shared__ float ms[kAttnWarps], ls[kAttnWarps];
  __shared__ float accs[kAttnWarps][DPL * 32];
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (lane == 0) {
      ms[warp] = m[g];
      ls[warp] = l[g];
    }
#pragma unroll
    for (int j = 0; j < DPL; j++) accs[warp][lane + 32 * j] = acc[g][j];
    __syncthreads();
    float M = -FLT_MAX;
    for (int w = 0; w < kAttnWarps; w++) M = fmaxf(M, ms[w]);
    float L = 0.0f;
    for (int w = 0; w < kAttnWarps; w++) L += ls[w] * __expf(ms[w] - M);  // a warp with no key has l = 0
    bf16* out = a.out + static_cast<size_t>(t) * a.heads * hd + static_cast<size_t>(h0 + g) * hd;
    float* part = chunks > 1 ? a.partial + ((static_cast<size_t>(t) * a.heads + h0 + g) * a.chunks + c) * (hd + 2) : nullptr;
    if (chunks > 1 && threadIdx.x == 0) {
      part[0] = M;
      part[1] = L;
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.0f;
      for (int w = 0; w < kAttnWarps; w++) o += accs[w][d] * __expf(ms[w] - M);
      if (chunks > 1) part[2 + d] = o;
      else out[d] = __float2bfloat16_rn(o / L);
    }
    __syncthreads();  // ms, ls and accs are rewritten for the next head
  }
}

// One block per (row, query head) of a row split into chunks: the chunks' partials merged in chunk
// order, as the warps' are inside a block. Rows of one chunk were written by attentionKernel.
__global__ void attentionMergeKernel(AttentionArgs a) {
  allowDependents();  // the output projection may start loading its weights
  const int t = blockIdx.x, h = blockIdx.y, hd = a.hd;
  const int chunks = attentionChunks(a.positions[t] + 1);
  if (chunks == 1) return;
  const float* part = a.partial + (static_cast<size_t>(t) * a.heads + h) * a.chunks * (hd + 2);
  float M = -FLT_MAX;
  for (int c = 0; c < chunks; c++) M = fmaxf(M, part[c * (hd + 2)]);
  float L = 0.0f;
  for (int c = 0; c < chunks; c++) L += part[c * (hd + 2) + 1] * __expf(part[c * (hd + 2)] - M);
  bf16* out = a.out + static_cast<size_t>(t) * a.heads * hd + static_cast<size_t>(h) * hd;
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int c = 0; c < chunks; c++) o += part[c * (hd + 2) + 2 + d] * __expf(part[c * (hd + 2)] - M);
    out[d] = __float2bfloat16_rn(o / L);
  }
}

constexpr int kSkinnyWarps = 8;

// One warp per output column n: lanes take 8 consecutive k at a time (one 16-byte load of w and of
// each x row), then the warp sums its partial dot products.
template <int R>
__global__ void __launch_bounds__(kSkinnyWarps * 32) skinnyKernel(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta) {
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kSkinnyWarps + (threadIdx.x >> 5);
  if (n >= N) return;  // whole warps only
  const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<size_t>(n) * K);
  float acc[R];
#pragma unroll
  for (int t = 0; t < R; t++) acc[t] = 0.0f;
  const int chunks = K / 8;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    const uint4 wv = __ldg(wr + c);
    const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv);
    float2 wf[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wf[j] = __bfloat1622float2(wp[j]);
#pragma unroll
    for (int t = 0; t < R; t++) {
      if (t >= T) break;
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(t) * K) + c);
      const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 xf = __bfloat1622float2(xp[j]);
        acc[t] = fmaf(xf.x, wf[j].x, acc[t]);
        acc[t] = fmaf(xf.y, wf[j].y, acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < R; t++) {
    if (t >= T) break;
    const float v = warpSum(acc[t]);
    if (lane == 0) {
      float* out = y + static_cast<size_t>(t) * N + n;
      *out = beta == 0.0f ? v : v + beta * *out;
    }
  }
}

// SiLU(gate) · up rounded to bf16, the down projection's input: siluMulKernel and the one-row GEMV
// that folds it in share it, so both give the same bits.
__device__ __forceinline__ bf16 siluTimes(float gate, float up) { return __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up); }

// What the one-row GEMV reads as its input row: x in bf16 as it is; the fp32 residual stream
// RMS-normalized (what rmsnormKernel would write); or the fp32 gate/up output through SiLU·mul (what
// siluMulKernel would write).
enum class GemvIn { Bf16, Norm, SiluMul };
struct GemvInput {
  const void* x;      // bf16 (K); Norm: fp32 (K); SiluMul: fp32 gate then up (2K)
  const float* norm;  // Norm: the RMSNorm weight (K)
  float eps;
};

// One row (a decode step of one sequence, K = 256·L): the skinny kernel's arithmetic in the same order,
// so the same bits, but each lane loads all L of its weight chunks before it waits for the kernel that
// wrote x (PDL): the weights stream while that kernel finishes, instead of after a launch gap. With Norm
// or SiluMul it also does the elementwise step before it (one kernel fewer): the block computes the
// row once into shared memory (each warp doing the whole row itself moved four times its weights'
// bytes through L1), the norm weights loaded before the wait too.
constexpr int kGemvWarps = 8;
template <int L, GemvIn In, int C>
__global__ void __launch_bounds__(kGemvWarps * 32) gemvKernel(GemvInput in, const bf16* w, int N, int K, float* y, float beta) {
  constexpr bool kStaged = In != GemvIn::Bf16;
  constexpr int kThreads = kGemvWarps * 32, kPer = kStaged ? 256 * L / kThreads : 1;  // row elements a thread computes
  const int lane = threadIdx.x & 31;
  const int n = (blockIdx.x * kGemvWarps + (threadIdx.x >> 5)) * C;  // this warp's C columns from n
  uint4 wv[C][L];
#pragma unroll
  for (int col = 0; col < C; col++) {
    if (n + col >= N) break;
    const uint4* wr = reinterpret_cast<const uint4*>(w + static_cast<size_t>(n + col) * K);
#pragma unroll
    for (int i = 0; i < L; i++) wv[col][i] = __ldg(wr + lane + 32 * i);
  }
  float g[kPer];
  if constexpr (In == GemvIn::Norm) {
#pragma unroll
    for (int j = 0; j < kPer; j++) g[j] = __ldg(in.norm + threadIdx.x + kThreads * j);
  }
  allowDependents();  // the next kernel may start (a GEMV loading its weights) while this one waits
  awaitPrerequisites();
  // Plain loads below: x was written after this kernel started.
  __shared__ uint4 staged[kStaged ? 32 * L : 1];
  if constexpr (kStaged) {
    const float* x = static_cast<const float*>(in.x);
    bf16* xb = reinterpret_cast<bf16*>(staged);
    float xr[kPer], up[kPer];  // SiluMul: xr the gate, up the up projection
#pragma unroll
    for (int j = 0; j < kPer; j++) {
      xr[j] = x[threadIdx.x + kThreads * j];
      if constexpr (In == GemvIn::SiluMul) up[j] = x[K + threadIdx.x + kThreads * j];
    }
    if constexpr (In == GemvIn::Norm) {
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < kPer; j++) ss = addSquare(ss, xr[j]);  // inverseRms's order
      const float inv = inverseRmsOf(ss, K, in.eps);
#pragma unroll
      for (int j = 0; j < kPer; j++) xb[threadIdx.x + kThreads * j] = normed(xr[j], g[j], inv);
    } else {
#pragma unroll
      for (int j = 0; j < kPer; j++) xb[threadIdx.x + kThreads * j] = siluTimes(xr[j], up[j]);
    }
    __syncthreads();
  }
  if (n >= N) return;  // whole warps only (after the block-wide steps)
  float acc[C] = {};
#pragma unroll
  for (int i = 0; i < L; i++) {
    const int c = lane + 32 * i;
    const uint4 xv = kStaged ? staged[c] : static_cast<const uint4*>(in.x)[c];
    const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
    for (int col = 0; col < C; col++) {
      const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv[col][i]);
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float2 xf = __bfloat1622float2(xp[j]), wf = __bfloat1622float2(wp[j]);
        acc[col] = fmaf(xf.x, wf.x, acc[col]);
        acc[col] = fmaf(xf.y, wf.y, acc[col]);
      }
    }
  }
#pragma unroll
  for (int col = 0; col < C; col++) {
    if (n + col >= N) break;  // whole warps
    const float v = warpSum(acc[col]);
    if (lane == 0) y[n + col] = beta == 0.0f ? v : v + beta * y[n + col];
  }
}

constexpr int kGemvMaxChunks = 16;  // K up to 4096 on the one-row path
using GemvKernel = void (*)(GemvInput, const bf16*, int, int, float*, float);
template <GemvIn In, int C, int... Ls>
constexpr GemvKernel gemvFor(int l, std::integer_sequence<int, Ls...>) {
  GemvKernel k = nullptr;
  ((k = (l == Ls + 1) ? gemvKernel<Ls + 1, In, C> : k), ...);
  return k;
}

// The GPU's multiprocessors (device 0's, the one the backend uses).
int smCount() {
  static const int sms = [] {
    int dev = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return n > 0 ? n : 1;
  }();
  return sms;
}

// Launches with PDL when `early` (the kernel may be scheduled while the one before it runs; it waits
// with awaitPrerequisites) where the kernels' code was generated for sm_90 or later (ptxVersion: a newer
// GPU running code JIT-compiled from older PTX has no griddepcontrol in it, so no PDL there).
template <class... P, class... A>
void launchPdl(const char* what, bool early, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t s, A... args) {
  static const bool pdl = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, gemvKernel<1, GemvIn::Bf16, 1>) == cudaSuccess && attr.ptxVersion >= 90;
  }();
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attrs;
  cfg.numAttrs = pdl && early ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}

// One row, K = 256·L. A warp takes two columns (kernels for L <= 8 only: their registers hold) where
// one a warp would need more blocks than the GPU holds at once: the second wave's blocks would start
// their weight loads only when the first wave's end. Each column's arithmetic is the same either way.
template <GemvIn In>
bool gemv(GemvInput in, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  if (K % 256 != 0 || K / 256 > kGemvMaxChunks) return false;
  constexpr auto chunks = std::make_integer_sequence<int, kGemvMaxChunks>{};
  constexpr auto pairChunks = std::make_integer_sequence<int, kGemvMaxChunks / 2>{};
  const GemvKernel one = gemvFor<In, 1>(K / 256, chunks);
  const int blocks = (N + kGemvWarps - 1) / kGemvWarps;
  int resident = 0;
  const bool pairs = K / 256 <= kGemvMaxChunks / 2 &&
                     cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, one, kGemvWarps * 32, 0) == cudaSuccess &&
                     blocks > resident * smCount();
  const GemvKernel kernel = pairs ? gemvFor<In, 2>(K / 256, pairChunks) : one;
  const int grid = pairs ? (N + 2 * kGemvWarps - 1) / (2 * kGemvWarps) : blocks;
  launchPdl("gemv", true, kernel, dim3(grid), dim3(kGemvWarps * 32), 0, s, in, w, N, K, y, beta);
  return true;
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

void launched(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}

// The q/k/v kernel and attention are scheduled early (PDL) for steps of a few rows, where each kernel's
// latency is the step's time; at 512 rows that measured 3-4 % slower (docs/GPU.md), so larger steps run
// kernels compiled without the PDL wait. Either way the same bits.
bool earlyAttention(int T) { return T <= kSkinnyRows; }

template <class E>
void qkvFor(const QkvArgs& a, cudaStream_t s) {
  const int threads = roundUp32(a.hd);
  const bool early = earlyAttention(a.T);
  launchPdl("qkv", early, early ? qkvKernel<E, true> : qkvKernel<E, false>, dim3(a.T, a.heads + 2 * a.kvHeads), dim3(threads), a.hd * sizeof(float), s, a);
}

template <class E, int DPL, bool Early>
auto attentionVariant(int g) {
  return g == 4 ? attentionKernel<E, DPL, 4, Early> : g == 2 ? attentionKernel<E, DPL, 2, Early> : attentionKernel<E, DPL, 1, Early>;
}

// G query heads per block where G divides the group and the grid still has 4 blocks per SM (few rows
// keep one block per head: more blocks, shorter chains); G at most 16 / DPL so the registers hold. The
// bits do not depend on G.
template <class E, int DPL>
void attentionGrouped(const AttentionArgs& a, cudaStream_t s) {
  const int sms = smCount();
  const int group = a.heads / a.kvHeads, threads = kAttnWarps * 32;
  const auto fits = [&](int g) { return group % g == 0 && g * DPL <= 16 && static_cast<long>(a.T) * a.heads / g >= 4L * sms; };
  const int g = fits(4) ? 4 : fits(2) ? 2 : 1;
  const bool early = earlyAttention(a.T);
  const auto kernel = early ? attentionVariant<E, DPL, true>(g) : attentionVariant<E, DPL, false>(g);
  launchPdl("attention", early, kernel, dim3(a.T, a.heads / g, a.chunks), dim3(threads), 0, s, a);
  if (a.chunks > 1) attentionMergeKernel<<<dim3(a.T, a.heads), roundUp32(std::min(a.hd, 256)), 0, s>>>(a);
}

template <class E>
void attentionFor(const AttentionArgs& a, cudaStream_t s) {
  if (a.hd <= 32) attentionGrouped<E, 1>(a, s);
  else if (a.hd <= 64) attentionGrouped<E, 2>(a, s);
  else if (a.hd <= 128) attentionGrouped<E, 4>(a, s);
  else attentionGrouped<E, 8>(a, s);
}

}  // namespace

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

void qkvNormRopeCache(const QkvArgs& a, cudaStream_t s) {
  if (a.hd > 1024) throw std::invalid_argument("head_dim above 1024 is not supported on CUDA");
  if (a.kv == KvElem::F32) qkvFor<float>(a, s);
  else if (a.kv == KvElem::BF16) qkvFor<bf16>(a, s);
  else qkvFor<__half>(a, s);
  launched("qkv");
}

void pagedAttention(const AttentionArgs& a, cudaStream_t s) {
  if (a.hd > 256) throw std::invalid_argument("head_dim above 256 is not supported on CUDA");
  if (a.kv == KvElem::F32) attentionFor<float>(a, s);
  else if (a.kv == KvElem::BF16) attentionFor<bf16>(a, s);
  else attentionFor<__half>(a, s);
  launched("attention");
}

void skinnyGemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  if (T < 1 || T > kSkinnyRows || K % 8 != 0) throw std::invalid_argument("skinnyGemm: T must be 1..8 and K a multiple of 8");
  if (T == 1 && gemv<GemvIn::Bf16>({x, nullptr, 0.0f}, w, N, K, y, beta, s)) return;
  const int blocks = (N + kSkinnyWarps - 1) / kSkinnyWarps, threads = kSkinnyWarps * 32;
  if (T == 1) skinnyKernel<1><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  else if (T <= 2) skinnyKernel<2><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  else if (T <= 4) skinnyKernel<4><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  else skinnyKernel<8><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  launched("skinnyGemm");
}

bool normedGemv(const float* x, const float* norm, float eps, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  return gemv<GemvIn::Norm>({x, norm, eps}, w, N, K, y, beta, s);
}

bool siluMulGemv(const float* gu, const bf16* w, int N, int I, float* y, float beta, cudaStream_t s) {
  return gemv<GemvIn::SiluMul>({gu, nullptr, 0.0f}, w, N, I, y, beta, s);
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
