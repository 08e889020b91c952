// Block-quantized weights, portable code: sizes and names of the GGUF types,
// exact dequantization (embedding rows), activation quantization, the unpacking
// of a weight row to the kernels' common form, and the scalar matmul, which
// fixes the reduction order the vector sets reproduce (see quant.h).
// Compiled for plain x86-64 (no FMA contraction), so dequantRow rounds each
// operation as ggml's C reference does.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>
#include "quant.h"

namespace weft {
namespace {

struct TypeInfo {
  DType dtype;
  const char* name;
  int elems;   // per block
  int bytes;   // per block
  bool mins;   // has a min term (m in UnpackedRow)
};

constexpr TypeInfo kTypes[] = {
    {DType::F32, "f32", 1, 4, false},      {DType::F16, "f16", 1, 2, false},      {DType::BF16, "bf16", 1, 2, false},
    {DType::Q8_0, "q8_0", 32, 34, false},  {DType::Q4_0, "q4_0", 32, 18, false},  {DType::Q4_1, "q4_1", 32, 20, true},
    {DType::Q4_K, "q4_k", 256, 144, true}, {DType::Q5_K, "q5_k", 256, 176, true}, {DType::Q6_K, "q6_k", 256, 210, false},
};

const TypeInfo& info(DType d) {
  for (const TypeInfo& t : kTypes)
    if (t.dtype == d) return t;
  throw std::invalid_argument("unknown dtype");
}

float f16At(const uint8_t* p) { return f16ToF32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

void fill8(float* dv, float v) { std::fill(dv, dv + 8, v); }

// Dequantization, one block each, as ggml-quants.c's dequantize_row_*.
void dequantBlock(DType d, const uint8_t* b, float* y) {
  switch (d) {
    case DType::Q8_0: {
      const float s = f16At(b);
      for (int j = 0; j < 32; j++) y[j] = static_cast<int8_t>(b[2 + j]) * s;
      return;
    }
    case DType::Q4_0: {
      const float s = f16At(b);
      for (int j = 0; j < 16; j++) {
        y[j] = ((b[2 + j] & 0xF) - 8) * s;
        y[j + 16] = ((b[2 + j] >> 4) - 8) * s;
      }
      return;
    }
    case DType::Q4_1: {
      const float s = f16At(b), m = f16At(b + 2);
      for (int j = 0; j < 16; j++) {
        y[j] = (b[4 + j] & 0xF) * s + m;
        y[j + 16] = (b[4 + j] >> 4) * s + m;
      }
      return;
    }
    case DType::Q4_K:
    case DType::Q5_K: {
      const bool five = d == DType::Q5_K;
      const float dd = f16At(b), dmin = f16At(b + 2);
      const uint8_t* sc = b + 4;
      const uint8_t* qh = b + 16;
      const uint8_t* q = b + (five ? 48 : 16);
      for (int j = 0, is = 0; j < 256; j += 64, is += 2, q += 32) {
        int s1, m1i, s2, m2i;
        kScaleMin(is, sc, &s1, &m1i);
        kScaleMin(is + 1, sc, &s2, &m2i);
        const float d1 = dd * s1, m1 = dmin * m1i, d2 = dd * s2, m2 = dmin * m2i;
        const int u1 = 1 << is, u2 = 2 << is;
        for (int l = 0; l < 32; l++) y[j + l] = d1 * ((q[l] & 0xF) + (five && (qh[l] & u1) ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++) y[j + 32 + l] = d2 * ((q[l] >> 4) + (five && (qh[l] & u2) ? 16 : 0)) - m2;
      }
      return;
    }
    case DType::Q6_K: {
      const float dd = f16At(b + 208);
      for (int n = 0; n < 2; n++) {
        const uint8_t* ql = b + n * 64;
        const uint8_t* qh = b + 128 + n * 32;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + n * 8);
        float* o = y + n * 128;
        for (int l = 0; l < 32; l++) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          o[l] = dd * sc[is] * q1;
          o[l + 32] = dd * sc[is + 2] * q2;
          o[l + 64] = dd * sc[is + 4] * q3;
          o[l + 96] = dd * sc[is + 6] * q4;
        }
      }
      return;
    }
    default: throw std::invalid_argument("not a quantized dtype");
  }
}

// A K-quant superblock as the K-quant order of quant.h takes it: the unsigned quants u, the
// integer scales S per (block, lane), the min coefficients c per 16 inputs, d and cm.
struct KSuper {
  uint8_t u[256];
  int scale[8][8];  // [block j][lane l]
  int coef[16];
  float d, cm;
};

void decodeK(DType t, const uint8_t* b, KSuper& k) {
  if (t == DType::Q6_K) {
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int n = 0; n < 2; n++) {
      const uint8_t* ql = b + n * 64;
      const uint8_t* qh = b + 128 + n * 32;
      uint8_t* o = k.u + 128 * n;
      for (int l = 0; l < 32; l++) {
        o[l] = static_cast<uint8_t>((ql[l] & 0xF) | ((qh[l] & 3) << 4));
        o[l + 32] = static_cast<uint8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4));
        o[l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
        o[l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
      }
    }
    for (int e = 0; e < 16; e++) k.coef[e] = sc[e];
    for (int j = 0; j < 8; j++)
      for (int l = 0; l < 8; l++) k.scale[j][l] = sc[2 * j + l / 4];
    k.d = f16At(b + 208);
    k.cm = -32.0f * k.d;  // the bias of u: w = u − 32
    return;
  }
  const bool five = t == DType::Q5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + (five ? 48 : 16);
  for (int j = 0; j < 8; j++) {
    int sc, mi;
    kScaleMin(j, b + 4, &sc, &mi);
    for (int l = 0; l < 8; l++) k.scale[j][l] = sc;
    k.coef[2 * j] = k.coef[2 * j + 1] = mi;
    for (int l = 0; l < 32; l++) {
      const int nib = j % 2 ? qs[32 * (j / 2) + l] >> 4 : qs[32 * (j / 2) + l] & 0xF;
      k.u[32 * j + l] = static_cast<uint8_t>(nib + (five && (qh[l] >> j & 1) ? 16 : 0));
    }
  }
  k.d = f16At(b);
  k.cm = -f16At(b + 2);
}

// A K-quant superblock → its 8 blocks in the block order's form (UnpackedRow; blocks `step`
// apart): q = u (Q6_K: u − 32), lane scale d·S, min −dmin·m (Q6_K: none) — the values the
// VNNI panels' scales are checked against and the amx set's Q6_KW panels hold.
void unpackK(DType t, const uint8_t* b, int8_t* q, float* dv, float* m, int step) {
  KSuper k;
  decodeK(t, b, k);
  const bool six = t == DType::Q6_K;
  for (int j = 0; j < 8; j++) {
    const int blk = j * step;
    for (int l = 0; l < 32; l++) q[32 * blk + l] = static_cast<int8_t>(k.u[32 * j + l] - (six ? 32 : 0));
    for (int l = 0; l < 8; l++) dv[8 * blk + l] = k.d * static_cast<float>(k.scale[j][l]);
    m[blk] = six ? 0.0f : k.cm * static_cast<float>(k.coef[2 * j]);
  }
}

float dotRow(const UnpackedRow& r, const QuantActBlock* x, int nb, bool mins) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, macc = 0.0f;
  for (int b = 0; b < nb; b++) {
    const int8_t* w = r.q + static_cast<size_t>(b) * kQBlock;
    for (int l = 0; l < 8; l++) {
      int32_t p = 0;
      for (int j = 4 * l; j < 4 * l + 4; j++) p += w[j] * x[b].q[j];
      const float s = r.dv[8 * b + l] * x[b].d;
      acc[l] = std::fma(static_cast<float>(p), s, acc[l]);
    }
    if (mins) macc = std::fma(r.m[b], x[b].s, macc);
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + macc;
}

// One output of a K-quant row (the superblocks of `row`) in the K-quant order of quant.h.
float dotK(DType t, const uint8_t* row, const QuantActBlock* x, int nb) {
  const size_t bytes = tensorBytes(t, 1, 256);
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  KSuper k;
  for (int s = 0; s < nb / 8; s++) {
    decodeK(t, row + bytes * s, k);
    const QuantActBlock* xs = x + 8 * s;
    for (int l = 0; l < 8; l++) {
      int32_t p = 0;
      for (int j = 0; j < 8; j++) {
        int32_t q = 0;
        for (int i = 4 * l; i < 4 * l + 4; i++) q += k.u[32 * j + i] * xs[j].q[i];
        p += k.scale[j][l] * q;
      }
      const int32_t m = k.coef[2 * l] * xs[l].half[0] + k.coef[2 * l + 1] * xs[l].half[1];
      acc[l] = std::fma(static_cast<float>(p), k.d * xs[0].d, acc[l]);
      acc[l] = std::fma(static_cast<float>(m), k.cm * xs[0].d, acc[l]);
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

bool isKQuant(DType d) { return d == DType::Q4_K || d == DType::Q5_K || d == DType::Q6_K; }

}  // namespace

void kScaleMin(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

size_t tensorBytes(DType d, size_t rows, size_t cols) {
  const TypeInfo& t = info(d);
  return rows * (cols / t.elems) * t.bytes;
}

bool isQuantized(DType d) { return info(d).elems > 1; }

int blockElems(DType d) { return info(d).elems; }

bool quantHasMins(DType d) { return info(d).mins; }

DType dtypeFromName(const std::string& name) {
  for (const TypeInfo& t : kTypes)
    if (name == t.name) return t.dtype;
  throw std::invalid_argument("unsupported dtype " + name);
}

void dequantRow(DType d, const void* data, int cols, int r, float* out) {
  const TypeInfo& t = info(d);
  const auto* row = static_cast<const uint8_t*>(data) + tensorBytes(d, static_cast<size_t>(r), cols);
  for (int b = 0; b < cols / t.elems; b++) dequantBlock(d, row + static_cast<size_t>(b) * t.bytes, out + static_cast<size_t>(b) * t.elems);
}

int actScaleBlocks(DType d) { return blockElems(d) / kQBlock; }

void quantizeActivations(const float* x, int T, int K, int scaleBlocks, QuantActBlock* out) {
  const int nb = K / kQBlock, run = kQBlock * scaleBlocks;
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++)
    for (int b0 = 0; b0 < nb; b0 += scaleBlocks) {
      const float* v = x + static_cast<size_t>(t) * K + b0 * kQBlock;
      float amax = 0.0f;
      for (int i = 0; i < run; i++) amax = std::max(amax, std::fabs(v[i]));
      const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
      for (int b = 0; b < scaleBlocks; b++) {
        QuantActBlock& o = out[static_cast<size_t>(t) * nb + b0 + b];
        o.d = d;
        int half[2] = {0, 0};
        for (int i = 0; i < kQBlock; i++) {
          const float q = std::nearbyint(v[kQBlock * b + i] * id);
          o.q[i] = static_cast<int8_t>(std::min(127.0f, std::max(-127.0f, q)));
          half[i / (kQBlock / 2)] += o.q[i];
        }
        o.half[0] = static_cast<int16_t>(half[0]);
        o.half[1] = static_cast<int16_t>(half[1]);
        o.s = o.d * static_cast<float>(half[0] + half[1]);
      }
    }
}

void unpackRowScalar(DType d, const uint8_t* src, int K, const UnpackedRow& out) {
  const TypeInfo& t = info(d);
  for (int blk = 0; blk < K / t.elems; blk++) {
    const uint8_t* b = src + static_cast<size_t>(blk) * t.bytes;
    const size_t first = static_cast<size_t>(blk) * t.elems / kQBlock * out.step;  // first 32-element block it unpacks to
    int8_t* q = out.q + first * kQBlock;
    float* dv = out.dv + 8 * first;
    float* m = out.m + first;
    switch (d) {
      case DType::Q8_0:
        std::memcpy(q, b + 2, 32);
        fill8(dv, f16At(b));
        *m = 0.0f;
        break;
      case DType::Q4_0:
      case DType::Q4_1: {
        const bool one = d == DType::Q4_1;
        const uint8_t* qs = b + (one ? 4 : 2);
        for (int j = 0; j < 16; j++) {
          q[j] = static_cast<int8_t>((qs[j] & 0xF) - (one ? 0 : 8));
          q[j + 16] = static_cast<int8_t>((qs[j] >> 4) - (one ? 0 : 8));
        }
        fill8(dv, f16At(b));
        *m = one ? f16At(b + 2) : 0.0f;
        break;
      }
      case DType::Q4_K:
      case DType::Q5_K:
      case DType::Q6_K: unpackK(d, b, q, dv, m, out.step); break;
      default: throw std::invalid_argument("not a quantized dtype");
    }
  }
}

void matmulQuantScalar(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1) {
  const int nb = w.K / kQBlock;
  static thread_local std::vector<int8_t> q;
  static thread_local std::vector<float> dv, m;
  q.resize(w.K);
  dv.resize(8 * static_cast<size_t>(nb));
  m.resize(nb);
  const UnpackedRow row{q.data(), dv.data(), m.data()};
  const size_t rowBytes = tensorBytes(w.dtype, 1, w.K);
  const bool mins = info(w.dtype).mins;
  if (isKQuant(w.dtype)) {
    for (int n = n0; n < n1; n++)
      for (int t = 0; t < T; t++)
        y[static_cast<size_t>(t) * w.N + n] = dotK(w.dtype, static_cast<const uint8_t*>(w.data) + rowBytes * n, x + static_cast<size_t>(t) * nb, nb);
    return;
  }
  for (int n = n0; n < n1; n++) {
    unpackRowScalar(w.dtype, static_cast<const uint8_t*>(w.data) + rowBytes * n, w.K, row);
    for (int t = 0; t < T; t++) y[static_cast<size_t>(t) * w.N + n] = dotRow(row, x + static_cast<size_t>(t) * nb, nb, mins);
  }
}

MatmulQuantFn quantMatmulFor(const char* kernelSet) {
  const std::string set = kernelSet ? kernelSet : "";
  if (set == "scalar") return matmulQuantScalar;
  if (set != "avx2" && cpuFeatures().avx512vnni) return matmulQuantPanels;
  return matmulQuantAvx2;
}

bool readsQuantPanels(MatmulQuantFn f) { return f == matmulQuantPanels || f == matmulQuantAmx; }

bool widensQ6Panels(MatmulQuantFn f) { return f == matmulQuantAmx; }

bool decodesKScales(MatmulQuantFn f) { return f == matmulQuantAvx2; }

}  // namespace weft
