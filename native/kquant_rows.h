// Q4_K and Q5_K matrices as the AVX2 quantized matmul holds them (panel types Q4_KD and Q5_KD): the
// file's rows of superblocks, each superblock's scales decoded at load. ggml packs a superblock's
// eight 6-bit scales and mins into 12 bytes and its d and dmin as f16; undoing that for every
// superblock of every column was about a tenth of the one-row kernel's time (see
// docs/QUANTIZATION.md, session 31). The quants are the file's bytes in the file's order. Per
// superblock of 256 inputs:
//   Q4_KD (152 B, the file's 144): d (f32) | −dmin (f32) | sc_0..sc_7 (u8) | m_0..m_7 (u8) | qs (128 B)
//   Q5_KD (184 B, the file's 176): d | −dmin | sc | m | qh (32 B) | qs (128 B)
// d and −dmin are the file's f16 values widened exactly, so every product is the same as from the file.
#pragma once
#include <cstddef>
#include <cstdint>
#include "kernels.h"

namespace weft {

namespace q4kdrow {
constexpr int kD = 0, kCm = 4, kScales = 8, kMins = 16, kQs = 24, kBytes = 152;
}
namespace q5kdrow {
constexpr int kD = 0, kCm = 4, kScales = 8, kMins = 16, kQh = 24, kQs = 56, kBytes = 184;
}

// The decoded-rows type of a type-d matrix (Q4_K → Q4_KD, Q5_K → Q5_KD), or d for any other.
inline DType decodedRowsOf(DType d) { return d == DType::Q4_K ? DType::Q4_KD : d == DType::Q5_K ? DType::Q5_KD : d; }
// Bytes of one row of K inputs in decoded rows of type `rows` (Q4_KD or Q5_KD).
constexpr size_t decodedRowBytes(DType rows, int K) {
  return static_cast<size_t>(K / 256) * (rows == DType::Q4_KD ? q4kdrow::kBytes : q5kdrow::kBytes);
}

// The rows of `src` (N × K in ggml's Q4_K or Q5_K blocks) into decoded rows of type `rows` at `dst`
// (N · decodedRowBytes long).
void packDecodedRows(DType rows, const uint8_t* src, int N, int K, uint8_t* dst);

}  // namespace weft
