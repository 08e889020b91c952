// The q/k/v epilogue (biases, q/k RMSNorm, RoPE, the cache write) and paged attention, for prefill
// chunks and decode alike; declared in cuda_kernels.h.
#include "cuda_device.cuh"
#include <cfloat>
#include <stdexcept>
#include <type_traits>

namespace weft::cuda {
namespace {

// 1 / RMS of one head's hd elements, held one a thread (x, 0 past hd) by the block's warps w0 .. w0 +
// nw - 1: the sum of squares in blockSum's order over a block of those nw warps, so qkvKernel and
// decodeAttentionKernel (which normalizes a q and a k head side by side) give the same bits. Every
// thread of the block calls it.
__device__ float headInverseRms(float x, int w0, int nw, int hd, float eps) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31;
  const float s = warpSum(x * x);
  if (lane == 0) partial[threadIdx.x >> 5] = s;
  __syncthreads();
  const float total = warpSum(lane < nw ? partial[w0 + lane] : 0.0f);
  __syncthreads();  // partial may be reused by a second call
  return 1.0f / sqrtf(total / hd + eps);
}

// RoPE of one head's pair (lo, hi) = (v[d], v[d + hd/2]) with its cos and sin. Products rounded before
// the sum, as transformers and the CPU path (no FMA contraction) compute it.
__device__ __forceinline__ float2 rotated(float lo, float hi, float2 cs) {
  return {__fsub_rn(__fmul_rn(lo, cs.x), __fmul_rn(hi, cs.y)), __fadd_rn(__fmul_rn(hi, cs.x), __fmul_rn(lo, cs.y))};
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
    const float inv = headInverseRms(x, 0, blockDim.x >> 5, hd, a.eps);
    if (d < hd) x = norm[d] * (x * inv);
  }
  if (d < hd) v[d] = x;
  __syncthreads();
  const int half = hd / 2;
  if (d < half) {
    const float2 r = rotated(v[d], v[d + half], a.rope[static_cast<size_t>(t) * half + d]);
    if (isQ) {
      row[d] = r.x;
      row[d + half] = r.y;
    } else {
      E* k = static_cast<E*>(a.kCache) + cacheAt + static_cast<size_t>(head - a.heads) * hd;
      k[d] = store<E>(r.x);
      k[d + half] = store<E>(r.y);
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

// One key into a query head's online softmax in fp32: the running maximum m, sum l and unnormalised
// output acc (N dimensions), with the key's score and its value's N dimensions v[0 .. N). Both
// attention layouts take their keys through it, in their own order.
template <int N, class Values>
__device__ __forceinline__ void absorbKey(float& m, float& l, float (&acc)[N], float score, const Values& v) {
  const float mNew = fmaxf(m, score);
  const float corr = __expf(m - mNew), p = __expf(score - mNew);
  l = l * corr + p;
#pragma unroll
  for (int j = 0; j < N; j++) acc[j] = acc[j] * corr + p * v[j];
  m = mNew;
}

// Query head h of row t from the block's n partial results over chunk c of its keys, merged in order
// (part w: its maximum ms[w], its sum ls[w] and its unnormalised output at accs[w · stride + d]), into
// the row's output, or into the chunk's partial when the row is split. Every thread of the block, after
// the barrier that published the parts.
__device__ __forceinline__ void mergeParts(const AttentionArgs& a, int t, int h, int c, int chunks, int n, const float* ms, const float* ls,
                                           const float* accs, int stride) {
  const int hd = a.hd;
  float M = -FLT_MAX;
  for (int w = 0; w < n; w++) M = fmaxf(M, ms[w]);
  float L = 0.0f;
  for (int w = 0; w < n; w++) L += ls[w] * __expf(ms[w] - M);  // a part with no key has l = 0
  bf16* out = a.out + static_cast<size_t>(t) * a.heads * hd + static_cast<size_t>(h) * hd;
  float* part = chunks > 1 ? a.partial + ((static_cast<size_t>(t) * a.heads + h) * a.chunks + c) * (hd + 2) : nullptr;
  if (chunks > 1 && threadIdx.x == 0) {
    part[0] = M;
    part[1] = L;
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < n; w++) o += accs[w * stride + d] * __expf(ms[w] - M);
    if (chunks > 1) part[2 + d] = o;
    else out[d] = __float2bfloat16_rn(o / L);
  }
}

// The last key of chunk c of a row whose new token is at position last.
__device__ __forceinline__ int chunkLastKey(int last, int c) { return min(last, c * kAttnChunk + kAttnChunk - 1); }

// Row t's query heads h0 .. h0 + G - 1 (qr: each lane's dimensions lane, lane + 32, ..., scaled) over
// this block's chunk c of the row's keys, read through its block table from KV head kvh. kAttnWarps
// warps split the chunk's keys; each lane holds DPL head dimensions; each key and value is loaded
// once for the G heads. Online softmax in fp32, merged across warps at the end, into the output row
// (a row of one chunk) or the chunk's partial. Per query head the operations and their order do not
// depend on G. The caller has returned for chunks past the row's last key.
template <class E, int DPL, int G, int U>
__device__ __forceinline__ void attend(const AttentionArgs& a, int t, int h0, int kvh, int c, int chunks, const float (&qr)[G][DPL]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, hd = a.hd;
  float acc[G][DPL], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int j = 0; j < DPL; j++) acc[g][j] = 0.0f;
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
  }
  // This block's keys k0 .. k1 (causal: up to the row's own position); a row of one chunk is computed
  // as it was before chunks existed.
  const int k0 = c * kAttnChunk, k1 = chunkLastKey(a.positions[t], c);
  const int32_t* table = a.blockTables + static_cast<size_t>(a.seqOf[t]) * a.maxBlocks;
  const E* K = static_cast<const E*>(a.kCache);
  const E* V = static_cast<const E*>(a.vCache);
  // Warp w takes keys w, w + kAttnWarps, ...; U of them per iteration, loaded before any is used.
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
        absorbKey(m[g], l[g], acc[g], score[u], vr[u]);
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
    mergeParts(a, t, h0 + g, c, chunks, kAttnWarps, ms, ls, &accs[0][0], DPL * 32);
    __syncthreads();  // ms, ls and accs are rewritten for the next head
  }
}

