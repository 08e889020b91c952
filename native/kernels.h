// Instruction-set specific inner loops, selected once at start-up.
// Each ISA file compiles its loops under its own `#pragma GCC target`, so the
// rest of the addon is plain x86-64 and runs on any CPU.
#pragma once
#include <cstddef>
#include <cstdint>

namespace weft {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

inline size_t dtypeBytes(DType d) { return d == DType::F32 ? 4 : 2; }

// Columns per packed group: a kernel tile is this many output columns wide.
constexpr int kPackCols = 4;

// A weight matrix (N outputs × K inputs) repacked for streaming: groups of
// kPackCols rows, each group stored chunk by chunk — [N/4][K/L][4][L] in the
// stored dtype (no widening), zero-padded to whole groups and chunks. A
// kernel tile then reads one contiguous stream, which is what lets a single
// decode sequence run at the memory's bandwidth.
struct PackedMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int N = 0, K = 0;    // logical shape
  int Np = 0, Kp = 0;  // padded to kPackCols and to the chunk length
};

// y[t, n] = sum_k x[t, k] * w[n, k] for the column groups [g0, g1), all rows
// t < T. `xp` holds the rows packed by packActivations. Every output element
// is reduced in the same order whatever T is: a sequence's results do not
// depend on its batch.
using MatmulFn = void (*)(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1);
// y[i] += alpha * x[i]
using AxpyFn = void (*)(float alpha, const float* x, float* y, int n);

constexpr int kMaxScoreQueries = 6;

// Attention scores of up to kMaxScoreQueries queries against the first n keys of one cache
// block, keys stored dimension-major (kt[d * stride + j]):
// out[q][j] = scale * sum over d, in order, of qs[q][d] * kt[d * stride + j].
// Each key is a vector lane, so a score's value does not depend on how many
// keys or queries are computed with it.
using ScoresFn = void (*)(const float* const* qs, int nq, const float* kt, int stride, int hd, int n, float scale, float* const* out);
// Up to 3 queries' attention outputs: outs[q] = sum over keys j < ns[q], in key
// order, of ps[q][j] * vrows[j] (hd floats each). Each output element is a
// chain of FMAs in key order, as an axpy per key would compute it.
using WeightedSumFn = void (*)(const float* const* ps, const int* ns, int nq, const float* const* vrows, int hd, float* const* outs);
// g[i] = silu(g[i]) * u[i]
using SiluMulFn = void (*)(float* g, const float* u, int n);
// s[i] = exp(s[i] - max); returns the sum of the new s, in a fixed order.
using ExpSumFn = float (*)(float* s, int n, float max);

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
};

const Kernels& kernelsAvx512();
const Kernels& kernelsAvx2();
const Kernels& kernelsScalar();

// The kernels in use: AVX-512 when the CPU has it, else AVX2, else scalar.
// WEFT_ISA=avx2|scalar|avx512 forces one (an unsupported choice is refused).
const Kernels& activeKernels();

// Rows of x (T × K) → the layout the kernels read (T × Kp): for bf16 weights
// each chunk holds its even elements then its odd ones; otherwise natural order.
void packActivations(const float* x, int T, int K, int Kp, int chunk, DType weightDtype, float* out);

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

}  // namespace weft
