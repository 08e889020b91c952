// Portable loops: the fallback for CPUs without AVX2, and the ISA selector.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
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
    default: break;  // quantized matrices go through matmulQuant
  }
  return 0.0f;
}

// Reads the packed chunks lane by lane; bf16 chunks (16 elements here) are split into even
// and odd halves, the layout packActivations gives bf16 rows, so x (packed to match) lines up.
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

// Pair order (see MatmulBf16Fn), one output at a time.
void matmulBf16(const Bf16Rows& rows, int T, const PackedMatrix& w, float* y, int g0, int g1) {
  const uint16_t* xp = rows.rounded;
  const auto* wd = static_cast<const uint16_t*>(w.data);
  const int tiles = w.Kp / kTileK;
  for (int t = 0; t < T; t++)
    for (int g = g0; g < g1; g++)
      for (int c = 0; c < kTileCols && g * kTileCols + c < w.N; c++) {
        const uint16_t* x = xp + static_cast<size_t>(t) * w.Kp;
        float acc = 0.0f;
        for (int p = 0; p < w.Kp / 2; p++) {
          const uint16_t* pair = wd + ((static_cast<size_t>(g) * tiles + p / 16) * 16 + p % 16) * kTileCols * 2 + c * 2;
          acc = std::fma(bf16ToF32(x[2 * p + 1]), bf16ToF32(pair[1]), acc);
          acc = std::fma(bf16ToF32(x[2 * p]), bf16ToF32(pair[0]), acc);
        }
        y[static_cast<size_t>(t) * w.N + g * kTileCols + c] = acc;
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

// A cached K/V element widened exactly to fp32.
inline float widenKv(float x) { return x; }
inline float widenKv(uint16_t x, DType kv) { return kv == DType::F16 ? f16ToF32(x) : bf16ToF32(x); }

template <class E, class Widen>
void scoresTyped(const float* const* qs, int nq, const E* kt, int stride, int hd, int n, float scale, float* const* out, Widen widen) {
  for (int q = 0; q < nq; q++)
    for (int j = 0; j < n; j++) {
      float acc = 0.0f;
      for (int d = 0; d < hd; d++) acc = std::fma(qs[q][d], widen(kt[static_cast<size_t>(d) * stride + j]), acc);
      out[q][j] = acc * scale;
    }
}

// Each output element: y += p * v per key, in key order, as axpy computes it.
template <class E, class Widen>
void weightedSumTyped(const float* const* ps, const int* ns, int nq, const E* const* vrows, int hd, float* const* outs, Widen widen) {
  for (int q = 0; q < nq; q++) {
    float* o = outs[q];
    for (int d = 0; d < hd; d++) o[d] = 0.0f;
    for (int j = 0; j < ns[q]; j++)
      for (int d = 0; d < hd; d++) o[d] += ps[q][j] * widen(vrows[j][d]);
  }
}

// The reference does not prefetch (`ahead` is a hint).
void scores(const float* const* qs, int nq, const float* kt, const void*, int stride, int hd, int n, float scale, float* const* out) {
  scoresTyped(qs, nq, kt, stride, hd, n, scale, out, [](float x) { return widenKv(x); });
}

void weightedSum(const float* const* ps, const int* ns, int nq, const float* const* vrows, int hd, float* const* outs) {
  weightedSumTyped(ps, ns, nq, vrows, hd, outs, [](float x) { return widenKv(x); });
}

void scoresHalf(const float* const* qs, int nq, const uint16_t* kt, const void*, DType kv, int stride, int hd, int n, float scale,
                float* const* out) {
  scoresTyped(qs, nq, kt, stride, hd, n, scale, out, [kv](uint16_t x) { return widenKv(x, kv); });
}

void weightedSumHalf(const float* const* ps, const int* ns, int nq, const uint16_t* const* vrows, DType kv, int hd, float* const* outs) {
  weightedSumTyped(ps, ns, nq, vrows, hd, outs, [kv](uint16_t x) { return widenKv(x, kv); });
}

// Linux grants AMX tile state only on request (ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA).
bool requestAmx() {
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
}

CpuFeatures detect() {
  __builtin_cpu_init();
  CpuFeatures f{};
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  f.avx512vnni = f.avx512 && f.avx2 && __builtin_cpu_supports("avx512vnni");
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool leaf7 = __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const bool amxBf16 = leaf7 && (d >> 22 & 1) && (d >> 24 & 1);  // AMX-BF16, AMX-TILE
  const bool bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);  // AVX512_BF16
  f.avx512bf16 = f.avx512 && bf16;
  f.amx = f.avx512bf16 && amxBf16 && requestAmx();
  f.bf16DotHalfRate = f.avx512bf16 && __builtin_cpu_is("intel");
  return f;
}

const Kernels& select() {
  const CpuFeatures& f = cpuFeatures();
  const char* forced = std::getenv("WEFT_ISA");
  const std::string want = forced ? forced : "";
  struct Choice { const char* name; bool ok; const Kernels& (*kernels)(); const char* lack; bool slower = false; };
  const Choice choices[] = {
      {"amx", f.amx, kernelsAmx, "AMX-BF16 (or Linux refused the tile permission)"},
      {"avx512bf16", f.avx512bf16, kernelsAvx512Bf16, "AVX512_BF16", f.bf16DotHalfRate},
      {"avx512", f.avx512, kernelsAvx512, "AVX-512"},
      {"avx2", f.avx2, kernelsAvx2, "AVX2/FMA/F16C"},
      {"scalar", true, kernelsScalar, ""},
  };
  for (const Choice& c : choices) {
    if (want.empty() && c.ok && !c.slower) return c.kernels();
    if (want == c.name) {
      if (!c.ok) throw std::runtime_error("WEFT_ISA=" + want + " but this CPU lacks " + c.lack);
      return c.kernels();
    }
  }
  throw std::runtime_error("WEFT_ISA must be amx, avx512bf16, avx512, avx2 or scalar");
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

void roundBf16Scalar(const float* x, int n, uint16_t* out) {
  for (int i = 0; i < n; i++) out[i] = f32ToBf16(x[i]);
}

void packRowBf16(const Kernels& k, const float* x, int K, int Kp, uint16_t* out) {
  k.roundBf16(x, K, out);
  std::fill(out + K, out + Kp, static_cast<uint16_t>(0));
}

const Kernels& kernelsScalar() {
  static const Kernels k = [] {
    Kernels s{"scalar", L, matmul, axpy, siluMul, expSum, scores, weightedSum, matmulBf16, false};
    s.scoresHalf = scoresHalf;
    s.weightedSumHalf = weightedSumHalf;
    return s;
  }();
  return k;
}

const CpuFeatures& cpuFeatures() {
  static const CpuFeatures f = detect();
  return f;
}

const Kernels& activeKernels() {
  static const Kernels& k = select();
  return k;
}

}  // namespace weft