// Eight consecutive KV elements as one lane loads them (one 16-byte load, two for fp32), widened one
// at a time when read: exact conversions.
template <class E> struct Eight;
template <> struct Eight<float> {
  float4 lo, hi;
  __device__ __forceinline__ void load(const float* p) {
    lo = *reinterpret_cast<const float4*>(p);
    hi = *reinterpret_cast<const float4*>(p + 4);
  }
  __device__ __forceinline__ float operator[](int i) const {
    const float4& v = i < 4 ? lo : hi;
    return (i & 3) == 0 ? v.x : (i & 3) == 1 ? v.y : (i & 3) == 2 ? v.z : v.w;
  }
};
template <class E> struct EightHalves {  // bf16 or fp16: four 32-bit words of two elements each
  uint4 w;
  __device__ __forceinline__ void load(const E* p) { w = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ uint32_t word(int i) const { return i < 2 ? (i == 0 ? w.x : w.y) : (i == 2 ? w.z : w.w); }
};
template <> struct Eight<bf16> : EightHalves<bf16> {
  __device__ __forceinline__ float operator[](int i) const {
    const uint32_t b = word(i >> 1);
    return __uint_as_float(i & 1 ? b & 0xffff0000u : b << 16);
  }
};
template <> struct Eight<__half> : EightHalves<__half> {
  __device__ __forceinline__ float operator[](int i) const {
    const uint32_t b = word(i >> 1);
    return __half2float(__ushort_as_half(static_cast<unsigned short>(i & 1 ? b >> 16 : b & 0xffffu)));
  }
};

// The head sizes attendPacked takes (hd / 8 lanes a key): the fixtures' 16 and the common 64 and 128.
bool packedHeadDim(int hd) { return hd == 16 || hd == 64 || hd == 128; }

// A lane's place among attendPacked's streams (hd = 8 · LPK): LPK lanes a key, KPW keys a warp, S
// streams a block. In an iteration whose warp starts at key base, the lane's stream takes keys base +
// sub, base + sub + S, ..., and of each the eight dimensions from part · 8.
template <int LPK> struct PackedLane {
  static constexpr int KPW = 32 / LPK, S = kAttnWarps * KPW, HD = 8 * LPK;
  int warp, sub, part;
  __device__ PackedLane() : warp(threadIdx.x >> 5), sub((threadIdx.x & 31) / LPK), part((threadIdx.x & 31) % LPK) {}
  __device__ int firstBase(int c) const { return c * kAttnChunk + warp * KPW; }  // the first iteration's, in chunk c
  __device__ int key(int base, int u) const { return base + sub + u * S; }         // of the iteration's u-th load
};
// U keys of one attendPacked stream as its lane holds them: each key's K and V eight dimensions.
template <class E, int U> struct KeyBatch {
  Eight<E> k[U], v[U];
};

// Loads this lane's batch of the iteration from key base (PackedLane), read through the row's block
// table from KV head kvh; keys past k1 load k1 (a valid key, ignored when absorbed).
template <class E, int LPK, int U>
__device__ __forceinline__ void loadKeys(KeyBatch<E, U>& b, const AttentionArgs& a, const int32_t* table, int kvh, int base, int k1) {
  const PackedLane<LPK> p;
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int key = min(p.key(base, u), k1);
    const size_t at = (slotOf(table, key, a.blockSize) * a.kvHeads + kvh) * PackedLane<LPK>::HD + p.part * 8;
    b.k[u].load(static_cast<const E*>(a.kCache) + at);
    b.v[u].load(static_cast<const E*>(a.vCache) + at);
  }
}

