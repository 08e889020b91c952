#include "model.h"
#include <sys/mman.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include "mlx_quant.h"
#include "ops.h"
#include "quant.h"

namespace weft {
namespace {

std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(t ? static_cast<size_t>(t.rows) * t.cols : 0);
  for (size_t i = 0; i < out.size(); i++) out[i] = t.at(i);
  return out;
}

template <class E>
void grow(std::vector<E>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// Maps every page of [mem, mem + bytes) now, two threads at a time: the first write to a page
// costs a fault and its zeroing (on the VMs measured, 1.2-2.4 s a GiB, the host backing the
// page too), which a lazily mapped pool paid inside the steps that first reached each block
// (`bench offline --concurrency 32`, bf16 qwen3-0.6b shape: decode 329-332 -> 345-355 tok/s,
// prefill 900-988 -> 1061-1089). llama.cpp clears its KV buffer at creation for the same
// effect. False when the memory is not there (MADV_POPULATE_WRITE's ENOMEM).
bool makeResident(void* mem, size_t bytes) {
#ifndef MADV_POPULATE_WRITE
  constexpr int MADV_POPULATE_WRITE = 23;  // Linux 5.14's value, for older headers
#endif
  constexpr size_t kChunk = size_t{2} << 20;
  char* base = static_cast<char*>(mem);
  const long chunks = static_cast<long>((bytes + kChunk - 1) / kChunk);
  bool ok = true;
#pragma omp parallel for schedule(dynamic, 8) reduction(&& : ok)
  for (long c = 0; c < chunks; c++) {
    char* at = base + static_cast<size_t>(c) * kChunk;
    const size_t n = std::min(kChunk, bytes - static_cast<size_t>(c) * kChunk);
    if (madvise(at, n, MADV_POPULATE_WRITE) == 0) continue;
    if (errno == ENOMEM) {
      ok = false;
      continue;
    }
    for (size_t o = 0; o < n; o += 4096) reinterpret_cast<volatile char*>(at)[o] = 0;  // kernels before 5.14: touch each page
  }
  return ok;
}

// Adds the time since construction to `into` when it goes out of scope.
class Timer {
 public:
  explicit Timer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~Timer() { into_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Model::Model(ModelConfig config, Weights weights)
    : cfg_(std::move(config)), w_(std::move(weights)), k_(activeKernels()) {
  auto pack = [this](const Tensor& t) {  // quantized weights stay quantized in either compute mode
    if (isMlx(t.dtype)) return store_.packMlx(t);
    if (isQuantized(t.dtype)) return store_.packQuantized(t, k_);
    // bf16 weights read in pair tiles by float32 mode too where the set has that kernel (exact: no rounding)
    const bool pairs = cfg_.bf16 || (t.dtype == DType::BF16 && k_.matmulPairsF32);
    return pairs ? store_.packPairTiles(t) : store_.pack(t, k_.chunk);
  };
  for (const LayerWeights& L : w_.layers) {
    packed_.push_back({pack(L.wq), pack(L.wk), pack(L.wv), pack(L.wo), pack(L.gate), pack(L.up), pack(L.down),
                       widen(L.attnNorm), widen(L.mlpNorm), widen(L.qNorm), widen(L.kNorm), widen(L.bq), widen(L.bk), widen(L.bv)});
    for (const Tensor* t : {&L.wq, &L.wk, &L.wv, &L.wo, &L.gate, &L.up, &L.down}) releasePages(*t);
  }
  lmHead_ = pack(w_.lmHead);
  finalNorm_ = widen(w_.finalNorm);
  if (w_.lmHead.data != w_.embed.data) releasePages(w_.lmHead);  // a tied head is still the embedding table
  size_t perLayer = static_cast<size_t>(cfg_.numBlocks) * cfg_.blockSize * cfg_.kvHeads * cfg_.headDim;
  kvElems_ = perLayer * cfg_.layers;
  for (void** pool : {&kCache_, &vCache_}) {
    void* mem = mmap(nullptr, kvPoolBytes(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
      if (kCache_) munmap(kCache_, kvPoolBytes());  // no destructor runs for a throwing constructor
      throw std::runtime_error("cannot allocate the KV cache (" + std::to_string(kvCacheBytes() >> 20) + " MiB)");
    }
    madvise(mem, kvPoolBytes(), MADV_HUGEPAGE);  // attention reads the pools in 8 KiB runs anywhere in them: fewer TLB misses
    *pool = mem;
    if (!makeResident(mem, kvPoolBytes())) {
      munmap(kCache_, kvPoolBytes());
      if (vCache_) munmap(vCache_, kvPoolBytes());
      throw std::runtime_error("cannot make the KV cache resident (" + std::to_string(kvCacheBytes() >> 20) + " MiB): not enough memory");
    }
  }
}

Model::~Model() {
  if (kCache_) munmap(kCache_, kvPoolBytes());
  if (vCache_) munmap(vCache_, kvPoolBytes());
}

Profile Model::takeProfile() {
  std::lock_guard<std::mutex> lock(profileMutex_);
  Profile p = profile_;
  profile_ = Profile{};
  return p;
}

void Model::project(const float* x, int T, const PackedMatrix& w, float* y) {
  if (isMlx(w.dtype)) matmulMlx(k_, x, T, w, y);  // fp32 activations in both compute modes
  else if (isQuantized(w.dtype)) matmulQuantized(k_, x, T, w, y);
  else if (readsBf16Rows(w)) matmulBf16(k_, x, T, w, y, xbf16_);
  else if (w.pairTiles) matmulPairsF32(k_, x, T, w, y, xpack_);
  else matmulParallel(k_, x, T, w, y, xpack_);
}

void Model::linear(const float* x, int T, const PackedMatrix& w, const std::vector<float>& bias, float* y) {
  {
    Timer t(profile_.matmul);
    project(x, T, w, y);
  }
  addBias(y, T, bias);
}

bool Model::readsBf16Rows(const PackedMatrix& w) const {
  return cfg_.bf16 && w.pairTiles && !isMlx(w.dtype) && !isQuantized(w.dtype);
}

void Model::normRow(const std::vector<float>& norm, int t, bool residual, int bf16Kp) {
  const int H = cfg_.hidden;
  float* x = x_.data() + static_cast<size_t>(t) * H;
  float* xn = xn_.data() + static_cast<size_t>(t) * H;
  if (residual) {
    const float* r = tmp_.data() + static_cast<size_t>(t) * H;
    for (int i = 0; i < H; i++) x[i] += r[i];
  }
  rmsnormRow(x, norm.data(), xn, H, cfg_.rmsEps);
  if (bf16Kp > 0) packRowBf16(k_, xn, H, bf16Kp, xbf16_.data() + static_cast<size_t>(t) * bf16Kp);
}

void Model::residualNorm(const std::vector<float>& norm, int T, bool residual) {
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++) normRow(norm, t, residual, 0);
}

void Model::normThenLinear(const std::vector<float>& norm, std::initializer_list<Projection> outs, int T, bool residual) {
  const PackedMatrix& first = *outs.begin()->w;
  bool quantized = false, allBlocks = true;  // MLX matrices read the fp32 rows as they are
  for (const Projection& p : outs) {
    quantized = quantized || isMlx(p.w->dtype) || isQuantized(p.w->dtype);
    allBlocks = allBlocks && !isMlx(p.w->dtype) && isQuantized(p.w->dtype);
  }
  const auto products = [&outs] {  // for the branches whose matmul takes all the projections at once
    std::vector<MatrixProduct> v;
    for (const Projection& p : outs) v.push_back({p.w, p.y});
    return v;
  };
  if (allBlocks) {  // block-quantized (whatever the mix of types): the rows quantized once for all
    residualNorm(norm, T, residual);
    {
      Timer t(profile_.matmul);
      matmulQuantizedShared(k_, xn_.data(), T, products());
    }
    for (const Projection& p : outs) addBias(p.y, T, *p.bias);
    return;
  }
  if (quantized) {
    residualNorm(norm, T, residual);
    for (const Projection& p : outs) linear(xn_.data(), T, *p.w, *p.bias, p.y);
    return;
  }
  if (cfg_.bf16) {  // normalized in fp32, rounded to bf16 once for all the projections (they share K), in the matmul's region
    grow(xbf16_, static_cast<size_t>(T) * first.Kp);
    {
      Timer t(profile_.matmul);
      matmulPackedBf16Shared(k_, xbf16_.data(), T, products(), [&](int row) { normRow(norm, row, residual, first.Kp); });
    }
    for (const Projection& p : outs) addBias(p.y, T, *p.bias);
    return;
  }
  bool shared = !first.pairTiles;  // one packing serves all when the matrices agree on layout (pair tiles read rows as they are)
  for (const Projection& p : outs) shared = shared && p.w->Kp == first.Kp && p.w->dtype == first.dtype;
  if (!shared) {
    residualNorm(norm, T, residual);
    for (const Projection& p : outs) linear(xn_.data(), T, *p.w, *p.bias, p.y);
    return;
  }
  if (residual) addResidual(T);
  rmsnormPacked(x_.data(), norm.data(), T, cfg_.hidden, cfg_.rmsEps, k_, first, xpack_);
  for (const Projection& p : outs) {
    Timer t(profile_.matmul);
    matmulPacked(k_, xpack_.data(), T, *p.w, p.y);
    addBias(p.y, T, *p.bias);
  }
}

void Model::addBias(float* y, int T, const std::vector<float>& bias) {
  const int n = static_cast<int>(bias.size());
  for (int t = 0; t < T && n > 0; t++)
    for (int i = 0; i < n; i++) y[static_cast<size_t>(t) * n + i] += bias[i];
}

void Model::layer(int l, const StepInput& in) {
  const PackedLayer& P = packed_[l];
  const int T = static_cast<int>(in.tokens.size()), hd = cfg_.headDim;
  const int kvDim = cfg_.kvHeads * hd;

  // Attention block: (the layer before's residual) → norm → q/k/v → (q/k norm) → rope → cache write
  // → paged attention → out proj.
  normThenLinear(P.attnNorm, {{&P.wq, &P.bq, q_.data()}, {&P.wk, &P.bk, kv_k_.data()}, {&P.wv, &P.bv, kv_v_.data()}}, T, l > 0);

  const size_t layerOffset = static_cast<size_t>(l) * cfg_.numBlocks * cfg_.blockSize * kvDim * dtypeBytes(cfg_.kvDtype);
  const char* kc = static_cast<const char*>(kCache_) + layerOffset;
  const char* vc = static_cast<const char*>(vCache_) + layerOffset;
  AttentionArgs a{q_.data(), attn_.data(), kc, vc, cfg_.kvDtype, in.positions.data(), in.seqStarts.data(), in.blockTables.data(),
                  static_cast<int>(in.seqStarts.size()) - 1, cfg_.heads, cfg_.kvHeads, hd, cfg_.blockSize, in.maxBlocks,
                  1.0f / std::sqrt(static_cast<float>(hd))};
  {
    Timer t(profile_.attention);  // with the q/k norms, RoPE and the cache write, in attention's region
    if (cfg_.kvDtype == DType::F32) pagedAttention(k_, a, [&](int row) { attentionInputRow<float>(l, in, row); });
    else pagedAttention(k_, a, [&](int row) { attentionInputRow<uint16_t>(l, in, row); });
  }
  linear(attn_.data(), T, P.wo, {}, tmp_.data());

  // MLP block: residual → norm → gate/up → SiLU(gate)·up → down (its residual joins at the next norm).
  const std::vector<float> none;
  normThenLinear(P.mlpNorm, {{&P.gate, &none, gate_.data()}, {&P.up, &none, up_.data()}}, T, true);
  mlpDown(P, T);
}

void Model::mlpDown(const PackedLayer& P, int T) {
  const int I = cfg_.intermediate, Kp = P.down.Kp;
  const bool bf16 = readsBf16Rows(P.down);
  const auto siluRow = [&](int t) {  // row by row: each row's lanes line up the same way in any batch
    float* g = gate_.data() + static_cast<size_t>(t) * I;
    k_.siluMul(g, up_.data() + static_cast<size_t>(t) * I, I);
    if (bf16) packRowBf16(k_, g, I, Kp, xbf16_.data() + static_cast<size_t>(t) * Kp);
  };
  if (!bf16) {
#pragma omp parallel for if (T > kParallelRows)
    for (int t = 0; t < T; t++) siluRow(t);
    linear(gate_.data(), T, P.down, {}, tmp_.data());
    return;
  }
  grow(xbf16_, static_cast<size_t>(T) * Kp);
  Timer t(profile_.matmul);
  matmulPackedBf16(k_, xbf16_.data(), T, P.down, tmp_.data(), siluRow);  // the SiLU in the matmul's region
}

void Model::addResidual(int T) {
  const int H = cfg_.hidden;
#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++)
    for (size_t i = static_cast<size_t>(t) * H; i < static_cast<size_t>(t + 1) * H; i++) x_[i] += tmp_[i];
}

template <class E>
void Model::attentionInputRow(int l, const StepInput& in, int t) {
  const PackedLayer& P = packed_[l];
  const int hd = cfg_.headDim, half = hd / 2, kvDim = cfg_.kvHeads * hd, bs = cfg_.blockSize;
  const size_t layerOffset = static_cast<size_t>(l) * cfg_.numBlocks * bs * kvDim;
  E* kc = static_cast<E*>(kCache_) + layerOffset;
  E* vc = static_cast<E*>(vCache_) + layerOffset;
  const DType kv = cfg_.kvDtype;
  auto store = [kv](float x) -> E {
    if constexpr (std::is_same_v<E, float>) return x;
    else return kv == DType::F16 ? f32ToF16(x) : f32ToBf16(x);
  };
  const auto normHeads = [&](float* x, int heads, const std::vector<float>& weight) {  // Qwen3's q/k norms, head by head
    if (weight.empty()) return;
    for (int h = 0; h < heads; h++) rmsnormRow(x + static_cast<size_t>(h) * hd, weight.data(), x + static_cast<size_t>(h) * hd, hd, cfg_.rmsEps);
  };
  float* q = q_.data() + static_cast<size_t>(t) * cfg_.heads * hd;
  float* kt = kv_k_.data() + static_cast<size_t>(t) * kvDim;
  const float* vt = kv_v_.data() + static_cast<size_t>(t) * kvDim;
  normHeads(q, cfg_.heads, P.qNorm);
  normHeads(kt, cfg_.kvHeads, P.kNorm);
  const float* c = cos_.data() + static_cast<size_t>(t) * half;
  const float* s = sin_.data() + static_cast<size_t>(t) * half;
  ropeRow(q, cfg_.heads, hd, c, s);
  ropeRow(kt, cfg_.kvHeads, hd, c, s);
  const int slot = in.slotMapping[t], block = slot / bs, offset = slot % bs;
  for (int h = 0; h < cfg_.kvHeads; h++)  // keys dimension-major within the block (see pagedAttention)
    for (int d = 0; d < hd; d++)
      kc[((static_cast<size_t>(block) * cfg_.kvHeads + h) * hd + d) * bs + offset] = store(kt[static_cast<size_t>(h) * hd + d]);
  for (int h = 0; h < cfg_.kvHeads; h++)  // a head's values contiguous within the block: one stream per job
    for (int d = 0; d < hd; d++)
      vc[((static_cast<size_t>(block) * cfg_.kvHeads + h) * bs + offset) * hd + d] = store(vt[static_cast<size_t>(h) * hd + d]);
}

StepOutput Model::step(const StepInput& in) {
  validateStep(cfg_, in);
  std::lock_guard<std::mutex> lock(profileMutex_);
  const auto stepStart = std::chrono::steady_clock::now();
  const Profile before = profile_;
  const int T = static_cast<int>(in.tokens.size()), H = cfg_.hidden, hd = cfg_.headDim, half = hd / 2;
  const int S = static_cast<int>(in.sampleRows.size());
  grow(x_, static_cast<size_t>(T) * H);
  grow(xn_, static_cast<size_t>(T) * H);
  grow(tmp_, static_cast<size_t>(T) * H);
  grow(q_, static_cast<size_t>(T) * cfg_.heads * hd);
  grow(attn_, static_cast<size_t>(T) * cfg_.heads * hd);
  grow(kv_k_, static_cast<size_t>(T) * cfg_.kvHeads * hd);
  grow(kv_v_, static_cast<size_t>(T) * cfg_.kvHeads * hd);
  grow(gate_, static_cast<size_t>(T) * cfg_.intermediate);
  grow(up_, static_cast<size_t>(T) * cfg_.intermediate);
  grow(cos_, static_cast<size_t>(T) * half);
  grow(sin_, static_cast<size_t>(T) * half);

#pragma omp parallel for if (T > kParallelRows)
  for (int t = 0; t < T; t++) {
    w_.embed.rowToF32(in.tokens[t], x_.data() + static_cast<size_t>(t) * H);
    for (int i = 0; i < half; i++) {  // angle in fp32 as transformers computes it; cos/sin rounded once
      float angle = static_cast<float>(in.positions[t]) * cfg_.invFreq[i];
      cos_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(static_cast<double>(angle))) * cfg_.attentionScaling;
      sin_[static_cast<size_t>(t) * half + i] = static_cast<float>(std::sin(static_cast<double>(angle))) * cfg_.attentionScaling;
    }
  }
  for (int l = 0; l < cfg_.layers; l++) layer(l, in);
  addResidual(T);  // the last layer's MLP output (each layer's joins at the next layer's norm)

  // Only the sampled rows go through the final norm and the vocabulary projection.
  // Reused across steps: a fresh (S × vocab) buffer per step would be page-faulted and zeroed every time.
  grow(logits_, static_cast<size_t>(S) * cfg_.vocab);
  const float* logits = logits_.data();
  headRows(in.sampleRows.data(), S, rows_, logits_.data());
  // Masks made while the forward pass ran: wait for them (the wait counts as "other" time).
  const bool masksMade = awaitMasks(in);
  const auto sampleStart = std::chrono::steady_clock::now();

  // A row with bad parameters fails alone: the other rows are sampled as if it were not there.
  StepOutput out = beginSampling(in);
#pragma omp parallel
  {
    static thread_local std::vector<float> scratch;  // kept across steps
#pragma omp for schedule(dynamic, 1)
    for (int i = 0; i < S; i++) sampleRow(k_, in, i, logits + static_cast<size_t>(i) * cfg_.vocab, cfg_.vocab, out, scratch, masksMade);
  }
  const auto scoreStart = std::chrono::steady_clock::now();
  profile_.sampling += std::chrono::duration<double>(scoreStart - sampleStart).count();
  scorePrompt(in, out);  // its own timers add to lmHead and sampling
  const auto end = std::chrono::steady_clock::now();
  const double total = std::chrono::duration<double>(end - stepStart).count();
  const double accounted = (profile_.matmul - before.matmul) + (profile_.attention - before.attention) +
                           (profile_.lmHead - before.lmHead) + (profile_.sampling - before.sampling);
  profile_.other += total - accounted;
  profile_.steps++;
  profile_.tokens += T;
  if (in.returnLogits) out.logits.assign(logits, logits + static_cast<size_t>(S) * cfg_.vocab);
  return out;
}

void Model::headRows(const int32_t* rowIds, int n, std::vector<float>& rowBuf, float* logits) {
  const int H = cfg_.hidden;
  grow(rowBuf, static_cast<size_t>(n) * H);
  float* rows = rowBuf.data();
  for (int i = 0; i < n; i++)
    std::copy_n(x_.data() + static_cast<size_t>(rowIds[i]) * H, H, rows + static_cast<size_t>(i) * H);
  rmsnorm(rows, finalNorm_.data(), rows, n, H, cfg_.rmsEps);
  if (n > 0) {
    Timer t(profile_.lmHead);
    project(rows, n, lmHead_, logits);
  }
}

// Each scored row: the log-prob and rank of its target and its top-N, from the same raw
// logits and normaliser a sampled row reports. The rows go through the vocabulary projection
// kScoreChunk at a time, so a long prompt never holds (rows × vocab) floats; a matmul's rows
// are independent, so the values do not depend on that chunking or on the batch.
void Model::scorePrompt(const StepInput& in, StepOutput& out) {
  constexpr int kScoreChunk = 16;
  const int R = static_cast<int>(in.scoreRows.size()), V = cfg_.vocab;
  for (int i = 0; i < R; i++) out.scoreTopN = std::max(out.scoreTopN, in.scoreTopN[i]);
  out.scoreLogprobs.assign(R, 0.0f);
  out.scoreRanks.assign(R, 0);
  out.scoreTopIds.assign(static_cast<size_t>(R) * out.scoreTopN, -1);
  out.scoreTopLogprobs.assign(static_cast<size_t>(R) * out.scoreTopN, 0.0f);
  if (R == 0) return;
  grow(scoreLogits_, static_cast<size_t>(std::min(R, kScoreChunk)) * V);
  for (int c = 0; c < R; c += kScoreChunk) {
    const int n = std::min(kScoreChunk, R - c);
    headRows(in.scoreRows.data() + c, n, rows_, scoreLogits_.data());
    Timer t(profile_.sampling);
#pragma omp parallel
    {
      static thread_local std::vector<float> scratch;
#pragma omp for schedule(dynamic, 1)
      for (int j = 0; j < n; j++) {
        const int i = c + j;
        const float* lg = scoreLogits_.data() + static_cast<size_t>(j) * V;
        const float lse = logSumExp(k_, lg, V, lg[argmax(lg, V)], scratch);
        const float target = lg[in.scoreTargets[i]];
        int above = 0;
        for (int v = 0; v < V; v++) above += lg[v] > target;
        out.scoreLogprobs[i] = target - lse;
        out.scoreRanks[i] = 1 + above;
        if (in.scoreTopN[i] > 0)
          topLogprobs(lg, V, lse, std::min(in.scoreTopN[i], V), out.scoreTopIds.data() + static_cast<size_t>(i) * out.scoreTopN,
                      out.scoreTopLogprobs.data() + static_cast<size_t>(i) * out.scoreTopN);
      }
    }
  }
}

}  // namespace weft
