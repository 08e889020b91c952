// The transformer (Llama / Mistral / Qwen2 / Qwen3 family) and its paged KV cache.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <condition_variable>
#include <mutex>
#include <vector>
#include "kernels.h"
#include "sampling.h"
#include "weights.h"

namespace weft {

struct ModelConfig {
  int hidden = 0, intermediate = 0, layers = 0, heads = 0, kvHeads = 0, headDim = 0, vocab = 0;
  float rmsEps = 1e-6f;
  float attentionScaling = 1.0f;  // rope "attention_factor"; 1 for default and llama3
  std::vector<float> invFreq;     // (headDim / 2) rope inverse frequencies, scaling applied
  int numBlocks = 0, blockSize = 32;
  // Compute mode: false = float32 (the exact reference path); true = bfloat16, every
  // linear layer's input rounded to bf16 and its weights held as bf16 pair tiles.
  bool bf16 = false;
  // KV cache element: F32, or BF16/F16 (half the bytes: twice the tokens per byte of pool).
  DType kvDtype = DType::F32;
};

// Where a step waits for grammar masks that are still being made (StepInput::maskGate): the JS
// side opens it with the outcome once it has written them.
class MaskGate {
 public:
  void reset();
  // made: the masks are written; false: they could not be made.
  void open(bool made);
  // True once opened with made = true; false when opened with false or after `patience` seconds.
  bool wait(int patience);

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int state_ = 0;  // 0 waiting, 1 made, 2 failed
};

// One forward step over a flat, variable-length batch (see src/runtime/native.ts).
struct StepInput {
  std::vector<int32_t> tokens;       // (T)
  std::vector<int32_t> positions;    // (T)
  std::vector<int32_t> seqStarts;    // (B+1) row offsets of each sequence
  std::vector<int32_t> slotMapping;  // (T) block * blockSize + offset where each row's K/V goes
  std::vector<int32_t> blockTables;  // (B * maxBlocks) physical block ids, -1 padded
  std::vector<int32_t> contextLens;  // (B) tokens in the cache for each sequence after this step
  int maxBlocks = 0;
  std::vector<int32_t> sampleRows;   // (S) rows whose logits are sampled
  std::vector<SamplingParams> params;  // (S)
  // Grammar masks (structured outputs): row i's maskWords words start at masks[maskOffsets[i]], -1 = none.
  // The words are read in place (the addon keeps the JS array alive). With a maskGate, the masks
  // are still being written while the forward pass runs: sampling waits until the gate opens
  // (if they could not be made, the masked rows fail).
  std::vector<int32_t> maskOffsets;  // (S)
  const uint32_t* masks = nullptr;
  size_t masksLength = 0;
  int maskWords = 0;
  MaskGate* maskGate = nullptr;
  std::vector<int32_t> promptOffsets, promptTokens;  // (S+1), flat: tokens for the repetition penalty
  std::vector<int32_t> outputOffsets, outputTokens;  // (S+1), flat: generated tokens for all penalties
  // Prompt log-probs: row scoreRows[i]'s logits score token scoreTargets[i] (the prompt's next token)
  // and give their top scoreTopN[i]. Reduced per row in the step, a few rows at a time: no (rows × vocab) output.
  std::vector<int32_t> scoreRows, scoreTargets, scoreTopN;  // (R)
  bool returnLogits = false;
};

struct StepOutput {
  std::vector<int32_t> tokens;       // (S) sampled ids, -1 where the row failed
  std::vector<const char*> rowErrors;  // (S) why a row could not be sampled, null when it was
  std::vector<float> logprobs;       // (S) log-prob of each sampled id under the raw logits
  int topN = 0;
  std::vector<int32_t> topIds;       // (S * topN)
  std::vector<float> topLogprobs;    // (S * topN)
  std::vector<float> logits;         // (S * vocab) when asked
  std::vector<float> scoreLogprobs;  // (R) log-prob of each scored target under its row's raw logits
  std::vector<int32_t> scoreRanks;   // (R) 1 + the number of tokens with a higher logit than the target
  int scoreTopN = 0;
  std::vector<int32_t> scoreTopIds;  // (R * scoreTopN), -1 where a row asked fewer
  std::vector<float> scoreTopLogprobs;  // (R * scoreTopN)
};

// Seconds spent per kind of work since the last read: the profile behind docs/PERFORMANCE.md.
struct Profile {
  double matmul = 0, attention = 0, lmHead = 0, sampling = 0, other = 0;
  long steps = 0, tokens = 0;
};

class Model {
 public:
  Model(ModelConfig config, Weights weights);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  StepOutput step(const StepInput& in);
  size_t kvCacheBytes() const { return kvPoolBytes() * 2; }
  const ModelConfig& config() const { return cfg_; }
  Profile takeProfile();

 private:
  void validate(const StepInput& in) const;
  void layer(int l, const StepInput& in);
  // Final norm → vocabulary projection of `n` rows of x_ (row ids in `rows`) into logits.
  void headRows(const int32_t* rows, int n, std::vector<float>& rowBuf, float* logits);
  void scorePrompt(const StepInput& in, StepOutput& out);
  void linear(const float* x, int T, const PackedMatrix& w, const std::vector<float>& bias, float* y);
  // y = x · wᵀ in the model's compute mode (timed by the caller).
  void project(const float* x, int T, const PackedMatrix& w, float* y);
  // Several projections of one normalized input: RMSNorm packs it once for all of them.
  struct Projection {
    const PackedMatrix* w;
    const std::vector<float>* bias;
    float* y;
  };
  void normThenLinear(const std::vector<float>& norm, std::initializer_list<Projection> outs, int T);
  static void addBias(float* y, int T, const std::vector<float>& bias);

  // The linear layers repacked for the kernels (see PackedMatrix); norms and
  // biases are read from the mapped files.
  struct PackedLayer {
    PackedMatrix wq, wk, wv, wo, gate, up, down;
    // Norm weights and biases widened once to fp32 (they are small).
    std::vector<float> attnNorm, mlpNorm, qNorm, kNorm, bq, bk, bv;
  };

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
  // (numBlocks, blockSize, kvHeads, headDim) for accumulating along headDim.
  // Elements are cfg_.kvDtype: fp32 (exact), or bf16/f16, rounded to nearest
  // even when written and widened exactly by the attention kernels, which
  // halves the pool's bytes and attention's cache reads. Two mmap'ed regions
  // (K and V), each holding every layer, made once: pages are zero and take no
  // memory until a block is first written.
  size_t kvElems_ = 0;  // per pool
  size_t kvPoolBytes() const { return kvElems_ * dtypeBytes(cfg_.kvDtype); }
  void* kCache_ = nullptr;
  void* vCache_ = nullptr;
  // Row t of kv_k_ / kv_v_ into its slot of layer l's pools, rounded to the pool's element.
  template <class E>
  void writeKv(int l, const StepInput& in);
  // Activations, grown to the largest step seen and reused.
  std::vector<uint16_t> xbf16_;  // bfloat16 mode: a matmul's input rows rounded
  std::vector<float> rows_, logits_, scoreLogits_, xpack_, x_, xn_, q_, kv_k_, kv_v_, attn_, tmp_, gate_, up_, cos_, sin_;
};

}  // namespace weft
