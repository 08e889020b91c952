// Instruction-set specific inner loops, selected once at start-up.
// Each ISA file compiles its loops under its own `#pragma GCC target`, so the
// rest of the addon is plain x86-64 and runs on any CPU.
#pragma once
#include <cstddef>
#include <cstdint>

namespace weft {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2 };

// y[t, n] = sum_k x[t, k] * w[n, k] for columns n in [n0, n1), all rows t < T.
// Every output element is reduced in the same order whatever T is: this is
// what makes a sequence's logits independent of its batch.
using MatmulFn = void (*)(const float* x, int T, int K, const void* w, DType dtype,
                          float* y, int N, int n0, int n1);
// sum_i a[i] * b[i], fixed order.
using DotFn = float (*)(const float* a, const float* b, int n);
// y[i] += alpha * x[i]
using AxpyFn = void (*)(float alpha, const float* x, float* y, int n);

struct Kernels {
  const char* name;
  MatmulFn matmul;
  DotFn dot;
  AxpyFn axpy;
};

const Kernels& kernelsAvx512();
const Kernels& kernelsAvx2();
const Kernels& kernelsScalar();

// The kernels in use: AVX-512 when the CPU has it, else AVX2, else scalar.
// WEFT_ISA=avx2|scalar|avx512 forces one (an unsupported choice is refused).
const Kernels& activeKernels();

// Widening loads shared by the scalar paths.
inline float bf16ToF32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
float f16ToF32(uint16_t h);

}  // namespace weft
