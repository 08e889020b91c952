// Instruction-set specific inner loops, selected once at start-up.
// Each ISA file compiles its loops under its own `#pragma GCC target`, so the
// rest of the addon is plain x86-64 and runs on any CPU.
//
// Two compute modes share this table. float32: activations stay fp32 and
// weights are widened exactly (`matmul`). bfloat16: activations are rounded to
// bf16 at each matmul's input, weights are bf16, products accumulate in fp32
// (`matmulBf16`), as transformers computes a bf16 model.
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace weft {

// Row loops (norms, packing, activations, KV writes) fork threads only above this many rows:
// below it a fork costs more than the rows. Rows are independent, so the split never changes bits.
constexpr int kParallelRows = 8;

// F32/F16/BF16, GGUF's block-quantized types (see quant.h), and MLX's affine
// 4- and 8-bit groups (see mlx_quant.h).
// Q6_KW is not a file's type: a Q6_K matrix held in the amx set's panels, its weights widened to bytes
// (quant_panels.h); Q4_KD and Q5_KD neither: Q4_K and Q5_K rows with their scales decoded, as the
// AVX2 quantized matmul holds them (kquant_rows.h). Each is a PackedMatrix's panelType, never its dtype.
enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, Q8_0 = 8, Q4_0 = 9, Q4_1 = 10, Q4_K = 11, Q5_K = 12, Q6_K = 13, MLX4 = 20, MLX8 = 21, Q6_KW = 30, Q4_KD = 31, Q5_KD = 32 };

// MLX-quantized matrices: uint32 words of packed q plus a scale and a bias per group.
inline bool isMlx(DType d) { return d == DType::MLX4 || d == DType::MLX8; }
inline int mlxBits(DType d) { return d == DType::MLX4 ? 4 : 8; }

// Bytes per element of the float types (quantized types: tensorBytes in quant.h).
inline size_t dtypeBytes(DType d) { return d == DType::F32 ? 4 : 2; }

// Columns per packed group: a kernel tile is this many output columns wide.
constexpr int kPackCols = 4;

// A weight matrix (N outputs × K inputs) repacked for streaming: groups of
// kPackCols rows, each group stored chunk by chunk — [N/4][K/L][4][L] in the
// stored dtype (no widening), zero-padded to whole groups and chunks. A
// kernel tile then reads one contiguous stream, which is what lets a single
// decode sequence run at the memory's bandwidth.
//
// bfloat16 mode packs every matrix instead as bf16 pair tiles (`pairTiles`):
// [Np/16][Kp/32][16 pairs][16 columns][2], element (n, k) at pair k/2 of its
// tile, column n % 16, half k % 2. One tile (1 KiB) is exactly an AMX B tile,
// and one 64-byte row of it is one vdpbf16ps operand: 16 columns × 1 pair.
struct PackedMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int N = 0, K = 0;    // logical shape
  int Np = 0, Kp = 0;  // padded to kPackCols and to the chunk length (pair tiles: to kTileCols, kTileK)
  bool pairTiles = false;
  // MLX4/MLX8 only: `data` holds each row's K·bits/32 words as stored; `scales` and `biases`
  // hold N × K/group values each in `paramDtype` (BF16, F16 or F32, as stored).
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType paramDtype = DType::BF16;
  int group = 0;
  // Block-quantized matrices: the layout the set's kernel reads (dtype; in VNNI panels, or Q6_KW;
  // Q4_KD or Q5_KD for the AVX2 kernel's Q4_K and Q5_K).
  DType panelType = DType::F32;
};

// One matrix of several that read the same input rows (q/k/v, gate/up), and where its output goes.
struct MatrixProduct {
  const PackedMatrix* w;
  float* y;
};

// A bf16 pair tile: 16 output columns × 32 inputs.
constexpr int kTileCols = 16;
constexpr int kTileK = 32;

