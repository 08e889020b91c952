// Weight quantization into ggml's blocks. Every scale is a least-squares fit:
// candidate scales are tried (the block's extreme value mapped onto, or a little
// inside, each end of the integer range), each candidate's rounding is followed by
// the scale (and min) that minimize the block's squared error for that rounding,
// and the best is refined by re-rounding. The super-block scales of the K-quants
// are then quantized to 6 or 8 bits, and the super-block's d (and dmin) refitted
// by least squares for those integer scales. The rounding that is written is
// always computed with the scales as they are stored (f16 d, integer sub-scales).
#include "quantize.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include "quant.h"

namespace weft {
namespace {

// Nearest, ties to even, without a libm call (the baseline x86-64 has no roundss):
// adding 1.5·2^23 leaves no fraction bits. Callers clamp the result to a small range.
inline int roundInt(float v) {
  v = std::min(std::max(v, -4194304.f), 4194304.f);
  return static_cast<int>((v + 12582912.f) - 12582912.f);
}
inline int clampInt(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
inline float half(float v) { return f16ToF32(f32ToF16(v)); }
inline void putHalf(uint8_t* p, float v) {
  const uint16_t h = f32ToF16(v);
  std::memcpy(p, &h, 2);
}

// v rounded to the nearest integer in [lo, hi] (ties to even), as a float: for integer
// bounds clamping first gives the same result, and adding 1.5·2^23 leaves no fraction
// bits. Plain float operations, so that the search loops vectorize.
inline float roundClamp(float v, float lo, float hi) {
  v = std::min(std::max(v, lo), hi);
  return (v + 12582912.f) - 12582912.f;
}

// How widely fitSymmetric searches: the extreme value onto qmin only, or onto
// either end, and how many candidates (steps of a tenth of a level) around each.
struct Search {
  int below, above;  // candidates qmin + 0.1·k, k ∈ [−below, above] (and qmax − 0.1·k)
  bool bothEnds;
};
constexpr Search kWide{5, 10, true}, kNarrow{4, 6, false}, kNone{0, 0, true};

// x ≈ s·q with q ∈ [qmin, qmax]: the s with the least squared error among the
// candidate roundings of `search`, then refined by re-rounding.
float fitSymmetric(const float* x, int n, int qmin, int qmax, Search search) {
  float amax = 0, peak = 0, sxx = 0;
  for (int i = 0; i < n; i++) {
    if (std::fabs(x[i]) > amax) amax = std::fabs(x[i]), peak = x[i];
    sxx += x[i] * x[i];
  }
  if (amax == 0) return 0;
  const float lo = static_cast<float>(qmin), hi = static_cast<float>(qmax);
  double bestErr = std::numeric_limits<double>::infinity();
  float best = 0;
  // Rounds x with scale s, fits the scale to that rounding (Σxq / Σq²); keeps the best.
  auto tryScale = [&](float s) {
    const float inv = 1 / s;
    if (!(s != 0) || !std::isfinite(inv)) return;
    float sxq = 0, sqq = 0;
#pragma omp simd reduction(+ : sxq, sqq)
    for (int i = 0; i < n; i++) {
      const float q = roundClamp(x[i] * inv, lo, hi);
      sxq += x[i] * q;
      sqq += q * q;
    }
    if (sqq == 0) return;
    const double err = sxx - static_cast<double>(sxq) * sxq / sqq;
    if (err < bestErr) bestErr = err, best = sxq / sqq;
  };
  // The extreme value onto either end of the range (qmin is the longer end), or up to
  // a level inside or half a level outside it.
  for (int k = -search.below; k <= search.above; k++) {
    tryScale(peak / (qmin + 0.1f * k));
    if (search.bothEnds) tryScale(peak / (qmax - 0.1f * k));
  }
  for (int it = 0; it < 2; it++) tryScale(best);
  return best;
}

// x ≈ a·q − m with q ∈ [0, qmax], a ≥ 0, m ≥ 0 (the range always holds 0, as ggml's K-quants do).
void fitAffine(const float* x, int n, int qmax, float& a, float& m) {
  float lo = 0, hi = x[0], sx = 0, sxx = 0;
  for (int i = 0; i < n; i++) {
    lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    sx += x[i], sxx += x[i] * x[i];
  }
  a = 0;
  m = -lo;
  if (hi <= lo) return;
  const float top = static_cast<float>(qmax);
  double bestErr = std::numeric_limits<double>::infinity();
  // Rounds x for x ≈ scale·q + base, fits a and b to that rounding by least squares
  // (b ≤ 0); keeps the best by Σ(x − a·q − b)², expanded in the sums.
  auto tryScale = [&](float scale, float base) {
    const float inv = 1 / scale;
    if (!(scale > 0) || !std::isfinite(inv)) return;
    float sq = 0, sqq = 0, sxq = 0;
#pragma omp simd reduction(+ : sq, sqq, sxq)
    for (int i = 0; i < n; i++) {
      const float q = roundClamp((x[i] - base) * inv, 0.f, top);
      sq += q;
      sqq += q * q;
      sxq += x[i] * q;
    }
    const double det = static_cast<double>(n) * sqq - static_cast<double>(sq) * sq;
    if (det <= 0) return;
    double fa = (n * static_cast<double>(sxq) - static_cast<double>(sq) * sx) / det;
    double fb = (static_cast<double>(sqq) * sx - static_cast<double>(sq) * sxq) / det;
    if (fb > 0) fb = 0, fa = static_cast<double>(sxq) / sqq;  // the min may not go above zero
    if (!(fa > 0)) return;
    const double err = sxx - 2 * fa * sxq - 2 * fb * sx + fa * fa * sqq + 2 * fa * fb * sq + n * fb * fb;
    if (err < bestErr) bestErr = err, a = static_cast<float>(fa), m = static_cast<float>(-fb);
  };
  for (int k = -10; k <= 10; k++) tryScale((hi - lo) / (qmax + 0.1f * k), lo);
  for (int it = 0; it < 2; it++) tryScale(a, -m);
}

void blockQ8_0(const float* x, uint8_t* out) {
  const float d = half(fitSymmetric(x, 32, -127, 127, kNone));
  const float inv = d != 0 ? 1 / d : 0;
  putHalf(out, d);
  for (int i = 0; i < 32; i++) out[2 + i] = static_cast<uint8_t>(static_cast<int8_t>(clampInt(roundInt(x[i] * inv), -127, 127)));
}

void blockQ4_0(const float* x, uint8_t* out) {
  const float d = half(fitSymmetric(x, 32, -8, 7, kWide));
  const float inv = d != 0 ? 1 / d : 0;
  putHalf(out, d);
  for (int i = 0; i < 16; i++) {
    const int lo = clampInt(roundInt(x[i] * inv), -8, 7) + 8, hi = clampInt(roundInt(x[i + 16] * inv), -8, 7) + 8;
    out[2 + i] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// Q4_K (five = false) and Q5_K: 8 sub-blocks of 32, x ≈ d·ls·q − dmin·lm with 6-bit ls, lm.
void blockQ45K(const float* x, uint8_t* out, bool five) {
  const int qmax = five ? 31 : 15;
  float a[8], m[8];
  for (int j = 0; j < 8; j++) fitAffine(x + 32 * j, 32, qmax, a[j], m[j]);
  const float amax = *std::max_element(a, a + 8), mmax = *std::max_element(m, m + 8);
  float d = half(amax / 63), dmin = half(mmax / 63);
  int ls[8], lm[8];
  for (int j = 0; j < 8; j++) {
    ls[j] = d > 0 ? clampInt(roundInt(a[j] / d), 0, 63) : 0;
    lm[j] = dmin > 0 ? clampInt(roundInt(m[j] / dmin), 0, 63) : 0;
  }
  int q[256];
  // Rounds every value for (d, dmin); returns the squared error.
  auto roundAll = [&](float dd, float dm, int* qo) {
    float err = 0;
    for (int j = 0; j < 8; j++) {
      const float s = dd * ls[j], mm = dm * lm[j], inv = s > 0 ? 1 / s : 0;
      for (int i = 32 * j; i < 32 * j + 32; i++) {
        qo[i] = clampInt(roundInt((x[i] + mm) * inv), 0, qmax);
        const float e = x[i] - (s * qo[i] - mm);
        err += e * e;
      }
    }
    return err;
  };
  float err = roundAll(d, dmin, q);
  // Refit d and dmin for these integer scales: x ≈ d·u − dmin·v, u = ls·q, v = lm.
  for (int it = 0; it < 2; it++) {
    double uu = 0, uv = 0, vv = 0, xu = 0, xv = 0;
    for (int i = 0; i < 256; i++) {
      const double u = static_cast<double>(ls[i / 32]) * q[i], v = lm[i / 32];
      uu += u * u, uv += u * v, vv += v * v, xu += x[i] * u, xv += x[i] * v;
    }
    double nd, nm;
    const double det = uu * vv - uv * uv;
    if (vv == 0) nd = uu > 0 ? xu / uu : 0, nm = 0;
    else if (det > 0) nd = (xu * vv - xv * uv) / det, nm = (xu * uv - xv * uu) / det;
    else break;
    if (nd < 0 || nm < 0) break;
    const float fd = half(static_cast<float>(nd)), fm = half(static_cast<float>(nm));
    int q2[256];
    const float e2 = roundAll(fd, fm, q2);
    if (!(e2 < err)) break;
    err = e2, d = fd, dmin = fm;
    std::memcpy(q, q2, sizeof q);
  }
  putHalf(out, d);
  putHalf(out + 2, dmin);
  uint8_t* sc = out + 4;
  for (int j = 0; j < 4; j++) {
    sc[j] = static_cast<uint8_t>(ls[j] | ((ls[j + 4] >> 4) << 6));
    sc[j + 4] = static_cast<uint8_t>(lm[j] | ((lm[j + 4] >> 4) << 6));
    sc[j + 8] = static_cast<uint8_t>((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
  }
  uint8_t* qs = out + (five ? 48 : 16);
  if (five) std::memset(out + 16, 0, 32);
  for (int c = 0; c < 4; c++)
    for (int l = 0; l < 32; l++) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      if (five) out[16 + l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}

// Q6_K: 16 sub-blocks of 16, x ≈ d·sc·q with int8 sc and q ∈ [−32, 31].
void blockQ6K(const float* x, uint8_t* out) {
  float s[16];
  float peak = 0;
  for (int k = 0; k < 16; k++) {
    s[k] = fitSymmetric(x + 16 * k, 16, -32, 31, kNarrow);
    if (std::fabs(s[k]) > std::fabs(peak)) peak = s[k];
  }
  float d = half(peak / -128);
  int sc[16];
  for (int k = 0; k < 16; k++) sc[k] = d != 0 ? clampInt(roundInt(s[k] / d), -128, 127) : 0;
  int q[256];
  auto roundAll = [&](float dd, int* qo) {
    float err = 0;
    for (int k = 0; k < 16; k++) {
      const float step = dd * sc[k], inv = step != 0 ? 1 / step : 0;
      for (int i = 16 * k; i < 16 * k + 16; i++) {
        qo[i] = clampInt(roundInt(x[i] * inv), -32, 31);
        const float e = x[i] - step * qo[i];
        err += e * e;
      }
    }
    return err;
  };
  float err = roundAll(d, q);
  for (int it = 0; it < 2; it++) {  // refit d for the integer scales
    double uu = 0, xu = 0;
    for (int i = 0; i < 256; i++) {
      const double u = static_cast<double>(sc[i / 16]) * q[i];
      uu += u * u, xu += x[i] * u;
    }
    if (uu == 0) break;
    const float nd = half(static_cast<float>(xu / uu));
    int q2[256];
    const float e2 = roundAll(nd, q2);
    if (!(e2 < err)) break;
    err = e2, d = nd;
    std::memcpy(q, q2, sizeof q);
  }
  uint8_t *ql = out, *qh = out + 128;
  std::memset(out, 0, 192);
  for (int e = 0; e < 256; e++) {
    const int v = q[e] + 32, n = e / 128, h = e % 128, g = h / 32, l = h % 32;
    ql[n * 64 + l + (g & 1) * 32] |= static_cast<uint8_t>((v & 0xF) << (g >= 2 ? 4 : 0));
    qh[n * 32 + l] |= static_cast<uint8_t>((v >> 4) << (2 * g));
  }
  for (int k = 0; k < 16; k++) out[192 + k] = static_cast<uint8_t>(static_cast<int8_t>(sc[k]));
  putHalf(out + 208, d);
}

using BlockFn = void (*)(const float*, uint8_t*);

BlockFn blockFn(DType d) {
  switch (d) {
    case DType::Q8_0: return blockQ8_0;
    case DType::Q4_0: return blockQ4_0;
    case DType::Q4_K: return [](const float* x, uint8_t* o) { blockQ45K(x, o, false); };
    case DType::Q5_K: return [](const float* x, uint8_t* o) { blockQ45K(x, o, true); };
    case DType::Q6_K: return blockQ6K;
    default: return nullptr;
  }
}

}  // namespace

bool canQuantize(DType d) { return blockFn(d) != nullptr; }

void quantizeWeights(DType d, const float* x, int64_t rows, int64_t cols, uint8_t* out) {
  const BlockFn fn = blockFn(d);
  if (!fn) throw std::invalid_argument("quantizeWeights: not a type it writes");
  const int be = blockElems(d);
  if (cols <= 0 || cols % be != 0) throw std::invalid_argument("quantizeWeights: row length " + std::to_string(cols) + " is not a multiple of the block size " + std::to_string(be));
  for (int64_t i = 0; i < rows * cols; i++)
    if (!std::isfinite(x[i])) throw std::invalid_argument("value " + std::to_string(i % cols) + " of row " + std::to_string(i / cols) + " is not finite");
  const size_t rowBytes = tensorBytes(d, 1, static_cast<size_t>(cols));
  const int64_t blocks = cols / be;
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < rows; r++)
    for (int64_t b = 0; b < blocks; b++) fn(x + r * cols + b * be, out + r * rowBytes + b * (rowBytes / blocks));
}

}  // namespace weft
