// Model weights, memory-mapped straight from safetensors or GGUF files and kept
// in their stored dtype (bf16/f16/f32, GGUF's quantized blocks, or MLX's packed
// words with their group scales and biases): no float32
// copy of a matrix is made (norm weights and biases, which are small, are widened to fp32).
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>
#include "kernels.h"

namespace weft {

// A 2-D (or 1-D, rows = 1) view into a mapped file.
struct Tensor {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int rows = 0;  // output features (N) for a linear layer
  int cols = 0;  // input features (K)
  // MLX4/MLX8 only (see mlx_quant.h): rows × cols/group scales and biases, and the group size.
  const void* scales = nullptr;
  const void* biases = nullptr;
  DType paramDtype = DType::BF16;
  int group = 0;
  explicit operator bool() const { return data != nullptr; }
  // Row `r` widened (quantized: dequantized) to fp32 into `out` (cols floats).
  void rowToF32(int r, float* out) const;
  // Element i widened to fp32 (for small vectors: norms and biases).
  float at(size_t i) const;
};

// Read-only mappings of the checkpoint files, shared by all tensors.
class MappedFiles {
 public:
  ~MappedFiles();
  // Maps `path` once; throws with the path on failure.
  const unsigned char* map(const std::string& path, size_t* size);

 private:
  struct Mapping { void* addr; size_t size; };
  std::map<std::string, Mapping> maps_;
};

// Owns the anonymous memory that packed matrices live in.
class PackedStore {
 public:
  ~PackedStore();
  // Repacks `t` (N × K) into kernel-tile order, in its own dtype.
  PackedMatrix pack(const Tensor& t, int chunk);
  // Copies a block-quantized `t` as the set k reads it: as it is (rows of ggml blocks, which the
  // lane kernels read a column group's rows at a time), permuted into VNNI panels (quant_panels.h)
  // where k.quantPanels(), of the panel type k gives its dtype, or for Q4_K and Q5_K as rows with
  // their scales decoded (kquant_rows.h) where k.decodedKRows().
  PackedMatrix packQuantized(const Tensor& t, const Kernels& k);
  // Copies an MLX-quantized `t` as it is: its words, scales and biases.
  PackedMatrix packMlx(const Tensor& t);
  // Repacks `t` into bf16 pair tiles (bfloat16 mode), rounding f32/f16 weights to bf16 as transformers does.
  PackedMatrix packPairTiles(const Tensor& t);
  // Bytes of every matrix packed so far.
  size_t bytes() const { return bytes_; }

 private:
  struct Region { void* addr; size_t size; };
  std::vector<Region> regions_;  // chunks, each 2 MiB-aligned
  size_t used_ = 0;               // bytes handed out of the last chunk
  size_t bytes_ = 0;              // bytes asked for, all chunks
  void* reserve(size_t bytes);
};

// Gives a tensor's whole pages back to the kernel (it will not be read again).
void releasePages(const Tensor& t);

struct LayerWeights {
  Tensor attnNorm;                   // (hidden)
  Tensor wq, wk, wv, wo;             // (heads*hd, hidden) (kv*hd, hidden) (kv*hd, hidden) (hidden, heads*hd)
  Tensor bq, bk, bv;                 // Qwen2 biases, else empty
  Tensor qNorm, kNorm;               // Qwen3 per-head RMSNorm (hd), else empty
  Tensor mlpNorm;                    // (hidden)
  Tensor gate, up, down;             // (inter, hidden) (inter, hidden) (hidden, inter)
};

struct Weights {
  Tensor embed;                      // (vocab, hidden)
  std::vector<LayerWeights> layers;
  Tensor finalNorm;                  // (hidden)
  Tensor lmHead;                     // (vocab, hidden); the embedding when tied
  std::shared_ptr<MappedFiles> files;
};

}  // namespace weft
