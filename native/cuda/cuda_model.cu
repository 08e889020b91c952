// The CUDA backend: the same varlen step over paged block tables as the CPU Model
// (native/model.cpp), on GPU 0. Weights are uploaded once as bf16; GEMMs run through
// cuBLAS in bf16 with fp32 accumulation and output; the KV pools live in GPU memory.
// Greedy rows are sampled on the GPU; every other row's logits are copied back and
// sampled by the CPU sampler (sampling.cpp), so seeded results match the CPU path.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <omp.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include "../cuda_backend.h"
#include "cuda_kernels.h"

namespace weft {
namespace {

using cuda::bf16;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuBLAS ") + what + ": " + cublasGetStatusString(s));
}

// GPU memory of n elements, grown (contents dropped) on demand.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~DeviceArray() { if (p_) cudaFree(p_); }
  // True when the memory moved (captured graphs that use it are stale).
  bool grow(size_t n, const char* what) {
    if (n <= n_) return false;
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
    check(cudaMalloc(&p_, n * sizeof(T)), what);
    n_ = n;
    return true;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Pinned host memory for the step's transfers, grown on demand.
template <class T>
class PinnedArray {
 public:
  ~PinnedArray() { if (p_) cudaFreeHost(p_); }
  void grow(size_t n) {
    if (n <= n_) return;
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
    check(cudaMallocHost(&p_, n * sizeof(T)), "pinned allocation");
    n_ = n;
  }
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A tensor's rows widened (or dequantized) then rounded to bf16, as stored when it is bf16 already.
void appendBf16(const Tensor& t, std::vector<uint16_t>& out) {
  const size_t n = static_cast<size_t>(t.rows) * t.cols, at = out.size();
  out.resize(at + n);
  if (t.dtype == DType::BF16) {
    std::memcpy(out.data() + at, t.data, n * 2);
    return;
  }
  std::vector<float> row(t.cols);
  for (int r = 0; r < t.rows; r++) {
    t.rowToF32(r, row.data());
    for (int c = 0; c < t.cols; c++) out[at + static_cast<size_t>(r) * t.cols + c] = f32ToBf16(row[c]);
  }
}

std::vector<float> widen(const Tensor& t) {
  std::vector<float> out(t ? static_cast<size_t>(t.rows) * t.cols : 0);
  for (size_t i = 0; i < out.size(); i++) out[i] = t.at(i);
  return out;
}

template <class T>
DeviceArray<T> toDevice(const std::vector<T>& host, const char* what) {
  DeviceArray<T> d;
  if (host.empty()) return d;
  d.grow(host.size(), what);
  check(cudaMemcpy(d.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), what);
  return d;
}

DeviceArray<bf16> uploadBf16(std::initializer_list<const Tensor*> parts, const char* what) {
  std::vector<uint16_t> host;
  for (const Tensor* t : parts) appendBf16(*t, host);
  DeviceArray<bf16> d;
  d.grow(host.size(), what);
  check(cudaMemcpy(d.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice), what);
  return d;
}

// Whether row i is plain greedy: the GPU's argmax is exactly what sampleToken would return.
bool greedyOnGpu(const StepInput& in, int i) {
  const SamplingParams& p = in.params[i];
  return (p.temperature <= 1e-5f || p.topK == 1) && p.repetitionPenalty == 1.0f && p.presencePenalty == 0.0f &&
         p.frequencyPenalty == 0.0f && p.bias.empty() && in.maskOffsets[i] == -1 && p.numLogprobs == 0;
}

class CudaModel : public Backend {
 public:
  CudaModel(ModelConfig cfg, Weights w) : cfg_(std::move(cfg)), k_(activeKernels()) {
    check(cudaSetDevice(0), "set device");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "device properties");
    name_ = prop.name;
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
    check(cublasCreate(&blas_), "create");
    check(cublasSetStream(blas_, stream_), "set stream");
    // A workspace of our own: cuBLAS then allocates nothing while a graph is being captured.
    workspace_.grow(kWorkspaceBytes, "cuBLAS workspace");
    check(cublasSetWorkspace(blas_, workspace_.get(), kWorkspaceBytes), "set workspace");
    const char* graphs = std::getenv("WEFT_CUDA_GRAPHS");
    graphs_ = !(graphs && std::string(graphs) == "0");
    const char* profiling = std::getenv("WEFT_CUDA_PROFILE");
    profiling_ = profiling && std::string(profiling) == "1";
    const int hd = cfg_.headDim;
    for (const LayerWeights& L : w.layers) {
      Layer d;
      d.qkv = uploadBf16({&L.wq, &L.wk, &L.wv}, "upload q/k/v");
      d.o = uploadBf16({&L.wo}, "upload o");
      d.gateUp = uploadBf16({&L.gate, &L.up}, "upload gate/up");
      d.down = uploadBf16({&L.down}, "upload down");
      d.attnNorm = toDevice(widen(L.attnNorm), "upload norm");
      d.mlpNorm = toDevice(widen(L.mlpNorm), "upload norm");
      d.qNorm = toDevice(widen(L.qNorm), "upload q norm");
      d.kNorm = toDevice(widen(L.kNorm), "upload k norm");
      if (L.bq || L.bk || L.bv) {  // a missing one of the three is zero
        std::vector<float> b(static_cast<size_t>(cfg_.heads + 2 * cfg_.kvHeads) * hd, 0.0f);
        auto put = [&](const Tensor& t, size_t at) { for (float x : widen(t)) b[at++] = x; };
        put(L.bq, 0);
        put(L.bk, static_cast<size_t>(cfg_.heads) * hd);
        put(L.bv, static_cast<size_t>(cfg_.heads + cfg_.kvHeads) * hd);
        d.bias = toDevice(b, "upload biases");
      }
      layers_.push_back(std::move(d));
    }
    embed_ = uploadBf16({&w.embed}, "upload embeddings");
    tied_ = w.lmHead.data == w.embed.data;
    if (!tied_) lmHead_ = uploadBf16({&w.lmHead}, "upload lm head");
    finalNorm_ = toDevice(widen(w.finalNorm), "upload final norm");
    invFreq_ = toDevice(cfg_.invFreq, "upload rope");
    const size_t elem = cfg_.kvDtype == DType::F32 ? 4 : 2;
    kvLayerBytes_ = static_cast<size_t>(cfg_.numBlocks) * cfg_.blockSize * cfg_.kvHeads * hd * elem;
    const size_t pool = kvLayerBytes_ * cfg_.layers;
    for (void** p : {&kCache_, &vCache_})
      if (cudaMalloc(p, pool) != cudaSuccess) {
        cudaGetLastError();
        release();
        throw std::runtime_error("cannot allocate the KV cache on the GPU (" + std::to_string((pool * 2) >> 20) + " MiB)");
      }
  }

  ~CudaModel() override { release(); }

  size_t kvCacheBytes() const override { return kvLayerBytes_ * cfg_.layers * 2; }
  // Every matrix in bf16; the output projection (the embedding table when tied) is read once a step either way.
  size_t weightBytes() const override {
    const size_t h = cfg_.hidden, q = static_cast<size_t>(cfg_.heads) * cfg_.headDim, kv = static_cast<size_t>(cfg_.kvHeads) * cfg_.headDim;
    const size_t layer = (q + 2 * kv) * h + h * q + 3 * static_cast<size_t>(cfg_.intermediate) * h;
    return 2 * (layer * cfg_.layers + static_cast<size_t>(cfg_.vocab) * h);
  }
  const ModelConfig& config() const override { return cfg_; }
  const char* device() const override { return "cuda"; }
  std::string deviceName() const override { return name_; }
  // A step waits on the GPU, so it runs on the libuv worker that took it (launched from the JS thread
  // before, when it replays a graph: launch()): the compute thread's hand-off and back cost 10-80 us
  // of a 1.3 ms one-sequence step on the H200 host (GPU.md). The CPU sampler's one parallel region a
  // step (rows not sampled on the GPU) then starts on that worker.
  bool needsComputeThread() const override { return false; }

  Profile takeProfile() override {
    std::lock_guard<std::mutex> lock(mutex_);
    Profile p = profile_;
    profile_ = Profile{};
    return p;
  }

  bool launch(const StepInput& in) override {
    std::lock_guard<std::mutex> lock(mutex_);
    launched_ = begin(in, true);
    return launched_;
  }

  StepOutput step(const StepInput& in) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!launched_) begin(in, false);
    launched_ = false;
    StepOutput out = beginSampling(in);
    const double sampling = sample(in, static_cast<int>(in.sampleRows.size()), out);
    account(in, 1, sampling);
    return out;
  }