// y[t, n] = sum_k x[t, k] * w[n, k] for the column groups [g0, g1), all rows
// t < T. `xp` holds the rows packed by packActivations. Every output element
// is reduced in the same order whatever T is: a sequence's results do not
// depend on its batch.
using MatmulFn = void (*)(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1);
// A bfloat16-mode matmul's input rows: rounded to bf16 (T × Kp, natural order), and, for a
// set whose kernel reads them so (Kernels::widensBf16Rows), the same values widened exactly to
// fp32 at stride ld (widenedRowStride), once a matmul in its row pass.
struct Bf16Rows {
  const uint16_t* rounded;
  const float* widened;
  size_t ld;
};
// bfloat16 mode: y[t, n] = sum_k x[t, k] * w[n, k] for the column tiles [g0, g1)
// (16 columns each), all rows t < T of x (see Bf16Rows). Every kernel set but AMX reduces each output in pair order:
// for each pair p in turn, acc += x[2p+1]·w[2p+1], then acc += x[2p]·w[2p], each an
// fp32 FMA (a bf16 product is exact in fp32) — what one vdpbf16ps lane does, so
// these sets agree bit for bit (denormals aside: vdpbf16ps flushes them). AMX
// reduces in tile order: per 32-input tile, even and odd inputs each chained
// by FMAs, then acc += (even + odd) — what TDPBF16PS does on the CPUs we have
// measured. Either way the order is fixed per output: batch-invariant.
using MatmulBf16Fn = void (*)(const Bf16Rows& x, int T, const PackedMatrix& w, float* y, int g0, int g1);
// Whether a bfloat16 matmul reads its rows widened (the avx512 set's: one broadcast load an FMA).
bool readsWidenedBf16Rows(MatmulBf16Fn f);
// n bf16 values widened exactly to fp32 (an AVX-512 loop: only for a set that reads them so).
void widenBf16Row(const uint16_t* x, int n, float* out);
// The stride of widened rows: 16 floats past Kp, as rows 4 KiB apart would share L1 sets.
inline size_t widenedRowStride(int Kp) { return static_cast<size_t>(Kp) + 16; }
// float32 mode on bf16 pair tiles: y[t, n] = Σ_k x[t, k] · w[n, k] for the column tiles
// [g0, g1), all rows t < T, with x the fp32 rows as they are (T × Kp, zero padded) and the
// bf16 weights widened exactly; each output reduced in pair order, as MatmulBf16Fn. A set
// that has one (its float32 tile is short of FMA work per widened weight) gets its bf16
// matrices packed as pair tiles in float32 mode too.
using MatmulPairsF32Fn = void (*)(const float* x, int T, const PackedMatrix& w, float* y, int g0, int g1);
// Block-quantized weights (w.dtype Q8_0 … Q6_K, rows kept in ggml's block layout):
// y[t, n] = Σ_k x[t, k] · w[n, k] for the columns [n0, n1), all rows t < T, with `x`
// the rows quantized to int8 in 32-element blocks, one scale per weight block's worth
// (quantizeActivations, actScaleBlocks). Each weight block is decoded once and reused
// by every row t; integer dot products, fp32 accumulation in a fixed order: the AVX2
// and scalar sets in quant.h's (bit-identical to each other), the AVX-512 sets with VNNI and the amx
// set in the panels' (kernels_quant_panels.cpp; bit-identical to each other). Each
// order is batch-invariant.
struct QuantActBlock;
using MatmulQuantFn = void (*)(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
// The quantized matmul for a kernel set: vpdpbusd lanes on VNNI panels for the AVX-512
// sets when the CPU has AVX512-VNNI, AVX2 (vpmaddubsw) for avx2 and AVX-512 without VNNI, else scalar.
MatmulQuantFn quantMatmulFor(const char* kernelSet);
// Whether a quantized matmul reads its matrices in VNNI panels (quant_panels.h), packed at load,
// and whether its panels hold Q6_K's weights widened to bytes (Q6_KW: the amx set's tiles read
// them in place, where the VNNI lanes alone are faster on the file's 6-bit form).
bool readsQuantPanels(MatmulQuantFn f);
bool widensQ6Panels(MatmulQuantFn f);
// Whether a quantized matmul reads Q4_K and Q5_K matrices as rows with their scales decoded at
// load (Q4_KD, Q5_KD: kquant_rows.h), as the AVX2 one does.
bool decodesKScales(MatmulQuantFn f);
// MLX affine weights (w.dtype MLX4/MLX8): y[t, n] = Σ_k x[t, k] · w[n, k] for the columns
// [n0, n1), all rows t < T, x in fp32 (T × K, natural order). Each weight is dequantized
// exactly, w = fma(q, scale, bias) in fp32 (scale·q is exact for bf16/f16 scales, so this is
// scale·q + bias rounded once), and every output is reduced in one order that all kernel
// sets follow (see mlx_quant.h): bit-identical across sets and batch-invariant.
using MatmulMlxFn = void (*)(const float* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
// The MLX matmul for a kernel set: AVX-512 for the AVX-512 sets, AVX2 for avx2, else scalar.
MatmulMlxFn mlxMatmulFor(const char* kernelSet);
// y[i] += alpha * x[i]
using AxpyFn = void (*)(float alpha, const float* x, float* y, int n);

constexpr int kMaxScoreQueries = 6;
// f(std::integral_constant<int, nq>{}) for 1 <= nq <= kMaxScoreQueries: the score kernels take
// their query count as a template argument, so that their accumulators stay in registers.
template <class F>
inline void withQueryCount(int nq, F&& f) {
  switch (nq) {
    case 6: return f(std::integral_constant<int, 6>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}
// How far ahead (in keys) the value kernels prefetch: one 32-token block.
constexpr int kVRowsAhead = 32;

// Attention scores of up to kMaxScoreQueries queries against the first n keys of one cache
// block, keys stored dimension-major (kt[d * stride + j]):
// out[q][j] = scale * sum over d, in order, of qs[q][d] * kt[d * stride + j].
// Each key is a vector lane, so a score's value does not depend on how many
// keys or queries are computed with it. `ahead` (or null): the cache block the
// caller reads next, which the kernel may prefetch a row at a time while it
// computes; blocks sit anywhere in the pool, so no hardware prefetcher finds it.
using ScoresFn = void (*)(const float* const* qs, int nq, const float* kt, const void* ahead, int stride, int hd, int n, float scale,
                          float* const* out);
// Up to 3 queries' attention outputs: outs[q] = sum over keys j < ns[q], in key
// order, of ps[q][j] * vrows[j] (hd floats each). Each output element is a
// chain of FMAs in key order, as an axpy per key would compute it. The vector
// kernels prefetch the row kVRowsAhead keys on (rows are scattered by block).
using WeightedSumFn = void (*)(const float* const* ps, const int* ns, int nq, const float* const* vrows, int hd, float* const* outs);
// How a vector set's WeightedSumFn walks its keys: in runs of at most `width` dimensions, the keys
// every query has for all of them at once (each V vector loaded once for all), then each query's
// own remaining keys. run(nq, ps, j0, j1, d0, dims, outs, fresh), nq a std::integral_constant
// (1–3, as the caller's groups), accumulates keys [j0, j1) onto outs (from zero where fresh).
// Either way an output element sees its FMAs in key order.
template <class Run>
inline void weightedSumRuns(const float* const* ps, const int* ns, int nq, int hd, int width, float* const* outs, Run run) {
  int common = ns[0];
  for (int q = 1; q < nq; q++) common = ns[q] < common ? ns[q] : common;
  for (int d0 = 0; d0 < hd; d0 += width) {
    const int dims = hd - d0 < width ? hd - d0 : width;
    switch (nq) {
      case 3: run(std::integral_constant<int, 3>{}, ps, 0, common, d0, dims, outs, true); break;
      case 2: run(std::integral_constant<int, 2>{}, ps, 0, common, d0, dims, outs, true); break;
      default: run(std::integral_constant<int, 1>{}, ps, 0, common, d0, dims, outs, true); break;
    }
    for (int q = 0; q < nq; q++)
      if (ns[q] > common) run(std::integral_constant<int, 1>{}, ps + q, common, ns[q], d0, dims, outs + q, false);
  }
}
// A bf16/f16 KV cache: ScoresFn and WeightedSumFn over 16-bit elements of type `kv`, each
// widened exactly to fp32 in registers, then reduced in the same order as the fp32 kernels
// (so a row's result is as independent of its batch as with an fp32 cache).
using ScoresHalfFn = void (*)(const float* const* qs, int nq, const uint16_t* kt, const void* ahead, DType kv, int stride, int hd, int n,
                              float scale, float* const* out);
using WeightedSumHalfFn = void (*)(const float* const* ps, const int* ns, int nq, const uint16_t* const* vrows, DType kv, int hd, float* const* outs);
// The element a KV pool of dtype D stores.
template <DType D>
struct KvElemOf { using type = uint16_t; };
template <>
struct KvElemOf<DType::F32> { using type = float; };
template <DType D>
using KvElem = typename KvElemOf<D>::type;
// Asks for the n cached elements at p, a line at a time, into L2: cache blocks sit anywhere in
// the pool, where no hardware prefetcher looks, so the attention kernels fetch the next ones.
// (Into L1 they held the core's few L1 miss buffers: attention took 9 % longer at 32 sequences.)
template <DType D>
inline void prefetchRow(const KvElem<D>* p, int n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (size_t o = 0; o < n * sizeof(KvElem<D>); o += 64) __builtin_prefetch(c + o, 0, 2);
}
// g[i] = silu(g[i]) * u[i]
using SiluMulFn = void (*)(float* g, const float* u, int n);
// s[i] = exp(s[i] - max); returns the sum of the new s, in a fixed order.
using ExpSumFn = float (*)(float* s, int n, float max);
// out[i] = f32ToBf16(x[i]) (nearest even; NaN kept a quiet NaN): every set gives the same bits.
using RoundBf16Fn = void (*)(const float* x, int n, uint16_t* out);
void roundBf16Scalar(const float* x, int n, uint16_t* out);

struct Kernels {
  const char* name;
  // Elements per chunk (two vector widths): bf16 chunks are split into even
  // and odd elements in registers, so activations are packed to match.
  int chunk;
  MatmulFn matmul;
  AxpyFn axpy;
  SiluMulFn siluMul;
  ExpSumFn expSum;
  ScoresFn scores;
  WeightedSumFn weightedSum;
  MatmulBf16Fn matmulBf16;
  // Whether `--dtype auto` picks bfloat16 with this set: where it is the set chosen for the
  // CPU's bf16 instructions (amx, avx512bf16; avx512 where vdpbf16ps runs at half the FMA rate).
  bool bf16ByDefault;
  // Attention over a bf16/f16 KV cache (assigned by name after the positional fields).
  ScoresHalfFn scoresHalf = nullptr;
  WeightedSumHalfFn weightedSumHalf = nullptr;
  // Activation rows rounded to bf16 for the bf16 matmuls (assigned by name as above).
  RoundBf16Fn roundBf16 = roundBf16Scalar;
  // Block-quantized weights; chosen from the set's name (sets copied from
  // another inherit its choice, as avx512bf16 inherits avx512's; amx sets its own).
  MatmulQuantFn matmulQuant = quantMatmulFor(name);
  // Whether matmulQuant reads block-quantized matrices in VNNI panels, packed at load.
  bool quantPanels() const { return readsQuantPanels(matmulQuant); }
  bool wideQ6Panels() const { return widensQ6Panels(matmulQuant); }
  bool decodedKRows() const { return decodesKScales(matmulQuant); }
  bool widensBf16Rows() const { return readsWidenedBf16Rows(matmulBf16); }
  // float32 mode on bf16 pair tiles, where the set reads bf16 weights so (nullptr: groups).
  MatmulPairsF32Fn matmulPairsF32 = nullptr;
  // MLX affine weights, chosen from the set's name in the same way.
  MatmulMlxFn matmulMlx = mlxMatmulFor(name);
};

const Kernels& kernelsAmx();
const Kernels& kernelsAvx512Bf16();
const Kernels& kernelsAvx512();
const Kernels& kernelsAvx2();
const Kernels& kernelsScalar();

// The kernels in use: the best of AMX, AVX512_BF16, AVX-512, AVX2 and scalar
// that the CPU (and, for AMX, the kernel) allows, AVX512_BF16 only where its dot
// product is the faster (CpuFeatures::bf16DotHalfRate). The four vector sets share
// the AVX-512 fp32 loops where they have AVX-512. WEFT_ISA=amx|avx512bf16|
// avx512|avx2|scalar forces one (an unsupported choice is refused).
const Kernels& activeKernels();

// The CPU features behind the choice (CPUID, and AMX tile permission granted by Linux).
struct CpuFeatures {
  bool avx2, avx512, avx512vnni, avx512bf16, amx;
  // vdpbf16ps issues at half the rate of two fp32 FMAs, so the same products take longer by
  // it than by FMAs on widened weights: on Intel's cores (bf16 dot 186 against fp32 387 GFLOP/s on
  // two Emerald Rapids vCPUs, 704 against 1,402 on 16 Sapphire Rapids cores; Zen 4's is twice its
  // FMA rate). There bfloat16 mode without AMX takes the avx512 set (docs/PERFORMANCE.md, session 44).
  bool bf16DotHalfRate;
};
const CpuFeatures& cpuFeatures();

// Rows of x (T × K) → the layout the kernels read (T × Kp): for bf16 weights
// each chunk holds its even elements then its odd ones; otherwise natural order.
void packActivations(const float* x, int T, int K, int Kp, int chunk, DType weightDtype, float* out);

// A row of x (K values) rounded to bf16 (nearest even, k.roundBf16) → Kp, zero padded: a bfloat16
// mode matmul's input row.
void packRowBf16(const Kernels& k, const float* x, int K, int Kp, uint16_t* out);

// Where element k of an activation row sits in that packed layout.
inline int packedIndex(int k, int chunk, DType weightDtype) {
  if (weightDtype != DType::BF16) return k;
  return k / chunk * chunk + (k % 2) * (chunk / 2) + (k % chunk) / 2;
}

// Widening loads shared by the scalar paths.
inline float bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
float f16ToF32(uint16_t h);
// Nearest-even rounding to IEEE half, as torch's .to(float16) and vcvtps2ph: beyond 65504 is
// infinity, below 2^-14 subnormal; NaN stays NaN.
inline uint16_t f32ToF16(float f) {
  uint32_t x;
  __builtin_memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x > 0x7F800000u) return sign | 0x7E00u | static_cast<uint16_t>((x >> 13) & 0x3FFu);
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // 65520 and up round to infinity
  if (x >= 0x38800000u) {                       // a normal half: rebias the exponent, round 13 bits away
    x -= 0x38000000u;
    x += 0xFFFu + ((x >> 13) & 1u);
    return sign | static_cast<uint16_t>(x >> 13);
  }
  // Subnormal: adding 0.5 leaves a value whose ulp is 2^-24, the half's subnormal step, so the
  // FPU's own nearest-even rounding picks the count of steps (0x400 is the smallest normal).
  float a, t;
  __builtin_memcpy(&a, &x, 4);
  t = a + 0.5f;
  uint32_t bits;
  __builtin_memcpy(&bits, &t, 4);
  return sign | static_cast<uint16_t>(bits - 0x3F000000u);
}
// Nearest-even rounding, as torch's .to(bfloat16); NaN stays NaN.
inline uint16_t f32ToBf16(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

}  // namespace weft