// attend() for the head sizes of packedHeadDim, hd = 8 · LPK: each key's K and V rows are read by LPK
// lanes, eight consecutive dimensions a lane in one 16-byte load (two for fp32), so a warp takes 32 /
// LPK keys at once and a key costs a few dozen instructions, where attend() spends over a hundred
// (2-byte loads widened one by one, a 32-lane sum a key). q: each head's eight dimensions of the lane,
// (lane % LPK) · 8 ..., scaled. Stream s = warp · 32 / LPK + lane / LPK of the block's S streams takes
// keys k0 + s, k0 + s + S, ..., U of them per iteration (loaded before any is used); each runs the
// online softmax over its keys in order, and the streams are merged in stream order at the end. The
// order depends on the row's length alone: not on its batch, G or U. `first`: the first iteration's
// keys, loaded already (decodeAttentionKernel), or null.
template <class E, int LPK, int G, int U>
__device__ __forceinline__ void attendPacked(const AttentionArgs& a, int t, int h0, int kvh, int c, int chunks, const float (&q)[G][8],
                                             const KeyBatch<E, U>* first = nullptr) {
  constexpr int S = PackedLane<LPK>::S, HD = PackedLane<LPK>::HD;
  const PackedLane<LPK> p;
  const int part = p.part, stream = p.warp * PackedLane<LPK>::KPW + p.sub;
  const int k1 = chunkLastKey(a.positions[t], c);
  const int32_t* table = a.blockTables + static_cast<size_t>(a.seqOf[t]) * a.maxBlocks;
  float acc[G][8], m[G], l[G];
#pragma unroll
  for (int g = 0; g < G; g++) {
#pragma unroll
    for (int i = 0; i < 8; i++) acc[g][i] = 0.0f;
    m[g] = -FLT_MAX;
    l[g] = 0.0f;
  }
  const auto absorb = [&](const KeyBatch<E, U>& b, int base) {
#pragma unroll
    for (int g = 0; g < G; g++) {
      float score[U];
#pragma unroll
      for (int u = 0; u < U; u++) {
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) dot += q[g][i] * b.k[u][i];
#pragma unroll
        for (int o = LPK / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        score[u] = dot;
      }
#pragma unroll
      for (int u = 0; u < U; u++) {
        if (p.key(base, u) > k1) break;
        absorbKey(m[g], l[g], acc[g], score[u], b.v[u]);
      }
    }
  };
  // An iteration runs while the warp's first stream has keys, so every lane takes part in the shuffles.
  int base = p.firstBase(c);
  if (first) {
    if (base <= k1) absorb(*first, base);
    base += S * U;
  }
  for (; base <= k1; base += S * U) {
    KeyBatch<E, U> b;
    loadKeys<E, LPK, U>(b, a, table, kvh, base, k1);
    absorb(b, base);
  }
  __shared__ float ms[S], ls[S];
  __shared__ __align__(16) float accs[S * HD];
#pragma unroll
  for (int g = 0; g < G; g++) {
    if (part == 0) {
      ms[stream] = m[g];
      ls[stream] = l[g];
    }
    float4* mine = reinterpret_cast<float4*>(accs + stream * HD + part * 8);
    mine[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    mine[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
    __syncthreads();
    mergeParts(a, t, h0 + g, c, chunks, S, ms, ls, accs, HD);
    __syncthreads();  // ms, ls and accs are rewritten for the next head
  }
}

// Keys a stream of attendPacked takes per iteration: steps of a few rows have one block per head and
// few keys a stream, so they take more at once (fewer round trips to memory in a row, at registers
// only their few blocks spend). The same bits either way.
constexpr int kPackedUnroll = 4, kPackedUnrollEarly = 8;

// One block per (row, KV head, chunk of kAttnChunk keys) and the G query heads sharing it (G = 1:
// one block per query head); attend() does the work. Early: launched with PDL (earlyAttention).
template <class E, int DPL, int G, bool Early>
__global__ void __launch_bounds__(kAttnWarps * 32) attentionKernel(AttentionArgs a) {
  allowDependents();  // the output projection may start loading its weights
  const int t = blockIdx.x, lane = threadIdx.x & 31, hd = a.hd, group = a.heads / a.kvHeads;
  const int h0 = blockIdx.y * G, kvh = h0 / group;  // G divides group: the G heads share kvh
  const int qkvDim = (a.heads + 2 * a.kvHeads) * hd;
  if constexpr (Early) awaitPrerequisites();  // the q/k/v kernel
  const int chunks = attentionChunks(a.positions[t] + 1), c = blockIdx.z;
  if (c >= chunks) return;
  float qr[G][DPL];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float* q = a.qkv + static_cast<size_t>(t) * qkvDim + static_cast<size_t>(h0 + g) * hd;
#pragma unroll
    for (int j = 0; j < DPL; j++) {
      const int d = lane + 32 * j;
      qr[g][j] = d < hd ? q[d] * a.scale : 0.0f;
    }
  }
  attend<E, DPL, G, Early ? kAttnUnrollEarly : kAttnUnroll>(a, t, h0, kvh, c, chunks, qr);
}

// attentionKernel for the head sizes of packedHeadDim: one block per (row, KV head, chunk) and the G
// query heads sharing it; attendPacked() does the work. Early: launched with PDL (earlyAttention).
template <class E, int LPK, int G, bool Early>
__global__ void __launch_bounds__(kAttnWarps * 32) packedAttentionKernel(AttentionArgs a) {
  allowDependents();  // the output projection may start loading its weights
  const int t = blockIdx.x, h0 = blockIdx.y * G, c = blockIdx.z, part = PackedLane<LPK>().part, hd = 8 * LPK;
  if constexpr (Early) awaitPrerequisites();  // the q/k/v kernel
  const int chunks = attentionChunks(a.positions[t] + 1);
  if (c >= chunks) return;
  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; g++) {
    const float* qh = a.qkv + static_cast<size_t>(t) * (a.heads + 2 * a.kvHeads) * hd + static_cast<size_t>(h0 + g) * hd + part * 8;
#pragma unroll
    for (int i = 0; i < 8; i++) q[g][i] = qh[i] * a.scale;
  }
  attendPacked<E, LPK, G, Early ? kPackedUnrollEarly : kPackedUnroll>(a, t, h0, h0 / (a.heads / a.kvHeads), c, chunks, q);
}