  // Every step of the run on the GPU, back to back: after the first (launched like any step), a kernel
  // writes each row's sampled token, next position and slot into the step's device inputs and the
  // forward pass runs again (its graph replayed); each step's argmax rows are copied back behind it,
  // and the host waits once, at the end.
  bool decodeOnDevice(const StepInput& in, StepOutput& out) override {
    const int T = static_cast<int>(in.tokens.size()), k = in.decodeSteps;
    for (int i = 0; i < T; i++)
      if (!greedyOnGpu(in, i)) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    if (!launched_) begin(in, false);
    launched_ = false;
    hostGreedy_.grow(static_cast<size_t>(k) * T);
    for (int j = 0; j < k; j++) {
      if (j > 0) {
        int32_t* ints = ints_.get();  // tokens_, positions_ and slots_ (uploadStep's layout)
        cuda::advanceDecode(greedy_.get(), T, tables_, in.maxBlocks, cfg_.blockSize, ints, ints + T, ints + 2 * T, stream_);
        run(in, T, T, T);
      }
      check(cudaMemcpyAsync(hostGreedy_.get() + static_cast<size_t>(j) * T, greedy_.get(), T * sizeof(cuda::Greedy), cudaMemcpyDeviceToHost, stream_),
            "copy back");
    }
    check(cudaStreamSynchronize(stream_), "step");
    out = stepsOutput(in, hostGreedy_.get());
    account(in, k, 0.0);
    return true;
  }

