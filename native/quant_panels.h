// Block-quantized matrices (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K) as the VNNI and amx sets hold them: the file's
// bytes permuted at load so that one 64-byte load gives one 4-byte group of inputs for 16 output columns, the
// layout vpdpbusd lanes and an AMX B tile read (a "VNNI" row). No byte is changed or added, except in the
// amx set's Q6_K panels (panel type Q6_KW): their 6-bit weights are held widened to signed bytes (value − 32),
// which its tiles read in place as Q8_0's, instead of unpacking them on every call (the unpacking was 43 % of
// the tile kernel's time at 16 rows); they take 4384 bytes per 16 × 256 weights instead of the file's 3360.
// The VNNI set keeps the file's bits: its lanes alone gain nothing from the bytes below 16 rows and lose up
// to a fifth at one row, where the wider panel is read from memory (matmul-timing, 1024 × 3072 streamed).
//
// The matrix is cut into panels of kPanelCols weight rows (output columns); a panel is its
// units in order (a block of 32 inputs; for the K-quants a superblock of 256), each unit the 16
// columns' copies of that block, field by field:
//   Q8_0 (544 B):  d (16 f16) | q: 8 VNNI rows (inputs 4r..4r+3)
//   Q4_0 (288 B):  d | qs: 4 VNNI rows (low nibbles inputs 4r.., high nibbles inputs 16 + 4r..)
//   Q4_1 (320 B):  d | m (16 f16) | qs: 4 VNNI rows (as Q4_0)
//   Q4_K (2304 B): d (16 f16) | dmin (16 f16) | scale words 0–2 (3 × 16 u32) | qs: 4 chunks (bytes
//                  32i..32i+31: low nibbles block 2i, high 2i+1) × 8 VNNI rows
//   Q5_K (2816 B): d | dmin | scale words 0–2 (as Q4_K) | qh: 8 VNNI rows (bit j: block j's 5th bit) |
//                  qs: 4 chunks × 8 rows (as Q4_K)
//   Q6_K (3360 B): d (16 f16) | scales (4 × 16 u32: int8 scales 4w..4w+3) | ql: 4 chunks × 8 rows |
//                  qh: 2 chunks × 8 rows
//   Q6_KW (4384 B): d | scales (as Q6_K) | q: 8 blocks × 8 VNNI rows of signed weights (block j's
//                  inputs 4r..4r+3 at row 8j + r: rows 8j..8j+3 take scale 2j, 8j+4..8j+7 scale 2j + 1)
// A VNNI row is 16 × 4 bytes, column c's at 4c. Columns past N are zeros (a zero scale).
#pragma once
#include <cstddef>
#include <cstdint>
#include "kernels.h"

namespace weft {

constexpr int kPanelCols = 16;
constexpr int kVnniRow = 64;  // bytes of one VNNI row: 16 columns × 4 inputs

namespace q8panel {
constexpr int kD = 0, kQ = 32, kUnit = 544;
}
namespace q40panel {
constexpr int kD = 0, kQ = 32, kUnit = 288;
}
namespace q41panel {
constexpr int kD = 0, kM = 32, kQ = 64, kUnit = 320;
}
namespace q4kpanel {
constexpr int kD = 0, kDmin = 32, kScales = 64, kQs = 256, kUnit = 2304;
}
namespace q5kpanel {
constexpr int kD = 0, kDmin = 32, kScales = 64, kQh = 256, kQs = 768, kUnit = 2816;
}
namespace q6kpanel {
constexpr int kD = 0, kScales = 32, kQl = 288, kQh = 2336, kUnit = 3360;
}
namespace q6kwpanel {
constexpr int kD = 0, kScales = 32, kQ = 288, kUnit = 4384;
}

// The panel type of a type-d matrix in a set that does (wideQ6) or does not widen Q6_K.
inline DType panelTypeOf(DType d, bool wideQ6) { return d == DType::Q6_K && wideQ6 ? DType::Q6_KW : d; }
// Bytes of one panel unit of panel type `panel` (16 columns × one block; K-quants: one superblock),
// and the inputs it covers. Inline: the kernels ask for a panel's bytes for every panel they read.
constexpr int panelUnitBytes(DType panel) {
  switch (panel) {
    case DType::Q8_0: return q8panel::kUnit;
    case DType::Q4_0: return q40panel::kUnit;
    case DType::Q4_1: return q41panel::kUnit;
    case DType::Q4_K: return q4kpanel::kUnit;
    case DType::Q5_K: return q5kpanel::kUnit;
    case DType::Q6_K: return q6kpanel::kUnit;
    default: return q6kwpanel::kUnit;
  }
}
constexpr int panelUnitInputs(DType panel) {
  return panel == DType::Q8_0 || panel == DType::Q4_0 || panel == DType::Q4_1 ? 32 : 256;
}
// Bytes of an (N × K) matrix in panels of type `panel`: N rounded up to whole panels.
constexpr size_t panelBytes(DType panel, int N, int K) {
  return (static_cast<size_t>(N) + kPanelCols - 1) / kPanelCols * (K / panelUnitInputs(panel)) * panelUnitBytes(panel);
}

// The rows of `src` (N × K, ggml's block layout of the file's type) into panels at `dst` (panelBytes long).
void packQuantPanels(DType panel, const uint8_t* src, int N, int K, uint8_t* dst);

}  // namespace weft
