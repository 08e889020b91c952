#include "sampling.h"
#include "kernels.h"
#include "vec_math.h"
#include <algorithm>
#include <cmath>
#include <cstring>

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

// The loops over the whole vocabulary are compiled for AVX-512, AVX2 and baseline x86-64, one
// picked when the addon loads (GCC's target_clones). Without FP contraction every clone gives the
// same bits; without trapping math GCC turns their selects into blends and vectorises them.
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math", "fp-contract=off")
#define WEFT_VOCAB_LOOP __attribute__((target_clones("avx512f", "avx2", "default")))

// Bit tests over the whole row rather than std::isfinite with an early exit: these loops vectorise.
uint32_t floatBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// No NaN and no ±inf: the exponent bits are never all ones.
WEFT_VOCAB_LOOP bool allFinite(const float* v, int n) {
  uint32_t bad = 0;
  for (int i = 0; i < n; i++) bad |= (~floatBits(v[i]) & 0x7f800000u) == 0;
  return bad == 0;
}

// Penalised logits can be sampled when none is NaN or +inf and one is above -inf.
WEFT_VOCAB_LOOP bool samplable(const float* v, int n) {
  uint32_t bad = 0, any = 0;
  for (int i = 0; i < n; i++) {
    const uint32_t b = floatBits(v[i]);
    bad |= (b & 0x7fffffffu) > 0x7f800000u || b == 0x7f800000u;
    any |= b != 0xff800000u;
  }
  return bad == 0 && any != 0;
}

// Sixteen floats or ints: GCC's generic vectors, one zmm register in the AVX-512 clone, two ymm
// in the AVX2 one (its auto-vectoriser turned an array of sixteen running maxima into scalars).
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

}  // namespace

// Sixteen running maxima and the first index where each was reached, then the first index among
// the lanes holding the largest. A scan carrying the best index in its dependency chain took
// 0.3 ms over 152k floats.
WEFT_VOCAB_LOOP int argmax(const float* v, int n) {
  F16 best;
  I16 at;
  const I16 lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  for (int j = 0; j < 16; j++) {
    best[j] = -INFINITY;
    at[j] = n;
  }
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    F16 x;
    std::memcpy(&x, v + i, sizeof x);
    const I16 better = x > best;
    best = better ? x : best;
    at = better ? lane + i : at;
  }
  float top = -INFINITY;
  int first = 0;
  for (; i < n; i++)
    if (v[i] > top) {
      top = v[i];
      first = i;
    }
  for (int j = 0; j < 16; j++)
    if (best[j] > top || (best[j] == top && at[j] < first)) {
      top = best[j];
      first = at[j];
    }
  return first;
}

namespace {

// exp(x) for x <= 0 (NaN excluded): vec_math.h's reduction and polynomial in plain float
// arithmetic, the same bits in every clone and on every CPU, so a seeded draw does not depend on
// the kernel set (their exps differ in the last bit). Below -87 it returns 0, a weight under
// 2^-125 of the most likely token's.
inline float expNonPositive(float x) {
  WEFT_EXP_CONSTANTS
  const float c = x > -87.0f ? x : -87.0f;
  const float n = (c * kLog2e + 12582912.0f) - 12582912.0f;  // + 1.5 × 2^23 rounds to an integer
  float r = c - n * kLn2Hi;
  r = r - n * kLn2Lo;
  float q = kP0;
  q = q * r + kP1;
  q = q * r + kP2;
  q = q * r + kP3;
  q = q * r + kP4;
  q = q * r + kP5;
  q = q * r * r + (r + 1.0f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) * (1 << 23);  // 2^n, n in [-126, 0]
  float scale;
  std::memcpy(&scale, &bits, 4);
  return x > -87.0f ? q * scale : 0.0f;
}

// A token's sampling weight exp((l - max) / T): 1 for the most likely token, 0 for a banned one
// (-inf), and 0 under min-p (the weight is the probability relative to the most likely token's).
inline float weight(float l, float max, float invT, float minP) {
  const float w = expNonPositive((l - max) * invT);
  return w < minP ? 0.0f : w;
}

constexpr int kBlock = 256;

// Weights of tokens [0, n) into w, and each block of kBlock tokens' sum into blocks (sixteen
// float lanes added in a fixed order).
WEFT_VOCAB_LOOP void weighBlocks(const float* l, int n, float max, float invT, float minP, float* w, float* blocks) {
  for (int i = 0; i < n; i++) w[i] = weight(l[i], max, invT, minP);
  for (int from = 0; from < n; from += kBlock) {
    const int to = std::min(n, from + kBlock);
    float lanes[16] = {};
    int i = from;
    for (; i + 16 <= to; i += 16)
      for (int j = 0; j < 16; j++) lanes[j] += w[i + j];
    for (; i < to; i++) lanes[0] += w[i];
    float sum = 0;
    for (float x : lanes) sum += x;
    blocks[from / kBlock] = sum;
  }
}

// Weight floors for top-p: the candidates are the tokens at or above the highest floor whose
// tokens hold the mass asked for, not every token with weight.
constexpr float kFloors[] = {1e-1f, 1e-2f, 1e-3f, 1e-4f, 1e-6f, 1e-9f};
constexpr int kNumFloors = sizeof kFloors / sizeof kFloors[0];

// The weight of the tokens at or above each floor, summed in sixteen float lanes.
WEFT_VOCAB_LOOP void massAtFloors(const float* w, int n, double* mass) {
  F16 acc[kNumFloors] = {};
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    F16 x;
    std::memcpy(&x, w + i, sizeof x);
    for (int f = 0; f < kNumFloors; f++) acc[f] += x >= kFloors[f] ? x : 0.0f;
  }
  for (int f = 0; f < kNumFloors; f++) {
    mass[f] = 0;
    for (int j = 0; j < 16; j++) mass[f] += acc[f][j];
    for (int k = i; k < n; k++) mass[f] += w[k] >= kFloors[f] ? w[k] : 0.0f;
  }
}

