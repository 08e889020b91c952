// Portable loops: the fallback for CPUs without AVX2, and the ISA selector.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include "kernels.h"

namespace weft {

float f16ToF32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { mant <<= 1; e++; } while (!(mant & 0x400));
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000 | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

namespace {

constexpr int L = 16;  // the AVX2 layout: chunks of two 8-element halves

float weightAt(const void* w, DType dtype, size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(w)[i];
    case DType::F16: return f16ToF32(static_cast<const uint16_t*>(w)[i]);
    case DType::BF16: return bf16ToF32(static_cast<const uint16_t*>(w)[i]);
  }
  return 0.0f;
}

// Reads the packed chunks lane by lane; bf16 chunks are split into even and odd
// halves as the vector kernels do, so x (packed to match) lines up.
void matmul(const float* xp, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  for (int t = 0; t < T; t++)
    for (int g = g0; g < g1; g++)
      for (int c = 0; c < kPackCols && g * kPackCols + c < w.N; c++) {
        float s = 0.0f;
        for (int k = 0; k < w.Kp; k += L) {
          size_t at = (static_cast<size_t>(g) * kPackCols * w.Kp) + static_cast<size_t>(k) * kPackCols + c * L;
          const float* x = xp + static_cast<size_t>(t) * w.Kp + k;
          for (int i = 0; i < L; i++) {
            int src = w.dtype == DType::BF16 ? (i < L / 2 ? 2 * i : 2 * (i - L / 2) + 1) : i;
            s += x[i] * weightAt(w.data, w.dtype, at + src);
          }
        }
        y[static_cast<size_t>(t) * w.N + g * kPackCols + c] = s;
      }
}

void axpy(float alpha, const float* x, float* y, int n) {
  for (int i = 0; i < n; i++) y[i] += alpha * x[i];
}

void siluMul(float* g, const float* u, int n) {
  for (int i = 0; i < n; i++) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

float expSum(float* s, int n, float max) {
  float sum = 0.0f;
  for (int i = 0; i < n; i++) sum += s[i] = std::exp(s[i] - max);
  return sum;
}

void scores(const float* const* qs, int nq, const float* kt, int stride, int hd, int n, float scale, float* const* out) {
  for (int q = 0; q < nq; q++)
    for (int j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int d = 0; d < hd; d++) acc = std::fma(qs[q][d], kt[static_cast<size_t>(d) * stride + j], acc);
      out[q][j] = acc * scale;
    }
}

void weightedSum(const float* const* ps, const int* ns, int nq, const float* const* vrows, int hd, float* const* outs) {
  for (int q = 0; q < nq; q++) {
    float* o = outs[q];
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int j = 0; j < ns[q]; j++) axpy(ps[q][j], vrows[j], o, hd);
  }
}

const Kernels& select() {
  __builtin_cpu_init();
  bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl");
  bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const char* forced = std::getenv("WEFT_ISA");
  std::string want = forced ? forced : "";
  if (want == "scalar") return kernelsScalar();
  if (want == "avx2") {
    if (!has2) throw std::runtime_error("WEFT_ISA=avx2 but this CPU lacks AVX2/FMA/F16C");
    return kernelsAvx2();
  }
  if (want == "avx512" && !has512) throw std::runtime_error("WEFT_ISA=avx512 but this CPU lacks AVX-512");
  if (!want.empty() && want != "avx512") throw std::runtime_error("WEFT_ISA must be avx512, avx2 or scalar");
  if (has512) return kernelsAvx512();
  if (has2) return kernelsAvx2();
  return kernelsScalar();
}

}  // namespace

void packActivations(const float* x, int T, int K, int Kp, int chunk, DType weightDtype, float* out) {
  for (int t = 0; t < T; t++) {
    const float* xr = x + static_cast<size_t>(t) * K;
    float* o = out + static_cast<size_t>(t) * Kp;
    std::fill(o, o + Kp, 0.0f);
    for (int k = 0; k < K; k++) o[packedIndex(k, chunk, weightDtype)] = xr[k];
  }
}

const Kernels& kernelsScalar() {
  static const Kernels k{"scalar", L, matmul, axpy, siluMul, expSum, scores, weightedSum};
  return k;
}

const Kernels& activeKernels() {
  static const Kernels& k = select();
  return k;
}

}  // namespace weft
