// The permutation that quant_panels.h describes.
#include "quant_panels.h"
#include <cstring>
#include "quant.h"

namespace weft {

namespace {

// One field of a block: `bytes` at `src` in the column's block go to `dst` in the panel unit,
// as one f16 per column (bytes == 2) or as VNNI rows (whole 4-byte words, word i at row i).
struct Field {
  int src, bytes, dst;
};
constexpr Field kQ8_0[] = {{0, 2, q8panel::kD}, {2, 32, q8panel::kQ}};
constexpr Field kQ4_0[] = {{0, 2, q40panel::kD}, {2, 16, q40panel::kQ}};
constexpr Field kQ4_1[] = {{0, 2, q41panel::kD}, {2, 2, q41panel::kM}, {4, 16, q41panel::kQ}};
constexpr Field kQ4_K[] = {{0, 2, q4kpanel::kD}, {2, 2, q4kpanel::kDmin}, {4, 12, q4kpanel::kScales}, {16, 128, q4kpanel::kQs}};
constexpr Field kQ5_K[] = {{0, 2, q5kpanel::kD}, {2, 2, q5kpanel::kDmin}, {4, 12, q5kpanel::kScales}, {16, 32, q5kpanel::kQh}, {48, 128, q5kpanel::kQs}};
constexpr Field kQ6_K[] = {{0, 128, q6kpanel::kQl}, {128, 64, q6kpanel::kQh}, {192, 16, q6kpanel::kScales}, {208, 2, q6kpanel::kD}};
constexpr Field kQ6_KW[] = {{192, 16, q6kwpanel::kScales}, {208, 2, q6kwpanel::kD}};  // and the weights: packQ6Weights

template <size_t N>
void packFields(const Field (&fields)[N], const uint8_t* src, uint8_t* unit, int c) {
  for (const Field& f : fields) {
    if (f.bytes == 2) {
      std::memcpy(unit + f.dst + 2 * c, src + f.src, 2);
      continue;
    }
    for (int i = 0; i < f.bytes / 4; i++) std::memcpy(unit + f.dst + kVnniRow * i + 4 * c, src + f.src + 4 * i, 4);
  }
}

// A Q6_K superblock's 256 weights, as unpackRowScalar decodes them (value − 32), into column c's
// bytes of the unit's VNNI rows.
void packQ6Weights(const uint8_t* src, uint8_t* unit, int c) {
  int8_t q[256];
  float dv[64], m[8];
  unpackRowScalar(DType::Q6_K, src, 256, UnpackedRow{q, dv, m});
  for (int row = 0; row < 64; row++) std::memcpy(unit + q6kwpanel::kQ + kVnniRow * row + 4 * c, q + 4 * row, 4);
}

// The type of the file's blocks that a panel type holds.
DType fileTypeOf(DType panel) { return panel == DType::Q6_KW ? DType::Q6_K : panel; }

// Column c's block (or superblock) `src` into the panel unit `unit`.
void packUnit(DType panel, const uint8_t* src, uint8_t* unit, int c) {
  switch (panel) {
    case DType::Q8_0: return packFields(kQ8_0, src, unit, c);
    case DType::Q4_0: return packFields(kQ4_0, src, unit, c);
    case DType::Q4_1: return packFields(kQ4_1, src, unit, c);
    case DType::Q4_K: return packFields(kQ4_K, src, unit, c);
    case DType::Q5_K: return packFields(kQ5_K, src, unit, c);
    case DType::Q6_K: return packFields(kQ6_K, src, unit, c);
    default:
      packQ6Weights(src, unit, c);
      return packFields(kQ6_KW, src, unit, c);
  }
}

}  // namespace

// The units' sizes above are the file's 16 blocks (Q6_KW's excepted).
static_assert(q8panel::kUnit == 16 * 34 && q40panel::kUnit == 16 * 18 && q41panel::kUnit == 16 * 20);
static_assert(q4kpanel::kUnit == 16 * 144 && q5kpanel::kUnit == 16 * 176 && q6kpanel::kUnit == 16 * 210);

void packQuantPanels(DType panel, const uint8_t* src, int N, int K, uint8_t* dst) {
  const DType d = fileTypeOf(panel);
  const size_t rowBytes = tensorBytes(d, 1, K), unitBytes = panelUnitBytes(panel);
  const int units = K / panelUnitInputs(panel), panels = (N + kPanelCols - 1) / kPanelCols;
  std::memset(dst, 0, panelBytes(panel, N, K));
#pragma omp parallel for schedule(static)
  for (int p = 0; p < panels; p++)
    for (int c = 0; c < kPanelCols && p * kPanelCols + c < N; c++) {
      const uint8_t* row = src + rowBytes * (static_cast<size_t>(p) * kPanelCols + c);
      for (int u = 0; u < units; u++)
        packUnit(panel, row + rowBytes / units * u, dst + (static_cast<size_t>(p) * units + u) * unitBytes, c);
    }
}

}  // namespace weft