#undef WEFT_VOCAB_LOOP
#pragma GCC pop_options

// Every token's weight into w, its blocks' sums into blocks, and their total in double.
double weighAll(const float* l, int n, float max, float invT, float minP, std::vector<float>& w, std::vector<float>& blocks) {
  w.resize(n);
  blocks.resize((n + kBlock - 1) / kBlock);
  weighBlocks(l, n, max, invT, minP, w.data(), blocks.data());
  double total = 0;
  for (float b : blocks) total += b;
  return total;
}

// The token where the running sum of weights first exceeds r (in [0, total)): the blocks' sums
// find its block, then its tokens are added one by one. Where rounding leaves r past every sum,
// the last token with weight in that block, or overall.
int drawFromBlocks(const std::vector<float>& w, const std::vector<float>& blocks, double r) {
  const int n = static_cast<int>(w.size());
  double acc = 0;
  int lastBlock = 0;
  for (int b = 0; b < static_cast<int>(blocks.size()); b++) {
    if (blocks[b] <= 0) continue;
    lastBlock = b;
    if (acc + blocks[b] > r) break;
    acc += blocks[b];
  }
  int last = -1;
  for (int i = lastBlock * kBlock; i < std::min(n, (lastBlock + 1) * kBlock); i++) {
    if (w[i] <= 0) continue;
    last = i;
    acc += w[i];
    if (r < acc) return i;
  }
  return last;
}

// The best n tokens of v (higher first, lower id on ties), -inf ones included when fewer are
// finite: one pass keeping them in a small heap, worst on top.
void bestTokens(const float* v, int vocab, int n, std::vector<int>& heap) {
  ByLogit better{v};
  heap.clear();
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
}

// Top-p over candidates (ids with their weights w): keeps the shortest prefix of them by weight,
// lower id first on equal weights (the order of their logits, but for logits whose weights round
// equal), whose weight reaches `need`. Found by partitioning around pivots (a weighted quickselect)
// instead of sorting them all; ids[0, returned) is that prefix, in no particular order. Each part's
// weight is summed in double in its order, so the prefix can differ from a sorted walk's by
// rounding only.
int topPPrefix(std::vector<int>& ids, std::vector<float>& w, double need) {
  const auto before = [&](int a, int b) { return w[a] > w[b] || (w[a] == w[b] && ids[a] < ids[b]); };
  int lo = 0, hi = static_cast<int>(ids.size());  // the boundary token is in [lo, hi)
  while (hi - lo > 1) {
    const int a = lo, b = lo + (hi - lo) / 2, c = hi - 1;  // median of three as the pivot
    const int m = before(a, b) ? (before(b, c) ? b : (before(a, c) ? c : a)) : (before(a, c) ? a : (before(b, c) ? c : b));
    std::swap(ids[m], ids[hi - 1]);
    std::swap(w[m], w[hi - 1]);
    const float pw = w[hi - 1];
    const int pid = ids[hi - 1];
    int split = lo;
    double mass = 0;
    for (int i = lo; i < hi - 1; i++) {  // without branches: on random weights they mispredicted half the time
      const float wi = w[i];
      const int id = ids[i];
      const bool first = wi > pw || (wi == pw && id < pid);
      w[i] = w[split];  // [split, i) holds the part after the pivot: swapping within it changes nothing
      ids[i] = ids[split];
      w[split] = wi;
      ids[split] = id;
      mass += first ? wi : 0.0f;
      split += first;
    }
    if (mass >= need) {
      hi = split;
      continue;
    }
    need -= mass;
    std::swap(ids[hi - 1], ids[split]);  // the pivot follows the part before it
    std::swap(w[hi - 1], w[split]);
    if (w[split] >= need) return split + 1;
    need -= w[split];
    lo = split + 1;
  }
  return hi;
}

