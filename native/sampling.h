// Per-sequence token sampling: penalties, temperature, top-k, top-p, min-p,
// seeded randomness and top-N log-probs.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace weft {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  float topP = 1.0f;
  int topK = 0;              // 0: off
  float minP = 0.0f;
  float repetitionPenalty = 1.0f;
  float presencePenalty = 0.0f;
  float frequencyPenalty = 0.0f;
  uint64_t seed = 0;
  uint32_t counter = 0;      // index of the token being sampled in its request: the RNG stream position
  int numLogprobs = 0;
  // (token id, value) added to its logit before penalties and sampling (logit_bias; -inf bans a
  // token, as min_tokens does to EOS). Log-probs stay those of the raw logits.
  std::vector<std::pair<int32_t, float>> bias;
};

struct Sampled {
  int32_t token = -1;
  float logprob = 0.0f;
  const char* error = nullptr;  // why this row could not be sampled (token stays -1)
};

// A row's error when its logits hold a NaN or an infinity (the CPU sampler's and the GPU argmax's).
constexpr const char* kNonFiniteLogits = "the model produced non-finite logits";

// Why `p` cannot be sampled with (a field out of range once rounded to float32), or null.
const char* samplingError(const SamplingParams& p);

// The first index of the largest of v[0, n) (0 when every element is NaN).
int argmax(const float* v, int n);

// log Σ exp(logits) over the vocabulary, given its largest element (`scratch` is overwritten):
// the normaliser of the raw distribution, computed one way for sampled and scored rows alike.
float logSumExp(const struct Kernels& k, const float* logits, int vocab, float maxLogit, std::vector<float>& scratch);

// The best `n` tokens of `logits` (higher first, lower id on ties) with their log-probs under `lse`.
void topLogprobs(const float* logits, int vocab, float lse, int n, int32_t* ids, float* lps);

// Samples one token from `logits` (vocab floats, left unchanged). Writes the
// top `topN` (id, logprob) pairs of the raw distribution into topIds/topLps.
// `mask` (structured outputs), when not null: ceil(vocab / 32) words, bit t of word t/32 set =
// token t allowed; masked-out tokens get -inf before penalties and sampling, log-probs stay the
// raw ones. `p` must pass samplingError. Fails (Sampled::error) without throwing when the
// logits, or the logits after penalties, are not finite: one row's fault stays in its row.
Sampled sampleToken(const struct Kernels& k, const float* logits, int vocab, const SamplingParams& p, const uint32_t* mask,
                    const int32_t* prompt, int nPrompt, const int32_t* output, int nOutput,
                    int topN, int32_t* topIds, float* topLps, std::vector<float>& scratch);

}  // namespace weft
