// The transformer (Llama / Mistral / Qwen2 / Qwen3 family) and its paged KV cache.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <mutex>
#include <vector>
#include "kernels.h"
#include "step.h"
#include "weights.h"

namespace weft {

class Model : public Backend {
 public:
  Model(ModelConfig config, Weights weights);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  StepOutput step(const StepInput& in) override;
  size_t kvCacheBytes() const override { return kvPoolBytes() * 2; }
  size_t weightBytes() const override { return store_.bytes(); }
  const ModelConfig& config() const override { return cfg_; }
  Profile takeProfile() override;
  const char* device() const override { return "cpu"; }
  std::string deviceName() const override { return k_.name; }

 private:
  void layer(int l, const StepInput& in);
  void linear(const float* x, int T, const PackedMatrix& w, const std::vector<float>& bias, float* y);
  // y = x · wᵀ in the model's compute mode (timed by the caller).
  void project(const float* x, int T, const PackedMatrix& w, float* y);
  // Several projections of one normalized input: RMSNorm packs it once for all of them.
  struct Projection {
    const PackedMatrix* w;
    const std::vector<float>* bias;
    float* y;
  };
  // `residual`: x_ += tmp_ first (the block before's output), in the same pass over the rows.
  void normThenLinear(const std::vector<float>& norm, std::initializer_list<Projection> outs, int T, bool residual);
  // Row t of a norm's pass: x_ += tmp_ when `residual`, then xn_ = RMSNorm(x_), and in bfloat16
  // mode (bf16Kp > 0) xn_'s row rounded into xbf16_ for the projections (bfloat16 mode runs it
  // in the projections' own parallel region: on 16 cores a region's fork and join cost more
  // than this loop's work). residualNorm: every row, in a parallel loop of its own.
  void normRow(const std::vector<float>& norm, int t, bool residual, int bf16Kp);
  void residualNorm(const std::vector<float>& norm, int T, bool residual);
  // Whether w's matmul reads bf16-rounded rows (bfloat16 mode's pair tiles; not MLX or block-quantized).
  bool readsBf16Rows(const PackedMatrix& w) const;
  static void addBias(float* y, int T, const std::vector<float>& bias);
  // x_ += tmp_ over T rows (the residual connection).
  void addResidual(int T);
  // Final norm → vocabulary projection of `n` rows of x_ (row ids in `rowIds`) into logits.
  void headRows(const int32_t* rowIds, int n, std::vector<float>& rowBuf, float* logits);
  // Prompt log-probs: each of in.scoreRows' target log-prob, rank and top-N into `out`.
  void scorePrompt(const StepInput& in, StepOutput& out);

  // The linear layers repacked for the kernels (see PackedMatrix); norms and
  // biases are read from the mapped files.
  struct PackedLayer {
    PackedMatrix wq, wk, wv, wo, gate, up, down;
    // Norm weights and biases widened once to fp32 (they are small).
    std::vector<float> attnNorm, mlpNorm, qNorm, kNorm, bq, bk, bv;
  };
  // SiLU(gate)·up → down into tmp_; in bfloat16 mode each row is rounded for the down projection
  // in the SiLU's pass.
  void mlpDown(const PackedLayer& P, int T);

  Profile profile_;
  std::mutex profileMutex_;
  ModelConfig cfg_;
  Weights w_;
  const Kernels& k_;
  PackedStore store_;
  std::vector<PackedLayer> packed_;
  PackedMatrix lmHead_;
  std::vector<float> finalNorm_;
  // K/V pools per layer: K as (numBlocks, kvHeads, headDim, blockSize) so a
  // block's keys are vector lanes for the score kernel; V as
  // (numBlocks, kvHeads, blockSize, headDim) for accumulating along headDim.
  // Elements are cfg_.kvDtype: fp32 (exact), or bf16/f16, rounded to nearest
  // even when written and widened exactly by the attention kernels, which
  // halves the pool's bytes and attention's cache reads. Two mmap'ed regions
  // (K and V), each holding every layer, made once and made resident at load
  // (see makeResident), so no step pays a page's first fault.
  size_t kvElems_ = 0;  // per pool
  size_t kvPoolBytes() const { return kvElems_ * dtypeBytes(cfg_.kvDtype); }
  void* kCache_ = nullptr;
  void* vCache_ = nullptr;
  // What attention reads, for row t (run in attention's parallel region): the q/k norms
  // (Qwen3), RoPE on q and k, and the row's k/v into its slot of layer l's pools, rounded to the
  // pool's element E.
  template <class E>
  void attentionInputRow(int l, const StepInput& in, int t);
  // Activations, grown to the largest step seen and reused.
  std::vector<uint16_t> xbf16_;  // bfloat16 mode: a matmul's input rows rounded
  std::vector<float> rows_, logits_, scoreLogits_, xpack_, x_, xn_, q_, kv_k_, kv_v_, attn_, tmp_, gate_, up_, cos_, sin_;
};

}  // namespace weft
