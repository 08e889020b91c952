// The decoding that kquant_rows.h describes.
#include "kquant_rows.h"
#include <cstring>
#include "quant.h"

namespace weft {

namespace {

// One superblock of the file's Q4_K (five: Q5_K) into its decoded form.
void decodeSuperblock(const uint8_t* b, bool five, uint8_t* out) {
  const float d = f16ToF32(static_cast<uint16_t>(b[0] | b[1] << 8));
  const float cm = -f16ToF32(static_cast<uint16_t>(b[2] | b[3] << 8));
  std::memcpy(out + q4kdrow::kD, &d, 4);
  std::memcpy(out + q4kdrow::kCm, &cm, 4);
  for (int j = 0; j < 8; j++) {
    int sc, m;
    kScaleMin(j, b + 4, &sc, &m);
    out[q4kdrow::kScales + j] = static_cast<uint8_t>(sc);
    out[q4kdrow::kMins + j] = static_cast<uint8_t>(m);
  }
  if (five) {
    std::memcpy(out + q5kdrow::kQh, b + 16, 32);
    std::memcpy(out + q5kdrow::kQs, b + 48, 128);
  } else {
    std::memcpy(out + q4kdrow::kQs, b + 16, 128);
  }
}

}  // namespace

// The layouts share their first 24 bytes; the rest is the file's bytes after its 16.
static_assert(q5kdrow::kD == q4kdrow::kD && q5kdrow::kCm == q4kdrow::kCm && q5kdrow::kScales == q4kdrow::kScales && q5kdrow::kMins == q4kdrow::kMins);
static_assert(q4kdrow::kBytes == 144 - 16 + q4kdrow::kQs && q5kdrow::kBytes == 176 - 16 + q5kdrow::kQh);

void packDecodedRows(DType rows, const uint8_t* src, int N, int K, uint8_t* dst) {
  const bool five = rows == DType::Q5_KD;
  const DType file = five ? DType::Q5_K : DType::Q4_K;
  const size_t inBytes = tensorBytes(file, 1, 256), outBytes = decodedRowBytes(rows, 256);
  const size_t superblocks = static_cast<size_t>(N) * (K / 256);
#pragma omp parallel for schedule(static)
  for (size_t s = 0; s < superblocks; s++) decodeSuperblock(src + inBytes * s, five, dst + outBytes * s);
}

}  // namespace weft
