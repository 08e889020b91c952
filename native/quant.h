// GGUF block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): their
// byte sizes, exact dequantization (embedding rows), and the integer matmul's
// common form.
//
// The matmul never widens a weight to float. Activations are quantized to int8 with one
// fp32 scale per weight block's worth of inputs (actScaleBlocks): per 32 for Q8_0, Q4_0 and
// Q4_1, per 256 for the K-quants, as llama.cpp pairs them with q8_0 and q8_K. The AVX2 and
// scalar sets (bit-identical) dot the 32-element types' rows unpacked into L1 to int8 values
// with eight fp32 lane scales and a "min" coefficient, every row of the step against the
// unpacked rows (steps of up to 4 rows, 8 for Q8_0, read them in place instead, to the same
// values), and read the K-quants a superblock at a time (the AVX2 set: Q4_K and Q5_K from rows
// whose scales it decoded at load, kquant_rows.h), summing a superblock's blocks in integers
// under their integer scales (the K-quant order below). The AVX-512 sets with VNNI (and the amx set) read the
// matrices in VNNI panels instead, in their own order (matmulQuantPanels).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>
#include "kernels.h"

namespace weft {

constexpr int kQBlock = 32;  // elements per activation block and per unpacked weight block

// One activation block: x[i] ≈ d * q[i]; s = d * Σq (for the weight types with a min). For a
// K-quant matrix the 8 blocks of each 256 inputs share their d.
struct QuantActBlock {
  float d;
  float s;
  int16_t half[2];  // Σq of inputs 0–15 and of 16–31: the K-quant order's bs, and the panel kernels' corrections for weights read with an offset
  int8_t q[kQBlock];
};

// A weight row unpacked for the dot kernels, K / 32 blocks: with j = step·b, block b is
// w[32b + i] ≈ dv[8j + i / 4] * q[32j + i] + m[j] (the min term only for Q4_1, Q4_K, Q5_K).
// One lane scale per 4 inputs mirrors the 8 int32 lanes of a 256-bit dot. `step`
// interleaves the blocks of several rows (a panel of columns, block-major).
struct UnpackedRow {
  int8_t* q;
  float* dv;
  float* m;
  int step = 1;
};

// The dot product of one unpacked weight row with one row of activation blocks,
// in the order every kernel set follows, so all of them agree bit for bit:
//   per block b in order: lane l (inputs 4l..4l+3) p = exact int32 Σ w·x;
//     acc[l] = fma(float(p), dv[8b + l] * x[b].d, acc[l]);  mins: macc = fma(m[b], x[b].s, macc)
//   y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7)) + macc
// Per output element this does not depend on T: batch-invariant.
//
// The K-quants (Q4_K, Q5_K: one 6-bit scale sc_j and min m_j per block j of 32; Q6_K: an int8
// scale per 16) in the AVX2 and scalar sets, per superblock s of 256 inputs in order, with u the
// unsigned quants (Q6_K's 6-bit value before its −32), xd the activations' shared scale, d (and
// dmin) the superblock's f16 scales, lane l covering inputs 4l..4l+3 of each block:
//   P_l = exact int32 Σ_j S(j, l) · Σ u·x   (S = sc_j; Q6_K: sc[2j + l/4])
//   M_l = exact int32 c[2l]·bs[2l] + c[2l+1]·bs[2l+1]   (bs[e]: Σx of inputs 16e..16e+15;
//         c[e] = m[e/2], or for Q6_K sc[e])
//   acc[l] = fma(float(P_l), d·xd, acc[l]);  acc[l] = fma(float(M_l), cm·xd, acc[l])
//         (cm = −dmin, or for Q6_K −32·d: the min, or the bias of u)
//   y = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
// Eight blocks under integer scales cost an int16 multiply a block (vpmaddwd) where the block
// order's float scales cost a conversion, a multiply and an FMA.

// Bytes of a (rows × cols) tensor of dtype d (quantized rows are whole blocks).
size_t tensorBytes(DType d, size_t rows, size_t cols);
bool isQuantized(DType d);
// Elements per quantization block (1 for float types).
int blockElems(DType d);
// Whether the type's blocks carry a min (Q4_1, Q4_K, Q5_K): the m term of UnpackedRow.
bool quantHasMins(DType d);
// "f32", "q4_k", ... → DType; throws std::invalid_argument for any other name.
DType dtypeFromName(const std::string& name);

// ggml's get_scale_min_k4: the 6-bit scale and min of block j (0–7) of a Q4_K/Q5_K superblock,
// from its 12 scale bytes `q`.
void kScaleMin(int j, const uint8_t* q, int* sc, int* m);

// Row `r` of a quantized (rows × cols) tensor dequantized exactly as llama.cpp's
// dequantize_row_* computes it (the embedding lookup).
void dequantRow(DType d, const void* data, int cols, int r, float* out);

// How many 32-element activation blocks share one scale for weights of type d: one weight
// block's worth (1, or 8 for the K-quants' 256).
int actScaleBlocks(DType d);
// Rows of x (T × K, K a multiple of 32·scaleBlocks) → T × K/32 activation blocks, row by row,
// each run of scaleBlocks blocks scaled by its own largest magnitude.
void quantizeActivations(const float* x, int T, int K, int scaleBlocks, QuantActBlock* out);
// The same, bit for bit, with AVX2 (for the vector kernel sets).
void quantizeActivationsAvx2(const float* x, int T, int K, int scaleBlocks, QuantActBlock* out);

// Unpacks one weight row `src` (K elements of dtype d, in ggml's block layout)
// into `out`; the portable code, which the AVX2 set matches bit for bit.
void unpackRowScalar(DType d, const uint8_t* src, int K, const UnpackedRow& out);

// The quantized matmul of each kernel set (see MatmulQuantFn in kernels.h). The
// AVX2 set takes kQPanel weight rows at a time (unpacked into an L1 panel, block-major,
// or read in place) and dots a tile of activation rows against all of them, so each
// decoded block serves kQPanel × rows dot products; per element the orders above hold.
constexpr int kQPanel = 4;
void matmulQuantScalar(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
void matmulQuantAvx2(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
// On matrices held in VNNI panels (Kernels::quantPanels), in their own reduction order: the
// AVX512-VNNI lane kernel (kernels_quant_panels.cpp), and the amx set's AMX-INT8 tiles
// (kernels_quant_amx.cpp), which give its bits and hand it steps of few rows.
void matmulQuantPanels(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
void matmulQuantAmx(const QuantActBlock* x, int T, const PackedMatrix& w, float* y, int n0, int n1);
// Columns per unit when a quantized matmul is split across threads: the widest panel (AMX's 16).
constexpr int kQuantSplitCols = 16;

// y[T, w.N] = x[T, w.K] · wᵀ for a block-quantized w: the rows of x quantized
// per block, then the columns split across threads (defined in matmul.cpp).
void matmulQuantized(const Kernels& k, const float* x, int T, const PackedMatrix& w, float* y);
// The same for block-quantized matrices that share their input x (q/k/v, gate/up; all of one K):
// the rows quantized once, and all the matrices' columns split across the threads in one run.
void matmulQuantizedShared(const Kernels& k, const float* x, int T, const std::vector<MatrixProduct>& products);

}  // namespace weft
