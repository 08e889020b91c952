// The permutation that quant_panels.h describes.
#include "quant_panels.h"
#include <cstring>
#include "quant.h"

namespace weft {

namespace {

// One unit's fields for column c: copies `bytes` from `from` (in the column's block) to `to`
// (in the panel unit), as whole 4-byte words, each to its VNNI row: word i at row i, column c.
void vnniRows(const uint8_t* from, size_t bytes, uint8_t* to, int c) {
  for (size_t i = 0; i < bytes / 4; i++) std::memcpy(to + kVnniRow * i + 4 * c, from + 4 * i, 4);
}

// Column c's block (or superblock) `src` into the panel unit `unit`.
void packUnit(DType d, const uint8_t* src, uint8_t* unit, int c) {
  switch (d) {
    case DType::Q8_0:
      std::memcpy(unit + q8panel::kD + 2 * c, src, 2);
      vnniRows(src + 2, 32, unit + q8panel::kQ, c);
      return;
    case DType::Q4_0:
      std::memcpy(unit + q40panel::kD + 2 * c, src, 2);
      vnniRows(src + 2, 16, unit + q40panel::kQ, c);
      return;
    case DType::Q4_1:
      std::memcpy(unit + q41panel::kD + 2 * c, src, 2);
      std::memcpy(unit + q41panel::kM + 2 * c, src + 2, 2);
      vnniRows(src + 4, 16, unit + q41panel::kQ, c);
      return;
    case DType::Q4_K:
      std::memcpy(unit + q4kpanel::kD + 2 * c, src, 2);
      std::memcpy(unit + q4kpanel::kDmin + 2 * c, src + 2, 2);
      vnniRows(src + 4, 12, unit + q4kpanel::kScales, c);
      vnniRows(src + 16, 128, unit + q4kpanel::kQs, c);
      return;
    case DType::Q5_K:
      std::memcpy(unit + q5kpanel::kD + 2 * c, src, 2);
      std::memcpy(unit + q5kpanel::kDmin + 2 * c, src + 2, 2);
      vnniRows(src + 4, 12, unit + q5kpanel::kScales, c);
      vnniRows(src + 16, 32, unit + q5kpanel::kQh, c);
      vnniRows(src + 48, 128, unit + q5kpanel::kQs, c);
      return;
    default:  // Q6_K: ql, qh, scales, d
      vnniRows(src, 128, unit + q6kpanel::kQl, c);
      vnniRows(src + 128, 64, unit + q6kpanel::kQh, c);
      vnniRows(src + 192, 16, unit + q6kpanel::kScales, c);
      std::memcpy(unit + q6kpanel::kD + 2 * c, src + 208, 2);
      return;
  }
}

}  // namespace

size_t panelBytes(DType d, int N, int K) {
  const size_t panels = (static_cast<size_t>(N) + kPanelCols - 1) / kPanelCols;
  return panels * kPanelCols * tensorBytes(d, 1, K);
}

void packQuantPanels(DType d, const uint8_t* src, int N, int K, uint8_t* dst) {
  const size_t rowBytes = tensorBytes(d, 1, K), unitBytes = rowBytes * kPanelCols / (K / blockElems(d));
  const int units = K / blockElems(d), panels = (N + kPanelCols - 1) / kPanelCols;
  std::memset(dst, 0, panelBytes(d, N, K));
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++)
    for (int c = 0; c < kPanelCols && p * kPanelCols + c < N; c++) {
      const uint8_t* row = src + rowBytes * (static_cast<size_t>(p) * kPanelCols + c);
      for (int u = 0; u < units; u++)
        packUnit(d, row + rowBytes / units * u, dst + (static_cast<size_t>(p) * units + u) * unitBytes, c);
    }
}

}  // namespace weft
