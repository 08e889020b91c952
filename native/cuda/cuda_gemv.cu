// The GEMMs of steps of a few rows: the skinny kernel, the one-row GEMV that loads its weights before it
// waits for its input (PDL), and the tensor-core kernel of up to kMmaRows rows; declared in cuda_kernels.h.
#include "cuda_device.cuh"
#include <stdexcept>
#include <utility>

namespace weft::cuda {
namespace {

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

// What the one-row GEMV reads as its input row: x in bf16 as it is; the fp32 residual stream
// RMS-normalized (what rmsnormKernel would write); or the fp32 gate/up output through SiLU·mul (what
// siluMulKernel would write).
enum class GemvIn { Bf16, Norm, SiluMul };
struct GemvInput {
  const void* x;      // bf16 (K); Norm: fp32 (K); SiluMul: fp32 gate then up (2K)
  const float* norm;  // Norm: the RMSNorm weight (K)
  float eps;
};

// One or two rows (a decode step of one or two sequences, K = 256·L): the skinny kernel's arithmetic in
// the same order, so the same bits, but each lane loads all L of its weight chunks before it waits for
// the kernel that wrote x (PDL): the weights stream while that kernel finishes, instead of after a
// launch gap. With Norm or SiluMul it also does the elementwise step before it (one kernel fewer): the
// block computes each row once into shared memory (each warp doing the whole row itself moved four
// times its weights' bytes through L1), the norm weights loaded before the wait too. Each weight
// loaded serves all R rows; a row's arithmetic does not depend on R.
constexpr int kGemvWarps = 8;
template <int L, GemvIn In, int C, int R>
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
  __shared__ uint4 staged[kStaged ? R * 32 * L : 1];
  if constexpr (kStaged) {
#pragma unroll
    for (int t = 0; t < R; t++) {
      const float* x = static_cast<const float*>(in.x) + static_cast<size_t>(t) * (In == GemvIn::SiluMul ? 2 * K : K);
      bf16* xb = reinterpret_cast<bf16*>(staged + t * 32 * L);
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
    }
    __syncthreads();
  }
  if (n >= N) return;  // whole warps only (after the block-wide steps)
  float acc[R][C] = {};
#pragma unroll
  for (int i = 0; i < L; i++) {
    const int c = lane + 32 * i;
#pragma unroll
    for (int t = 0; t < R; t++) {
      const uint4 xv = kStaged ? staged[t * 32 * L + c] : static_cast<const uint4*>(in.x)[static_cast<size_t>(t) * 32 * L + c];
      const __nv_bfloat162* xp = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
      for (int col = 0; col < C; col++) {
        const __nv_bfloat162* wp = reinterpret_cast<const __nv_bfloat162*>(&wv[col][i]);
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const float2 xf = __bfloat1622float2(xp[j]), wf = __bfloat1622float2(wp[j]);
          acc[t][col] = fmaf(xf.x, wf.x, acc[t][col]);
          acc[t][col] = fmaf(xf.y, wf.y, acc[t][col]);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < R; t++)
#pragma unroll
    for (int col = 0; col < C; col++) {
      if (n + col >= N) break;  // whole warps
      const float v = warpSum(acc[t][col]);
      float* out = y + static_cast<size_t>(t) * N + n + col;
      if (lane == 0) *out = beta == 0.0f ? v : v + beta * *out;
    }
}

// Steps of kSkinnyRows + 1 to kMmaRows rows: the tensor cores' m16n8k16 MMA with the weights as A (16
// output columns a warp) and the rows as B (8 rows a tile, rows past T zero), fp32 accumulation. A
// block's W warps split K in W equal parts, each running its 32-k steps in order, then the block adds
// the warps' sums in warp order. Each lane loads 16 contiguous bytes of a weight row (and of a row of
// x) a step and feeds them to two MMAs: the same permutation of k within each 32-k step for both
// operands, so the products summed are the true ones. A row's result depends on K, N and its own
// input alone (W is chosen from K and N), never on T or on the other rows: rows of every step from
// kSkinnyRows + 1 to kMmaRows rows give the same bits.
constexpr int kMmaSteps = 4;  // 32-k steps a warp loads before it multiplies (their loads in flight together)

__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// NT tiles of 8 rows; W warps a block. Loads the block's first weights before its PDL wait, and lets
// the next kernel start then (5 % off a 3- to 16-row step on the H200).
template <int NT, int W>
__global__ void __launch_bounds__(W * 32) mmaRowsKernel(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * 16, steps = K / (32 * W), k0 = warp * steps * 32;
  // Weight rows n0 + g and n0 + g + 8 (the last row again past N: its results are not written).
  const uint4* wa = reinterpret_cast<const uint4*>(w + static_cast<size_t>(min(n0 + g, N - 1)) * K + k0) + t;
  const uint4* wb = reinterpret_cast<const uint4*>(w + static_cast<size_t>(min(n0 + g + 8, N - 1)) * K + k0) + t;
  float acc[NT][4] = {};
  uint4 ra[kMmaSteps], rb[kMmaSteps];
  auto loadWeights = [&](int s0) {
#pragma unroll
    for (int i = 0; i < kMmaSteps; i++)
      if (s0 + i < steps) ra[i] = __ldg(wa + 4 * (s0 + i)), rb[i] = __ldg(wb + 4 * (s0 + i));
  };
  loadWeights(0);
  allowDependents();     // the next kernel may start loading its weights while this one waits
  awaitPrerequisites();  // x (and y, when beta is not 0) come from the kernels before
  for (int s0 = 0; s0 < steps; s0 += kMmaSteps) {
    uint4 rx[kMmaSteps][NT];
#pragma unroll
    for (int i = 0; i < kMmaSteps; i++)
#pragma unroll
      for (int j = 0; j < NT; j++) {
        const int row = 8 * j + g;
        rx[i][j] = s0 + i < steps && row < T ? *(reinterpret_cast<const uint4*>(x + static_cast<size_t>(row) * K + k0) + t + 4 * (s0 + i))
                                             : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int i = 0; i < kMmaSteps; i++) {
      if (s0 + i >= steps) break;
#pragma unroll
      for (int j = 0; j < NT; j++) {
        mma16816(acc[j], ra[i].x, rb[i].x, ra[i].y, rb[i].y, rx[i][j].x, rx[i][j].y);
        mma16816(acc[j], ra[i].z, rb[i].z, ra[i].w, rb[i].w, rx[i][j].z, rx[i][j].w);
      }
    }
    if (s0 + kMmaSteps < steps) loadWeights(s0 + kMmaSteps);
  }
  // acc[j]: columns n0 + g (0, 1) and n0 + g + 8 (2, 3) of rows 8j + 2t (0, 2) and 8j + 2t + 1 (1, 3).
  __shared__ float part[W][16][8 * NT];
#pragma unroll
  for (int j = 0; j < NT; j++) {
    part[warp][g][8 * j + 2 * t] = acc[j][0];
    part[warp][g][8 * j + 2 * t + 1] = acc[j][1];
    part[warp][g + 8][8 * j + 2 * t] = acc[j][2];
    part[warp][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < 16 * 8 * NT; o += W * 32) {
    const int col = o % 16, row = o / 16, n = n0 + col;
    if (row >= T || n >= N) continue;
    float v = 0.0f;
    for (int q = 0; q < W; q++) v += part[q][col][row];
    float* out = y + static_cast<size_t>(row) * N + n;
    *out = beta == 0.0f ? v : v + beta * *out;
  }
}

constexpr int kGemvMaxChunks = 16;  // K up to 4096 on the GEMV
using GemvKernel = void (*)(GemvInput, const bf16*, int, int, float*, float);
template <GemvIn In, int C, int R, int... Ls>
constexpr GemvKernel gemvFor(int l, std::integer_sequence<int, Ls...>) {
  GemvKernel k = nullptr;
  ((k = (l == Ls + 1) ? gemvKernel<Ls + 1, In, C, R> : k), ...);
  return k;
}

// One or two rows (T), K = 256·L. A warp takes two columns (kernels for L <= 8 only: their registers
// hold) where one a warp would need more blocks than the GPU holds at once: the second wave's blocks
// would start their weight loads only when the first wave's end. Each column's arithmetic is the same
// either way.
template <GemvIn In, int R>
void launchGemv(GemvInput in, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  constexpr auto chunks = std::make_integer_sequence<int, kGemvMaxChunks>{};
  constexpr auto pairChunks = std::make_integer_sequence<int, kGemvMaxChunks / 2>{};
  const GemvKernel one = gemvFor<In, 1, R>(K / 256, chunks);
  const int blocks = (N + kGemvWarps - 1) / kGemvWarps;
  int resident = 0;
  const bool pairs = K / 256 <= kGemvMaxChunks / 2 &&
                     cudaOccupancyMaxActiveBlocksPerMultiprocessor(&resident, one, kGemvWarps * 32, 0) == cudaSuccess &&
                     blocks > resident * smCount();
  const GemvKernel kernel = pairs ? gemvFor<In, 2, R>(K / 256, pairChunks) : one;
  const int grid = pairs ? (N + 2 * kGemvWarps - 1) / (2 * kGemvWarps) : blocks;
  launchPdl("gemv", true, kernel, dim3(grid), dim3(kGemvWarps * 32), 0, s, in, w, N, K, y, beta);
}

template <GemvIn In>
bool gemv(GemvInput in, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  if (T < 1 || T > kSkinnyRows || K % 256 != 0 || K / 256 > kGemvMaxChunks) return false;
  if (T == 1) launchGemv<In, 1>(in, w, N, K, y, beta, s);
  else launchGemv<In, 2>(in, w, N, K, y, beta, s);
  return true;
}

}  // namespace

void skinnyGemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  if (T < 1 || T > kSkinnyRows || K % 8 != 0) throw std::invalid_argument("skinnyGemm: T must be 1 or 2 and K a multiple of 8");
  if (gemv<GemvIn::Bf16>({x, nullptr, 0.0f}, T, w, N, K, y, beta, s)) return;
  const int blocks = (N + kSkinnyWarps - 1) / kSkinnyWarps, threads = kSkinnyWarps * 32;
  if (T == 1) skinnyKernel<1><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  else skinnyKernel<2><<<blocks, threads, 0, s>>>(x, T, w, N, K, y, beta);
  launched("skinnyGemm");
}

bool mmaRowsGemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  if (T <= kSkinnyRows || T > kMmaRows || K % 256 != 0) return false;
  // 16 warps a block where 8 would leave multiprocessors idle (the o and down projections: N / 16
  // blocks); chosen from N and K alone, so a row's bits do not depend on T.
  const int tiles = (N + 15) / 16;
  const bool wide = tiles < 2 * smCount() && K % 512 == 0;
  const auto kernel = T <= 8 ? (wide ? mmaRowsKernel<1, 16> : mmaRowsKernel<1, 8>) : (wide ? mmaRowsKernel<2, 16> : mmaRowsKernel<2, 8>);
  launchPdl("mmaRowsGemm", true, kernel, dim3(tiles), dim3((wide ? 16 : 8) * 32), 0, s, x, T, w, N, K, y, beta);
  return true;
}

bool normedGemv(const float* x, int T, const float* norm, float eps, const bf16* w, int N, int K, float* y, float beta, cudaStream_t s) {
  return gemv<GemvIn::Norm>({x, norm, eps}, T, w, N, K, y, beta, s);
}

bool siluMulGemv(const float* gu, int T, const bf16* w, int N, int I, float* y, float beta, cudaStream_t s) {
  return gemv<GemvIn::SiluMul>({gu, nullptr, 0.0f}, T, w, N, I, y, beta, s);
}

}  // namespace weft::cuda