// Eight floats as the cache holds them (rounded to E by store<E>), packed as Eight<E>::load reads them
// from there: the same bits as writing them to the cache and loading them back.
template <class E> __device__ __forceinline__ uint32_t cachedPair(float lo, float hi);
template <> __device__ __forceinline__ uint32_t cachedPair<bf16>(float lo, float hi) {
  return __bfloat16_as_ushort(store<bf16>(lo)) | (static_cast<uint32_t>(__bfloat16_as_ushort(store<bf16>(hi))) << 16);
}
template <> __device__ __forceinline__ uint32_t cachedPair<__half>(float lo, float hi) {
  return __half_as_ushort(store<__half>(lo)) | (static_cast<uint32_t>(__half_as_ushort(store<__half>(hi))) << 16);
}
template <class E> __device__ __forceinline__ Eight<E> cachedEight(const float* x) {
  Eight<E> r;
  if constexpr (std::is_same_v<E, float>) {
    r.lo = make_float4(x[0], x[1], x[2], x[3]);
    r.hi = make_float4(x[4], x[5], x[6], x[7]);
  } else {
    r.w = make_uint4(cachedPair<E>(x[0], x[1]), cachedPair<E>(x[2], x[3]), cachedPair<E>(x[4], x[5]), cachedPair<E>(x[6], x[7]));
  }
  return r;
}

