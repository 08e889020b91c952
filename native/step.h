// What one forward step takes and returns, shared by every backend (CPU Model, CUDA model):
// the model's shape, the varlen batch over paged block tables, the sampled rows.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>
#include "kernels.h"
#include "sampling.h"

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
  // Decode steps run back to back in one call (vLLM's multi-step scheduling): every sequence is one
  // sampled row whose next step's token is what this one sampled, at the next position (its slot
  // from the block table, which covers them all), with its seed's counter and its penalties' output
  // tokens advanced. Results come sub-step after sub-step (StepOutput's arrays are decodeSteps times
  // as long). No masks, logits or prompt scores. 1: one ordinary step.
  int decodeSteps = 1;
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

// Throws std::invalid_argument when the batch does not fit the model or its own block tables.
void validateStep(const ModelConfig& cfg, const StepInput& in);

// A StepOutput for in's S rows with each row's parameter error (samplingError) and the top-N width set.
StepOutput beginSampling(const StepInput& in);

// Samples row i of `in` from its raw logits (vocab floats) into `out` (a row with an error is skipped).
// `masksMade`: the step's grammar masks were written (see MaskGate); a masked row fails when not.
void sampleRow(const Kernels& k, const StepInput& in, int i, const float* logits, int vocab, StepOutput& out,
               std::vector<float>& scratch, bool masksMade);

// Waits for the step's grammar masks, if they are still being made; false when they could not be.
bool awaitMasks(const StepInput& in);

// What a step runs on: the CPU Model (model.h) or the CUDA one (cuda_backend.h).
class Backend {
 public:
  virtual ~Backend() = default;
  // Starts the step from the calling (JS) thread when that takes a few microseconds: a CUDA decode
  // step whose graph is captured is uploaded and launched here, so the GPU need not wait for a worker
  // thread to wake and pick the step up. True when started; step(in) then finishes it (the same `in`).
  // Throws what step() would for an invalid batch.
  virtual bool launch(const StepInput&) { return false; }
  virtual StepOutput step(const StepInput& in) = 0;
  // A multi-step decode (StepInput::decodeSteps > 1, already validated) run by the backend itself into
  // `out`, or false to have runDecodeSteps run it one step() at a time. The CUDA backend runs every
  // step on the GPU, each fed the tokens the one before sampled there, when every row is sampled there.
  virtual bool decodeOnDevice(const StepInput&, StepOutput&) { return false; }
  virtual size_t kvCacheBytes() const = 0;
  // Bytes of the weight matrices as the backend holds them: what one decode step reads.
  virtual size_t weightBytes() const = 0;
  virtual const ModelConfig& config() const = 0;
  virtual Profile takeProfile() = 0;
  // "cpu" or "cuda", and the device's name (the CPU's kernel set, or the GPU's name).
  virtual const char* device() const = 0;
  virtual std::string deviceName() const = 0;
  // Whether step() must run on the addon's compute thread (compute_thread.h), where every OpenMP
  // region of the CPU model starts. A step that does not is run on the worker thread that took it:
  // one thread hand-off fewer each way.
  virtual bool needsComputeThread() const { return true; }
};

// in.decodeSteps steps of `m` (see StepInput::decodeSteps; one is m.step(in)), each sub-step's outputs
// after the one before; a row that fails goes on with token 0 and reports its first error in every
// later sub-step.
StepOutput runDecodeSteps(Backend& m, StepInput in);

}  // namespace weft