 private:
  struct Layer {
    DeviceArray<bf16> qkv, o, gateUp, down;
    DeviceArray<float> attnNorm, mlpNorm, qNorm, kNorm, bias;
  };

  cuda::KvElem kvElem() const {
    return cfg_.kvDtype == DType::F32 ? cuda::KvElem::F32 : cfg_.kvDtype == DType::BF16 ? cuda::KvElem::BF16 : cuda::KvElem::F16;
  }

  // y (T × N, fp32) = x (T × K, bf16) · wᵀ (w: N × K, bf16, row-major) + beta · y. One or two rows
  // (decode steps of one or two sequences) go to the GEMV that loads its weights before its PDL wait
  // (or, for K it does not take, the skinny kernel), which streams the weights at the memory's pace;
  // up to kMmaRows rows to the tensor-core kernel that streams them too; more to cuBLAS. A row's result can therefore differ in the last bits between steps whose row counts take
  // different paths (see docs/GPU.md, batch invariance).
  void gemm(const bf16* x, int T, const bf16* w, int N, int K, float* y, float beta) {
    if (T <= cuda::kSkinnyRows && K % 8 == 0) return cuda::skinnyGemm(x, T, w, N, K, y, beta, stream_);
    if (cuda::mmaRowsGemm(x, T, w, N, K, y, beta, stream_)) return;
    const float alpha = 1.0f;
    check(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, y,
                       CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "gemm");
  }

  // y = bf16(RMSNorm(x_) · norm) · wᵀ + beta · y (K = hidden): one fused kernel for one or two rows,
  // else the norm into xn_ and then the GEMM. The same bits either way.
  void normedGemm(const float* norm, int T, const bf16* w, int N, float* y, float beta) {
    const int H = cfg_.hidden;
    if (cuda::normedGemv(x_.get(), T, norm, cfg_.rmsEps, w, N, H, y, beta, stream_)) return;
    cuda::rmsnormToBf16(x_.get(), nullptr, H, norm, cfg_.rmsEps, T, xn_.get(), stream_);
    gemm(xn_.get(), T, w, N, H, y, beta);
  }

  // x_ += bf16(SiLU(gate) · up) · downᵀ from the gate/up output gu_: one fused kernel for one or two
  // rows, else SiLU·mul into xn_ and then the GEMM. The same bits either way.
  void siluMulGemm(int T, const bf16* down, float* y) {
    const int H = cfg_.hidden, I = cfg_.intermediate;
    bool fused = false;
    timed(&Profile::matmul, [&] { fused = cuda::siluMulGemv(gu_.get(), T, down, H, I, y, 1.0f, stream_); });
    if (fused) return;
    cuda::siluMul(gu_.get(), T, I, xn_.get(), stream_);
    timed(&Profile::matmul, [&] { gemm(xn_.get(), T, down, H, I, y, 1.0f); });
  }