// A decode step (each row its sequence's one new token, at most kFewRows rows, hd 16, 64 or 128) with the
// q/k/v epilogue folded into attention: one block per (row, query head, chunk), launched with PDL.
// Threads 0 .. HT - 1 (HT: hd rounded up to a warp) compute the q head and the v head, threads HT ..
// 2·HT - 1 the k head, each as qkvKernel does (the same bits); the blocks of the row's last chunk
// write the new key and value into the cache (the group's query heads all write the same bits). One
// kernel a layer fewer, and no round trip of q through memory.
//
// Every load the chain after the q/k/v GEMV would wait for is issued before its PDL wait where it can
// be: the step's inputs (position, slot, RoPE), and the first iteration of the cached keys; the row's
// own key and value come from shared memory instead of the cache. And the output projection, whose
// weight loads queue ahead of any issued after them, is let start only once the q/k/v row is in. On
// the H200, one row at 128 keys: 676-681 -> 623-630 µs a step (docs/GPU.md, session 43).
constexpr int kDecodeHeadDim = kAttnWarps * 32 / 2;  // the q and k heads side by side fill the block
template <class E, int LPK>
__global__ void __launch_bounds__(kAttnWarps * 32) decodeAttentionKernel(QkvArgs e, AttentionArgs a) {
  constexpr int U = kPackedUnrollEarly;
  __shared__ float qs[kDecodeHeadDim], ks[kDecodeHeadDim], vs[kDecodeHeadDim];
  const int t = blockIdx.x, h = blockIdx.y, c = blockIdx.z, hd = a.hd, half = hd / 2;
  const int kvh = h / (a.heads / a.kvHeads), HT = (hd + 31) & ~31, nw = HT >> 5;
  const bool isK = static_cast<int>(threadIdx.x) >= HT;
  const int d = isK ? threadIdx.x - HT : threadIdx.x;
  // This thread's q (or k) head and element, and its v element.
  const int head = isK ? a.heads + kvh : h, vHead = a.heads + a.kvHeads + kvh;
  const float* norm = isK ? e.kNorm : e.qNorm;
  const bool in = d < hd;
  const float weight = in && norm ? norm[d] : 0.0f;
  const float bias = in && e.bias ? e.bias[head * hd + d] : 0.0f, vBias = in && e.bias ? e.bias[vHead * hd + d] : 0.0f;
  const int last = a.positions[t], chunks = attentionChunks(last + 1);
  if (c >= chunks) return;
  const size_t cacheAt = (static_cast<size_t>(e.slots[t]) * a.kvHeads + kvh) * hd;
  const float2 cs = d < half ? e.rope[static_cast<size_t>(t) * half + d] : float2{};
  const PackedLane<LPK> p;
  KeyBatch<E, U> first;  // the row's own key (last) is loaded stale here and replaced below
  loadKeys<E, LPK, U>(first, a, a.blockTables + static_cast<size_t>(a.seqOf[t]) * a.maxBlocks, kvh, p.firstBase(c), chunkLastKey(last, c));
  awaitPrerequisites();  // the q/k/v GEMV
  const bool writes = c == chunks - 1;  // the chunk holding the row's own key
  const float* row = e.qkv + static_cast<size_t>(t) * (a.heads + 2 * a.kvHeads) * hd;
  float x = in ? row[static_cast<size_t>(head) * hd + d] + bias : 0.0f;
  const float nv = !isK && in ? row[static_cast<size_t>(vHead) * hd + d] + vBias : 0.0f;
  if (e.qNorm || e.kNorm) {  // block-uniform: both halves reduce together
    const float inv = headInverseRms(x, isK ? nw : 0, nw, hd, e.eps);
    if (in && norm) x = weight * (x * inv);
  }
  allowDependents();  // the output projection may start loading its weights
  float* v = isK ? ks : qs;
  if (in) v[d] = x;
  __syncthreads();
  if (d < half) {
    const float2 r = rotated(v[d], v[d + half], cs);
    v[d] = r.x;
    v[d + half] = r.y;
    if (isK && writes) {
      static_cast<E*>(e.kCache)[cacheAt + d] = store<E>(r.x);
      static_cast<E*>(e.kCache)[cacheAt + d + half] = store<E>(r.y);
    }
  }
  if (!isK && in) {
    vs[d] = nv;
    if (writes) static_cast<E*>(e.vCache)[cacheAt + d] = store<E>(nv);
  }
  __syncthreads();  // q and the new key and value in shared memory (and the cache)
  float q[1][8];
#pragma unroll
  for (int i = 0; i < 8; i++) q[0][i] = qs[p.part * 8 + i] * a.scale;
#pragma unroll
  for (int u = 0; u < U; u++)
    if (p.key(p.firstBase(c), u) == last) {
      first.k[u] = cachedEight<E>(ks + p.part * 8);
      first.v[u] = cachedEight<E>(vs + p.part * 8);
    }
  attendPacked<E, LPK, 1, U>(a, t, h, kvh, c, chunks, q, &first);
}