// Draws from candidates ids[0, n) (n >= 1, every weight > 0) with weights w in their order; the
// last one where rounding leaves r past every sum.
int drawFromList(const std::vector<int>& ids, const std::vector<float>& w, int n, double u) {
  double total = 0;
  for (int i = 0; i < n; i++) total += w[i];
  const double r = u * total;
  double acc = 0;
  for (int i = 0; i < n - 1; i++)
    if (r < (acc += w[i])) return ids[i];
  return ids[n - 1];
}

struct DrawScratch {
  std::vector<float> w, blocks, candidateW;
  std::vector<int> ids, best;
};

// A token drawn from exp((l - max) / T) under top-k, min-p and top-p, in that order, with the
// uniform of (seed, counter). l has no NaN or +inf and at least one finite entry, max is its
// largest; banned tokens are -inf and get weight 0.
int sampleTemperature(const float* l, int vocab, float max, const SamplingParams& p) {
  static thread_local DrawScratch s;  // kept across steps
  const double u = uniform(p.seed, p.counter);
  const float invT = 1.0f / p.temperature;
  s.ids.clear();
  s.candidateW.clear();
  double total = 0;
  if (p.topK > 0 && p.topK < vocab) {
    bestTokens(l, vocab, p.topK, s.best);
    for (int id : s.best)
      if (const float w = weight(l[id], max, invT, p.minP); w > 0) {
        s.ids.push_back(id);
        s.candidateW.push_back(w);
        total += w;
      }
  } else {
    total = weighAll(l, vocab, max, invT, p.minP, s.w, s.blocks);
    if (p.topP >= 1.0f) return drawFromBlocks(s.w, s.blocks, u * total);
    double mass[kNumFloors];
    massAtFloors(s.w.data(), vocab, mass);
    float floor = 0;  // a floor is taken with a margin far above its float sum's rounding
    for (int f = kNumFloors - 1; f >= 0; f--)
      if (mass[f] >= p.topP * total * (1 + 1e-4)) floor = kFloors[f];
    for (int i = 0; i < vocab; i++)
      if (s.w[i] > 0 && s.w[i] >= floor) {
        s.ids.push_back(i);
        s.candidateW.push_back(s.w[i]);
      }
  }
  const int n = p.topP < 1.0f ? topPPrefix(s.ids, s.candidateW, p.topP * total) : static_cast<int>(s.ids.size());
  return drawFromList(s.ids, s.candidateW, n, u);
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
  static thread_local std::vector<int> best;
  bestTokens(logits, vocab, n, best);
  for (int i = 0; i < n; i++) {
    ids[i] = best[i];
    lps[i] = logits[best[i]] - lse;
  }
}

Sampled sampleToken(const Kernels& k, const float* logits, int vocab, const SamplingParams& p, const uint32_t* mask,
                    const int32_t* prompt, int nPrompt, const int32_t* output, int nOutput,
                    int topN, int32_t* topIds, float* topLps, std::vector<float>& scratch) {
  // Log-probs are reported from the model's raw distribution, as vLLM does by default.
  if (!allFinite(logits, vocab)) return failed(kNonFiniteLogits);
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
  const int top = work == logits ? best : argmax(work, vocab);
  s.token = greedy ? top : sampleTemperature(work, vocab, work[top], p);
  s.logprob = logits[s.token] - lse;

  if (topN > 0) topLogprobs(logits, vocab, lse, std::min(topN, vocab), topIds, topLps);
  return s;
}

}  // namespace weft