  // The step's index arrays in one transfer: tokens, positions, slots, each row's sequence, block tables, sample rows.
  void uploadStep(const StepInput& in, int T, int B, int S) {
    const size_t tables = static_cast<size_t>(B) * in.maxBlocks;
    const size_t n = 4 * static_cast<size_t>(T) + tables + S;
    hostInts_.grow(n);
    int32_t* h = hostInts_.get();
    std::memcpy(h, in.tokens.data(), T * 4);
    std::memcpy(h + T, in.positions.data(), T * 4);
    std::memcpy(h + 2 * T, in.slotMapping.data(), T * 4);
    for (int b = 0; b < B; b++)
      for (int t = in.seqStarts[b]; t < in.seqStarts[b + 1]; t++) h[3 * T + t] = b;
    std::memcpy(h + 4 * T, in.blockTables.data(), tables * 4);
    std::memcpy(h + 4 * T + tables, in.sampleRows.data(), S * 4);
    check(cudaMemcpyAsync(ints_.get(), h, n * 4, cudaMemcpyHostToDevice, stream_), "upload step");
    tokens_ = ints_.get();
    positions_ = tokens_ + T;
    slots_ = tokens_ + 2 * T;
    seqOf_ = tokens_ + 3 * T;
    tables_ = tokens_ + 4 * T;
    sampleRows_ = tables_ + tables;
  }

  // Grows every device buffer the step needs; a buffer that moves makes the captured graphs stale.
  void prepare(const StepInput& in, int T, int B, int S) {
    const int H = cfg_.hidden, I = cfg_.intermediate, qDim = cfg_.heads * cfg_.headDim;
    const int qkvDim = (cfg_.heads + 2 * cfg_.kvHeads) * cfg_.headDim;
    bool moved = ints_.grow(4 * static_cast<size_t>(T) + static_cast<size_t>(B) * in.maxBlocks + S, "step inputs");
    moved |= x_.grow(static_cast<size_t>(T) * H, "activations");
    moved |= xn_.grow(static_cast<size_t>(T) * std::max({H, I, qDim}), "activations");
    moved |= qkv_.grow(static_cast<size_t>(T) * qkvDim, "activations");
    moved |= gu_.grow(static_cast<size_t>(T) * 2 * I, "activations");
    moved |= rope_.grow(static_cast<size_t>(T) * (cfg_.headDim / 2), "rope");
    const int chunks = cuda::attentionChunks(in.maxBlocks * cfg_.blockSize);
    if (chunks > 1) moved |= partial_.grow(static_cast<size_t>(T) * cfg_.heads * chunks * (cfg_.headDim + 2), "attention chunks");
    if (S > 0) {
      moved |= rows_.grow(static_cast<size_t>(S) * H, "activations");
      moved |= logits_.grow(static_cast<size_t>(S) * cfg_.vocab, "logits");
      moved |= greedy_.grow(S, "greedy");
      moved |= greedyParts_.grow(static_cast<size_t>(S) * cuda::kGreedyChunks, "greedy");
    }
    if (moved) dropGraphs();
  }

  // Checks the step, grows the buffers, uploads its inputs and launches its forward pass; with
  // replayOnly, only when that is a captured graph's replay (false, nothing uploaded, otherwise).
  bool begin(const StepInput& in, bool replayOnly) {
    check(cudaSetDevice(0), "set device");  // the JS thread, or whichever worker thread libuv picks
    started_ = std::chrono::steady_clock::now();
    validateStep(cfg_, in);
    if (!in.scoreRows.empty()) throw std::invalid_argument("prompt log-probs are not computed on the CUDA backend");
    const int T = static_cast<int>(in.tokens.size()), B = static_cast<int>(in.seqStarts.size()) - 1;
    const int S = static_cast<int>(in.sampleRows.size());
    prepare(in, T, B, S);
    if (replayOnly && !(graphed(in, T, B, S) && graphExecs_.count({T, in.maxBlocks}))) return false;
    uploadStep(in, T, B, S);
    run(in, T, B, S);
    return true;
  }

  // Decode steps (one sampled row per sequence, no logits asked) replay a CUDA graph of the
  // forward pass, captured once per (rows, block-table width): a few hundred kernel launches
  // become one. Everything a graph reads sits at fixed addresses; only the contents change.
  bool graphed(const StepInput& in, int T, int B, int S) const {
    return graphs_ && !profiling_ && T == S && B == T && !in.returnLogits;
  }

