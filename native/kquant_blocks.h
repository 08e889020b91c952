// The Q4_K and Q6_K superblocks (ggml's block_q4_K, block_q6_K) as the vector kernels
// read them: their layout and one decoder per field, shared by the AVX2 kernel
// (kernels_quant_avx2.cpp: the quants, whose bytes its decoded rows keep) and the VNNI panel
// kernels (quant_panel_units.h, for kernels_quant_panels.cpp and kernels_quant_amx.cpp),
// which must read the same values. The portable reference is unpackRowScalar
// (kernels_quant.cpp).
//
// Include after a `#pragma GCC target` that enables AVX2 and F16C. Everything here
// has internal linkage, so each kernel file compiles its own copy for its own target
// (one shared copy could be the AVX-512 one, run on a CPU without it).
#pragma once
#include <immintrin.h>
#include <cstdint>
#include <cstring>

namespace weft {
namespace {

// Q4_K, 144 bytes per 256 inputs: f16 d, f16 dmin, 12 scale bytes, then 128 quant bytes
// (bytes 32i..32i+31 hold blocks 2i and 2i + 1 of 32 inputs: low and high nibbles).
constexpr int kQ4KBytes = 144, kQ4KScales = 4, kQ4KQuants = 16;
// Q6_K, 210 bytes: 128 bytes of low 4 bits, 64 of high 2 bits, 16 int8 scales (one per
// 16 inputs), f16 d. A weight is its 6-bit value − kQ6KBias.
constexpr int kQ6KBytes = 210, kQ6KHigh = 128, kQ6KScales = 192, kQ6KD = 208, kQ6KBias = 32;

// GCC vectors of bytes (any width): the decoders below are written once for 256- and
// 512-bit registers.
using U8x32 = uint8_t __attribute__((vector_size(32)));
using U8x64 = uint8_t __attribute__((vector_size(64)));

inline float f16At(const uint8_t* p) { return _cvtsh_ss(static_cast<unsigned short>(p[0] | p[1] << 8)); }

// A Q4_K superblock's eight 6-bit scales and mins (ggml's get_scale_min_k4), four to a
// 32-bit word, one byte each, from its scale words a, b, c (scale bytes 0–3, 4–7, 8–11):
// scales 0–3 and mins 0–3 are the low 6 bits of a and b; 4–7 take their low 4 bits from c
// and their top 2 from the top bits of a and b. U: uint32_t, or a GCC vector of them
// (one superblock per lane).
template <class U>
inline void q4kScaleWords(U a, U b, U c, U* sc03, U* sc47, U* mn03, U* mn47) {
  const uint32_t top = 0x03030303, low4 = 0x0F0F0F0F, low6 = 0x3F3F3F3F;
  *sc03 = a & low6;
  *mn03 = b & low6;
  *sc47 = (c & low4) | ((a >> 6) & top) << 4;
  *mn47 = ((c >> 4) & low4) | ((b >> 6) & top) << 4;
}

// Block 2i + High of a Q4_K superblock (0–15 each) from its quant bytes 32i..32i+31 (V: a byte
// vector holding them; a 512-bit one holds two rows' bytes side by side).
template <bool High, class V>
inline V q4kQuants(V v) {
  return High ? v >> 4 : v & 0x0F;
}

// Block K (0–3) of a Q6_K half superblock as unsigned 6-bit values (the weight is this − kQ6KBias):
// its 4 low bits from `l` (the half's first 32 low-bit bytes for even K, the next 32 for odd;
// low nibbles for K < 2, high for K ≥ 2), its 2 high bits from the half's 32 high-bit bytes
// `h` (bits 2K, 2K + 1). V as for q4kQuants.
template <int K, class V>
inline V q6kBits(V l, V h) {
  constexpr int up = 4 - 2 * K;  // moves bits 2K, 2K + 1 of h to bits 4, 5
  const V hs = up >= 0 ? h << up : h >> -up;
  return (K < 2 ? l & 0x0F : l >> 4) | (hs & 0x30);
}

}  // namespace
}  // namespace weft