// One block per (row, query head) of a row split into chunks: the chunks' partials merged in chunk
// order, as the warps' are inside a block. Rows of one chunk were written by the attention kernel.
__global__ void attentionMergeKernel(AttentionArgs a) {
  allowDependents();  // the output projection may start loading its weights
  awaitPrerequisites();  // the attention kernel's partials (launched early for steps of a few rows)
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

// The q/k/v kernel and attention are scheduled early (PDL) for steps of a few rows, where each kernel's
// latency is the step's time; at 512 rows that measured 3-4 % slower (docs/GPU.md), so larger steps run
// kernels compiled without the PDL wait. Either way the same bits.
bool earlyAttention(int T) { return T <= kFewRows; }

template <class E>
void qkvFor(const QkvArgs& a, cudaStream_t s) {
  const int threads = roundUp32(a.hd);
  const bool early = earlyAttention(a.T);
  launchPdl("qkv", early, early ? qkvKernel<E, true> : qkvKernel<E, false>, dim3(a.T, a.heads + 2 * a.kvHeads), dim3(threads), a.hd * sizeof(float), s, a);
}

// The chunks' partials of rows split over blocks, merged (nothing when no row can be split); launched
// early as attention is, so the output projection's weights load while it runs (H200, one sequence at
// 1,024 keys: 943 -> 895 µs a step, docs/GPU.md).
void mergeChunks(const AttentionArgs& a, cudaStream_t s) {
  if (a.chunks > 1)
    launchPdl("attention merge", earlyAttention(a.T), attentionMergeKernel, dim3(a.T, a.heads), dim3(roundUp32(std::min(a.hd, 256))), 0, s, a);
}

template <class E, int DPL, bool Early>
auto attentionVariant(int g) {
  return g == 4 ? attentionKernel<E, DPL, 4, Early> : g == 2 ? attentionKernel<E, DPL, 2, Early> : attentionKernel<E, DPL, 1, Early>;
}

// G query heads per block (4, 2 or 1, at most `most`, so the registers hold) where G divides the group
// and the grid still has 4 blocks per SM (few rows keep one block per head: more blocks, shorter
// chains). The bits do not depend on G.
int headsPerBlock(const AttentionArgs& a, int most) {
  const int group = a.heads / a.kvHeads;
  const auto fits = [&](int g) { return group % g == 0 && g <= most && static_cast<long>(a.T) * a.heads / g >= 4L * smCount(); };
  return fits(4) ? 4 : fits(2) ? 2 : 1;
}

template <class E, int DPL>
void attentionGrouped(const AttentionArgs& a, cudaStream_t s) {
  const int g = headsPerBlock(a, 16 / DPL), threads = kAttnWarps * 32;
  const bool early = earlyAttention(a.T);
  const auto kernel = early ? attentionVariant<E, DPL, true>(g) : attentionVariant<E, DPL, false>(g);
  launchPdl("attention", early, kernel, dim3(a.T, a.heads / g, a.chunks), dim3(threads), 0, s, a);
  mergeChunks(a, s);
}

// K<E, hd / 8>::value for a packed head size hd (packedHeadDim): what is instantiated per lanes a key.
template <class E, template <class, int> class K>
auto forHeadDim(int hd) {
  return hd == 16 ? K<E, 2>::value : hd == 64 ? K<E, 8>::value : K<E, 16>::value;
}
template <class E, int LPK> struct DecodeKernel {
  static constexpr auto value = decodeAttentionKernel<E, LPK>;
};

template <class E>
void decodeAttentionFor(const QkvArgs& e, const AttentionArgs& a, cudaStream_t s) {
  launchPdl("attention", true, forHeadDim<E, DecodeKernel>(a.hd), dim3(a.T, a.heads, a.chunks), dim3(kAttnWarps * 32), 0, s, e, a);
  mergeChunks(a, s);
}

template <class E, int LPK> struct PackedLaunch {
  static void launch(const AttentionArgs& a, cudaStream_t s) {
    const bool early = earlyAttention(a.T);
    const int g = early ? 1 : headsPerBlock(a, 4);  // few rows: a block a query head (the only G built with the PDL wait; the bits do not depend on G)
    const auto kernel = early ? packedAttentionKernel<E, LPK, 1, true>
                        : g == 4 ? packedAttentionKernel<E, LPK, 4, false>
                        : g == 2 ? packedAttentionKernel<E, LPK, 2, false> : packedAttentionKernel<E, LPK, 1, false>;
    launchPdl("attention", early, kernel, dim3(a.T, a.heads / g, a.chunks), dim3(kAttnWarps * 32), 0, s, a);
    mergeChunks(a, s);
  }
  static constexpr auto value = launch;
};

template <class E>
void attentionFor(const AttentionArgs& a, cudaStream_t s) {
  if (packedHeadDim(a.hd)) forHeadDim<E, PackedLaunch>(a.hd)(a, s);
  else if (a.hd <= 32) attentionGrouped<E, 1>(a, s);
  else if (a.hd <= 64) attentionGrouped<E, 2>(a, s);
  else if (a.hd <= 128) attentionGrouped<E, 4>(a, s);
  else attentionGrouped<E, 8>(a, s);
}

}  // namespace

