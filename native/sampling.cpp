#include "sampling.h"
#include "kernels.h"
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace weft {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform in [0, 1) that depends only on (seed, counter): the same request
// draws the same numbers whatever else shares its batch.
double uniform(uint64_t seed, uint32_t counter) {
  uint64_t r = splitmix64(splitmix64(seed) ^ (static_cast<uint64_t>(counter) * 0xD1B54A32D192ED03ull));
  return static_cast<double>(r >> 11) * 0x1.0p-53;
}

// Higher logit first, lower id on ties: one total order, so results never
// depend on the sort implementation.
struct ByLogit {
  const float* v;
  bool operator()(int a, int b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

void applyPenalties(float* logits, const SamplingParams& p, const int32_t* prompt, int nPrompt,
                    const int32_t* output, int nOutput, int vocab, std::vector<int>& counts) {
  bool rep = p.repetitionPenalty != 1.0f;
  bool freq = p.presencePenalty != 0.0f || p.frequencyPenalty != 0.0f;
  if (!rep && !freq) return;
  counts.assign(vocab, 0);
  for (int i = 0; i < nOutput; i++) counts[output[i]]++;
  if (rep) {
    std::vector<char> seen(vocab, 0);
    for (int i = 0; i < nPrompt; i++) seen[prompt[i]] = 1;
    for (int i = 0; i < nOutput; i++) seen[output[i]] = 1;
    for (int t = 0; t < vocab; t++)
      if (seen[t]) logits[t] = logits[t] > 0 ? logits[t] / p.repetitionPenalty : logits[t] * p.repetitionPenalty;
  }
  if (freq)
    for (int t = 0; t < vocab; t++)
      if (counts[t] > 0) logits[t] -= p.frequencyPenalty * counts[t] + p.presencePenalty;
}

// Bit tests over the whole row rather than std::isfinite with an early exit: these loops vectorise.
uint32_t floatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// No NaN and no ±inf: the exponent bits are never all ones.
bool allFinite(const float* v, int n) {
  uint32_t bad = 0;
  for (int i = 0; i < n; i++) bad |= (~floatBits(v[i]) & 0x7f800000u) == 0;
  return bad == 0;
}

// Penalised logits can be sampled when none is NaN or +inf and one is above -inf.
bool samplable(const float* v, int n) {
  uint32_t bad = 0, any = 0;
  for (int i = 0; i < n; i++) {
    const uint32_t b = floatBits(v[i]);
    bad |= (b & 0x7fffffffu) > 0x7f800000u || b == 0x7f800000u;
    any |= b != 0xff800000u;
  }
  return bad == 0 && any != 0;
}

// Tokens whose mask bit is clear can never be sampled. Word by word: all-allowed and all-banned
// words (most of them, in most grammar states) take no per-token test, and a mixed word visits only
// its clear bits (a per-token test mispredicts on such words: it was 10x slower).
void applyMask(float* logits, const uint32_t* mask, int vocab) {
  const int words = vocab / 32;
  for (int w = 0; w < words; w++) {
    const uint32_t m = mask[w];
    float* l = logits + static_cast<size_t>(w) * 32;
    if (m == ~0u) continue;
    if (m == 0) {
      std::fill(l, l + 32, -INFINITY);
      continue;
    }
    for (uint32_t banned = ~m; banned != 0; banned &= banned - 1) l[__builtin_ctz(banned)] = -INFINITY;
  }
  for (int t = words * 32; t < vocab; t++)
    if (!((mask[t >> 5] >> (t & 31)) & 1u)) logits[t] = -INFINITY;
}

// The first highest logit among the tokens `mask` allows, or -1 when it allows none; words with
// no bit set are skipped whole.
int maskedArgmax(const float* logits, const uint32_t* mask, int vocab) {
  int best = -1;
  for (int w = 0; w * 32 < vocab; w++) {
    for (uint32_t bits = mask[w]; bits != 0; bits &= bits - 1) {
      const int t = w * 32 + __builtin_ctz(bits);
      if (t >= vocab) break;
      if (best < 0 || logits[t] > logits[best]) best = t;
    }
  }
  return best;
}

Sampled failed(const char* why) {
  Sampled s;
  s.error = why;
  return s;
}

int argmax(const float* v, int n) {
  int best = 0;
  for (int i = 1; i < n; i++)
    if (v[i] > v[best]) best = i;
  return best;
}

int sampleFromCandidates(const float* logits, const SamplingParams& p, std::vector<int>& cand) {
  ByLogit order{logits};
  int n = static_cast<int>(cand.size());
  if (p.topK > 0 && p.topK < n) {
    std::nth_element(cand.begin(), cand.begin() + p.topK, cand.end(), order);
    cand.resize(p.topK);
    n = p.topK;
  }
  float maxLogit = logits[*std::min_element(cand.begin(), cand.end(), order)];
  std::vector<double> prob(n);
  double total = 0;
  for (int i = 0; i < n; i++) total += prob[i] = std::exp((static_cast<double>(logits[cand[i]]) - maxLogit) / p.temperature);
  if (p.minP > 0.0f) {  // unnormalised, the most likely token has weight exactly 1
    double floor = p.minP;
    int kept = 0;
    for (int i = 0; i < n; i++)
      if (prob[i] >= floor) { cand[kept] = cand[i]; prob[kept++] = prob[i]; }
    n = kept;
    cand.resize(n);
    prob.resize(n);
    total = std::accumulate(prob.begin(), prob.end(), 0.0);
  }
  if (p.topP < 1.0f) {
    std::vector<int> idx(n);
    std::iota(idx.begin(), idx.end(), 0);
    std::sort(idx.begin(), idx.end(), [&](int a, int b) { return order(cand[a], cand[b]); });
    std::vector<int> c2;
    std::vector<double> p2;
    double cum = 0;
    for (int i : idx) {
      c2.push_back(cand[i]);
      p2.push_back(prob[i]);
      cum += prob[i];
      if (cum >= p.topP * total) break;
    }
    cand.swap(c2);
    prob.swap(p2);
    n = static_cast<int>(cand.size());
    total = cum;
  }
  double r = uniform(p.seed, p.counter) * total, acc = 0;
  for (int i = 0; i < n; i++) {
    acc += prob[i];
    if (r < acc) return cand[i];
  }
  return cand[n - 1];
}

}  // namespace

const char* samplingError(const SamplingParams& p) {
  if (!(p.temperature >= 0 && std::isfinite(p.temperature))) return "invalid sampling parameters: temperature must be a finite number >= 0";
  if (!(p.topP > 0 && p.topP <= 1)) return "invalid sampling parameters: top_p must be > 0 and <= 1 in float32";
  if (!(p.minP >= 0 && p.minP <= 1)) return "invalid sampling parameters: min_p must be between 0 and 1";
  if (p.topK < 0) return "invalid sampling parameters: top_k must be >= 0";
  if (!(p.repetitionPenalty > 0 && std::isfinite(p.repetitionPenalty)))
    return "invalid sampling parameters: repetition_penalty must be a finite number > 0 in float32";
  if (!std::isfinite(p.presencePenalty)) return "invalid sampling parameters: presence_penalty must be finite";
  if (!std::isfinite(p.frequencyPenalty)) return "invalid sampling parameters: frequency_penalty must be finite";
  if (p.numLogprobs > 1000) return "invalid sampling parameters: logprobs must be at most 1000";
  return nullptr;
}

float logSumExp(const Kernels& k, const float* logits, int vocab, float maxLogit, std::vector<float>& scratch) {
  scratch.assign(logits, logits + vocab);
  return maxLogit + std::log(k.expSum(scratch.data(), vocab, maxLogit));
}

void topLogprobs(const float* logits, int vocab, float lse, int n, int32_t* ids, float* lps) {
  // One pass keeping the best n in a small heap (worst on top).
  ByLogit better{logits};
  std::vector<int> heap;
  heap.reserve(n + 1);
  for (int i = 0; i < vocab; i++) {
    if (static_cast<int>(heap.size()) < n) {
      heap.push_back(i);
      std::push_heap(heap.begin(), heap.end(), better);
    } else if (better(i, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), better);
      heap.back() = i;
      std::push_heap(heap.begin(), heap.end(), better);
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  for (int i = 0; i < n; i++) {
    ids[i] = heap[i];
    lps[i] = logits[heap[i]] - lse;
  }
}

Sampled sampleToken(const Kernels& k, const float* logits, int vocab, const SamplingParams& p, const uint32_t* mask,
                    const int32_t* prompt, int nPrompt, const int32_t* output, int nOutput,
                    int topN, int32_t* topIds, float* topLps, std::vector<float>& scratch) {
  // Log-probs are reported from the model's raw distribution, as vLLM does by default.
  if (!allFinite(logits, vocab)) return failed("the model produced non-finite logits");
  const int best = argmax(logits, vocab);
  const float maxLogit = logits[best];
  const float lse = logSumExp(k, logits, vocab, maxLogit, scratch);

  // Biases and penalties change a copy; without them the raw logits are sampled directly.
  const float* work = logits;
  const bool penalised = p.repetitionPenalty != 1.0f || p.presencePenalty != 0.0f || p.frequencyPenalty != 0.0f;
  const bool greedy = p.temperature <= 1e-5f || p.topK == 1;
  if (mask && greedy && !penalised && p.bias.empty()) {
    // Greedy under a mask alone: the first best allowed token, read from the raw logits (the
    // general path's copy, mask and argmax give the same token at three passes' cost).
    const int chosen = maskedArgmax(logits, mask, vocab);
    if (chosen < 0) return failed("the biases, penalties or token mask left no token to sample");
    Sampled s;
    s.token = chosen;
    s.logprob = logits[chosen] - lse;
    if (topN > 0) topLogprobs(logits, vocab, lse, std::min(topN, vocab), topIds, topLps);
    return s;
  }
  if (penalised || !p.bias.empty() || mask) {
    scratch.assign(logits, logits + vocab);
    for (const auto& [id, value] : p.bias) {
      if (id < 0 || id >= vocab) return failed("a logit_bias token id is outside the vocabulary");
      scratch[id] += value;
    }
    if (mask) applyMask(scratch.data(), mask, vocab);
    std::vector<int> counts;
    if (penalised) applyPenalties(scratch.data(), p, prompt, nPrompt, output, nOutput, vocab, counts);
    if (!samplable(scratch.data(), vocab)) return failed("the biases, penalties or token mask left no token to sample");
    work = scratch.data();
  }

  Sampled s;
  if (p.temperature <= 1e-5f || p.topK == 1) {
    s.token = work == logits ? best : argmax(work, vocab);
  } else {
    // Banned tokens (mask, -inf bias) have probability 0: leaving them out changes no draw, and
    // a grammar state that allows a few tokens costs a few exps instead of the vocabulary's.
    std::vector<int> cand;
    cand.reserve(work == logits ? vocab : 0);
    for (int t = 0; t < vocab; t++)
      if (work[t] != -INFINITY) cand.push_back(t);
    s.token = sampleFromCandidates(work, p, cand);
  }
  s.logprob = logits[s.token] - lse;

  if (topN > 0) topLogprobs(logits, vocab, lse, std::min(topN, vocab), topIds, topLps);
  return s;
}

}  // namespace weft