  void run(const StepInput& in, int T, int B, int S) {
    if (!graphed(in, T, B, S)) return forward(in, T, S);
    const std::pair<int, int> key{T, in.maxBlocks};
    auto it = graphExecs_.find(key);
    if (it == graphExecs_.end()) {
      if (graphExecs_.size() >= kMaxGraphs) dropGraphs();
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin capture");
      try {
        forward(in, T, S);
      } catch (...) {
        cudaStreamEndCapture(stream_, &graph);
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      check(cudaStreamEndCapture(stream_, &graph), "end capture");
      cudaGraphExec_t exec = nullptr;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      check(made, "instantiate graph");
      it = graphExecs_.emplace(key, exec).first;
    }
    check(cudaGraphLaunch(it->second, stream_), "launch graph");
  }

  // WEFT_CUDA_PROFILE=1: each kind of work between CUDA events, read once the step has synchronized
  // (graphs off, so the launches stay separate). Costs a little time per launch.
  template <class F>
  void timed(double Profile::*into, F&& launch) {
    if (!profiling_) return launch();
    while (events_.size() < 2 * (spans_.size() + 1)) {
      cudaEvent_t e = nullptr;
      check(cudaEventCreate(&e), "event");
      events_.push_back(e);
    }
    cudaEvent_t a = events_[2 * spans_.size()], b = events_[2 * spans_.size() + 1];
    check(cudaEventRecord(a, stream_), "event");
    launch();
    check(cudaEventRecord(b, stream_), "event");
    spans_.push_back(into);
  }

  // Adds the step's timed spans to the profile; returns their total seconds.
  double collectSpans() {
    double total = 0;
    for (size_t i = 0; i < spans_.size(); i++) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]), "event time");
      profile_.*spans_[i] += ms / 1000.0;
      total += ms / 1000.0;
    }
    spans_.clear();
    return total;
  }

  void dropGraphs() {
    for (auto& [key, exec] : graphExecs_) cudaGraphExecDestroy(exec);
    graphExecs_.clear();
  }

  // The forward pass's launches, in stream order (captured into a graph for decode steps).
  void forward(const StepInput& in, int T, int S) {
    const int H = cfg_.hidden, I = cfg_.intermediate, hd = cfg_.headDim;
    const int qDim = cfg_.heads * hd, qkvDim = (cfg_.heads + 2 * cfg_.kvHeads) * hd;
    cuda::embed(tokens_, T, embed_.get(), H, x_.get(), stream_);
    cuda::ropeTable(positions_, invFreq_.get(), cfg_.attentionScaling, T, hd / 2, rope_.get(), stream_);
    const bool decode = static_cast<int>(in.seqStarts.size()) - 1 == T;  // each row its sequence's one new token
    for (int l = 0; l < cfg_.layers; l++) {
      const Layer& L = layers_[l];
      timed(&Profile::matmul, [&] { normedGemm(L.attnNorm.get(), T, L.qkv.get(), qkvDim, qkv_.get(), 0.0f); });
      char* kc = static_cast<char*>(kCache_) + kvLayerBytes_ * l;
      char* vc = static_cast<char*>(vCache_) + kvLayerBytes_ * l;
      timed(&Profile::attention, [&] {
        const cuda::QkvArgs e{qkv_.get(), L.bias.get(), L.qNorm.get(), L.kNorm.get(), rope_.get(), cfg_.rmsEps, slots_, kc, vc,
                              kvElem(), T, cfg_.heads, cfg_.kvHeads, hd};
        const cuda::AttentionArgs a{qkv_.get(), kc, vc, kvElem(), positions_, seqOf_, tables_, xn_.get(), T, cfg_.heads, cfg_.kvHeads, hd,
                                    cfg_.blockSize, in.maxBlocks, 1.0f / std::sqrt(static_cast<float>(hd)), partial_.get(),
                                    cuda::attentionChunks(in.maxBlocks * cfg_.blockSize)};
        if (decode && cuda::decodeAttention(e, a, stream_)) return;
        cuda::qkvNormRopeCache(e, stream_);
        cuda::pagedAttention(a, stream_);
      });
      // The residual add is the GEMM's beta = 1.
      timed(&Profile::matmul, [&] { gemm(xn_.get(), T, L.o.get(), H, qDim, x_.get(), 1.0f); });
      timed(&Profile::matmul, [&] { normedGemm(L.mlpNorm.get(), T, L.gateUp.get(), 2 * I, gu_.get(), 0.0f); });
      siluMulGemm(T, L.down.get(), x_.get());
    }
    // Only the sampled rows go through the final norm and the vocabulary projection.
    if (S == 0) return;
    cuda::rmsnormToBf16(x_.get(), sampleRows_, H, finalNorm_.get(), cfg_.rmsEps, S, rows_.get(), stream_);
    timed(&Profile::lmHead, [&] { gemm(rows_.get(), S, tied_ ? embed_.get() : lmHead_.get(), cfg_.vocab, H, logits_.get(), 0.0f); });
    timed(&Profile::sampling, [&] { cuda::greedy(logits_.get(), S, cfg_.vocab, greedyParts_.get(), greedy_.get(), stream_); });
  }

  // Greedy rows take the GPU's argmax; the others (and every row when logits are asked for)
  // copy their logits back for the CPU sampler. Returns the seconds the CPU sampler took.
  double sample(const StepInput& in, int S, StepOutput& out) {
    if (S == 0) {
      check(cudaStreamSynchronize(stream_), "step");
      return 0;
    }
    const size_t V = cfg_.vocab;
    hostGreedy_.grow(S);
    hostLogits_.grow(in.returnLogits ? S * V : V);
    check(cudaMemcpyAsync(hostGreedy_.get(), greedy_.get(), S * sizeof(cuda::Greedy), cudaMemcpyDeviceToHost, stream_), "copy back");
    std::vector<int> hostRows;  // rows sampled on the CPU
    for (int i = 0; i < S; i++)
      if (!out.rowErrors[i] && (in.returnLogits || !greedyOnGpu(in, i))) hostRows.push_back(i);
    if (in.returnLogits) {
      check(cudaMemcpyAsync(hostLogits_.get(), logits_.get(), S * V * 4, cudaMemcpyDeviceToHost, stream_), "copy back");
    } else if (!hostRows.empty()) {
      hostLogits_.grow(hostRows.size() * V);
      for (size_t j = 0; j < hostRows.size(); j++)
        check(cudaMemcpyAsync(hostLogits_.get() + j * V, logits_.get() + hostRows[j] * V, V * 4, cudaMemcpyDeviceToHost, stream_),
              "copy back");
    }
    check(cudaStreamSynchronize(stream_), "step");
    for (int i = 0; i < S; i++)
      if (!out.rowErrors[i] && !in.returnLogits && greedyOnGpu(in, i)) takeGreedy(hostGreedy_.get()[i], out, i);
    const bool masksMade = awaitMasks(in);
    const auto start = std::chrono::steady_clock::now();
    const float* logits = hostLogits_.get();
    const int n = static_cast<int>(hostRows.size());
#pragma omp parallel for schedule(dynamic, 1) if (n > 1)
    for (int j = 0; j < n; j++) {
      static thread_local std::vector<float> scratch;
      const int i = hostRows[j];
      sampleRow(k_, in, i, logits + (in.returnLogits ? static_cast<size_t>(i) : static_cast<size_t>(j)) * V, cfg_.vocab, out, scratch, masksMade);
    }
    if (in.returnLogits) out.logits.assign(logits, logits + S * V);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  // A multi-step decode's outputs from its steps' argmax rows (k · T, step after step): a row whose
  // logits were not finite, or whose parameters are invalid, fails in that step and every later one.
  static StepOutput stepsOutput(const StepInput& in, const cuda::Greedy* sampled) {
    const int T = static_cast<int>(in.tokens.size()), k = in.decodeSteps;
    const StepOutput first = beginSampling(in);
    StepOutput out;
    out.tokens.assign(static_cast<size_t>(k) * T, -1);
    out.logprobs.assign(static_cast<size_t>(k) * T, 0.0f);
    out.rowErrors.assign(static_cast<size_t>(k) * T, nullptr);
    for (int i = 0; i < T; i++) {
      const char* error = first.rowErrors[i];
      for (int j = 0; j < k; j++) {
        const size_t at = static_cast<size_t>(j) * T + i;
        if (error) {
          out.rowErrors[at] = error;
        } else {
          takeGreedy(sampled[at], out, at);
          error = out.rowErrors[at];
        }
      }
    }
    return out;
  }

  // Row `at` of `out` from its GPU argmax: the token and its log-prob, or the non-finite logits' error.
  static void takeGreedy(const cuda::Greedy& g, StepOutput& out, size_t at) {
    if (g.finite) {
      out.tokens[at] = g.token;
      out.logprobs[at] = g.logprob;
    } else {
      out.tokens[at] = -1;
      out.rowErrors[at] = kNonFiniteLogits;
    }
  }

  // A call's time and tokens in the profile: GPU work is asynchronous, so without WEFT_CUDA_PROFILE=1
  // the forward passes and the transfers are timed as a whole, under `other`; `sampling` is the CPU
  // sampler's share (rows not sampled on the GPU).
  void account(const StepInput& in, int steps, double sampling) {
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    profile_.sampling += sampling;
    profile_.other += total - sampling - collectSpans();
    profile_.steps += steps;
    profile_.tokens += static_cast<long>(in.tokens.size()) * steps;
  }

  void release() {
    dropGraphs();
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
    events_.clear();
    if (kCache_) cudaFree(kCache_);
    if (vCache_) cudaFree(vCache_);
    kCache_ = vCache_ = nullptr;
    if (blas_) cublasDestroy(blas_);
    blas_ = nullptr;
    if (stream_) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  static constexpr size_t kWorkspaceBytes = 32u << 20;
  static constexpr size_t kMaxGraphs = 256;
  std::mutex mutex_;
  Profile profile_;
  bool launched_ = false;  // the step in flight was started by launch()
  std::chrono::steady_clock::time_point started_;  // when the step in flight began
  DeviceArray<char> workspace_;
  bool graphs_ = true;  // WEFT_CUDA_GRAPHS=0 turns decode graphs off
  bool profiling_ = false;  // WEFT_CUDA_PROFILE=1 times kernels with events
  std::vector<cudaEvent_t> events_;
  std::vector<double Profile::*> spans_;
  std::map<std::pair<int, int>, cudaGraphExec_t> graphExecs_;
  ModelConfig cfg_;
  const Kernels& k_;  // the CPU sampler's kernels
  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<Layer> layers_;
  DeviceArray<bf16> embed_, lmHead_;
  bool tied_ = false;
  DeviceArray<float> finalNorm_, invFreq_;
  // K and V pools, each (layers, numBlocks · blockSize slots, kvHeads, hd) of cfg_.kvDtype.
  size_t kvLayerBytes_ = 0;
  void *kCache_ = nullptr, *vCache_ = nullptr;
  // Per-step buffers, grown to the largest step seen.
  PinnedArray<int32_t> hostInts_;
  PinnedArray<float> hostLogits_;
  PinnedArray<cuda::Greedy> hostGreedy_;
  DeviceArray<int32_t> ints_;
  const int32_t *tokens_ = nullptr, *positions_ = nullptr, *slots_ = nullptr, *seqOf_ = nullptr, *tables_ = nullptr,
                *sampleRows_ = nullptr;
  DeviceArray<float> x_, qkv_, gu_, logits_;
  DeviceArray<float2> rope_;  // (T, hd / 2) cos and sin
  DeviceArray<float> partial_;  // attention's per-chunk partials, for rows longer than kAttnChunk keys
  DeviceArray<bf16> xn_, rows_;
  DeviceArray<cuda::Greedy> greedy_;
  DeviceArray<cuda::GreedyPart> greedyParts_;
};

}  // namespace

bool cudaBuilt() { return true; }

std::vector<CudaDevice> cudaDevices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no GPU: a CPU machine
    return {};
  }
  std::vector<CudaDevice> out;
  for (int i = 0; i < n; i++) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    size_t freeBytes = 0, total = 0;
    if (cudaSetDevice(i) == cudaSuccess) cudaMemGetInfo(&freeBytes, &total);
    out.push_back({p.name, static_cast<double>(p.totalGlobalMem), static_cast<double>(freeBytes), p.major, p.minor});
  }
  if (n > 0) cudaSetDevice(0);
  return out;
}

std::unique_ptr<Backend> loadCudaModel(ModelConfig cfg, Weights w) {
  if (!cfg.bf16) throw std::invalid_argument("the CUDA backend computes in bfloat16 only (--dtype bfloat16 or auto)");
  if (cudaDevices().empty()) throw std::runtime_error("no CUDA GPU is visible to this process");
  return std::make_unique<CudaModel>(std::move(cfg), std::move(w));
}

}  // namespace weft