void qkvNormRopeCache(const QkvArgs& a, cudaStream_t s) {
  if (a.hd > 1024) throw std::invalid_argument("head_dim above 1024 is not supported on CUDA");
  if (a.kv == KvElem::F32) qkvFor<float>(a, s);
  else if (a.kv == KvElem::BF16) qkvFor<bf16>(a, s);
  else qkvFor<__half>(a, s);
}

bool decodeAttention(const QkvArgs& e, const AttentionArgs& a, cudaStream_t s) {
  if (!earlyAttention(a.T) || a.hd > kDecodeHeadDim || !packedHeadDim(a.hd)) return false;
  if (a.kv == KvElem::F32) decodeAttentionFor<float>(e, a, s);
  else if (a.kv == KvElem::BF16) decodeAttentionFor<bf16>(e, a, s);
  else decodeAttentionFor<__half>(e, a, s);
  launched("attention");
  return true;
}

void pagedAttention(const AttentionArgs& a, cudaStream_t s) {
  if (a.hd > 256) throw std::invalid_argument("head_dim above 256 is not supported on CUDA");
  if (a.kv == KvElem::F32) attentionFor<float>(a, s);
  else if (a.kv == KvElem::BF16) attentionFor<bf16>(a, s);
  else attentionFor<__half>(a, s);
  launched("attention");
}

}  // namespace weft::cuda
