// What the CUDA backend's kernel files share (cuda_kernels.cu, cuda_attention.cu, cuda_gemv.cu): warp
// and block reductions, programmatic dependent launch, the KV element conversions, the elementwise
// steps a fused kernel must compute with the same bits as the kernel it replaces, and the launchers.
// Private to those files: each gets its own copy (internal linkage).
#pragma once
#include "cuda_kernels.h"
#include <cuda_fp16.h>
#include <algorithm>
#include <stdexcept>
#include <string>

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

// SiLU(gate) · up rounded to bf16, the down projection's input: siluMulKernel and the one-row GEMV
// that folds it in share it, so both give the same bits.
__device__ __forceinline__ bf16 siluTimes(float gate, float up) { return __float2bfloat16_rn(gate / (1.0f + expf(-gate)) * up); }

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

// Throws, naming the kernel, when its launch failed.
void launchCheck(const char* what, cudaError_t e) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA kernel ") + what + ": " + cudaGetErrorString(e));
}
void launched(const char* what) { launchCheck(what, cudaGetLastError()); }

__global__ void pdlProbe() {}

// Whether this build's kernels were generated for sm_90 or later (ptxVersion: a newer GPU running code
// JIT-compiled from older PTX has no griddepcontrol in it, so no PDL there).
bool pdlCompiled() {
  static const bool pdl = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, pdlProbe) == cudaSuccess && attr.ptxVersion >= 90;
  }();
  return pdl;
}

// Launches with PDL when `early` and pdlCompiled() (the kernel may be scheduled while the one before
// it runs; it waits with awaitPrerequisites).
template <class... P, class... A>
void launchPdl(const char* what, bool early, void (*kernel)(P...), dim3 grid, dim3 block, size_t shared, cudaStream_t s, A... args) {
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = s;
  cfg.attrs = attrs;
  cfg.numAttrs = early && pdlCompiled() ? 1 : 0;
  launchCheck(what, cudaLaunchKernelEx(&cfg, kernel, args...));
}

}  // namespace
}  // namespace weft::cuda
