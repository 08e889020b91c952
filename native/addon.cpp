// The addon's JavaScript surface (typed in src/runtime/native.ts): loadModel()
// builds a Model and its step() runs one batched forward pass, both on the
// compute thread (compute_thread.h) while a libuv worker waits for them;
// dispose() frees its memory.
#include <napi.h>
#include <omp.h>
#include <memory>
#include <stdexcept>
#include "mlx_quant.h"
#include "compute_thread.h"
#include "cuda_backend.h"
#include "model.h"
#include "quant.h"
#include "quantize.h"
#include "roofline.h"

namespace weft {
namespace {

std::vector<int32_t> int32s(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw std::invalid_argument(std::string("step input '") + key + "' must be an Int32Array");
  auto a = v.As<Napi::Int32Array>();
  return std::vector<int32_t>(a.Data(), a.Data() + a.ElementLength());
}

template <typename T, napi_typedarray_type Kind>
std::vector<T> typed(const Napi::Object& o, const char* key, size_t n, const char* kind) {
  Napi::Value v = o.Get(key);
  if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != Kind)
    throw std::invalid_argument(std::string("step input '") + key + "' must be a " + kind);
  auto a = v.As<Napi::TypedArrayOf<T>>();
  if (a.ElementLength() != n) throw std::invalid_argument(std::string("step input '") + key + "' has the wrong length");
  return std::vector<T>(a.Data(), a.Data() + n);
}

int intField(const Napi::Object& o, const char* key) {
  Napi::Value v = o.Get(key);
  if (!v.IsNumber()) throw std::invalid_argument(std::string("'") + key + "' must be a number");
  return v.As<Napi::Number>().Int32Value();
}

// Where a tensor's bytes lie: checked to be `bytes` long and inside its file, which is mapped.
const unsigned char* mapBytes(const Napi::Object& t, const std::string& key, size_t bytes, MappedFiles& files) {
  std::string file = t.Get("file").As<Napi::String>();
  double offset = t.Get("offset").As<Napi::Number>().DoubleValue();
  double length = t.Get("byteLength").As<Napi::Number>().DoubleValue();
  size_t size = 0;
  const unsigned char* base = files.map(file, &size);
  if (static_cast<double>(bytes) != length || offset + length > static_cast<double>(size))
    throw std::invalid_argument("tensor " + key + " does not fit its file " + file);
  return base + static_cast<size_t>(offset);
}

// An MLX matrix: its words (`t` itself) and t.mlx = { groupSize, scales, biases }.
void parseMlx(const Napi::Object& t, const std::string& key, MappedFiles& files, Tensor& out) {
  Napi::Value m = t.Get("mlx");
  if (!m.IsObject()) throw std::invalid_argument("tensor " + key + " is MLX-quantized but has no scales and biases");
  Napi::Object mlx = m.As<Napi::Object>();
  out.group = intField(mlx, "groupSize");
  if (!mlxGroupSupported(out.group) || out.cols % out.group != 0)
    throw std::invalid_argument("tensor " + key + ": MLX group size " + std::to_string(out.group) + " unsupported or not dividing " + std::to_string(out.cols));
  out.data = mapBytes(t, key, mlxWordBytes(out.dtype, out.rows, out.cols), files);
  Napi::Object scales = mlx.Get("scales").As<Napi::Object>(), biases = mlx.Get("biases").As<Napi::Object>();
  out.paramDtype = dtypeFromName(scales.Get("dtype").As<Napi::String>());
  if (out.paramDtype != DType::BF16 && out.paramDtype != DType::F16 && out.paramDtype != DType::F32)
    throw std::invalid_argument("tensor " + key + ": MLX scales must be bf16, f16 or f32");
  if (dtypeFromName(biases.Get("dtype").As<Napi::String>()) != out.paramDtype)
    throw std::invalid_argument("tensor " + key + ": MLX scales and biases differ in dtype");
  const size_t params = mlxParamBytes(out.paramDtype, out.rows, out.cols, out.group);
  out.scales = mapBytes(scales, key + ".scales", params, files);
  out.biases = mapBytes(biases, key + ".biases", params, files);
}

Tensor parseTensor(const Napi::Object& spec, const char* key, MappedFiles& files, bool optional = false) {
  Napi::Value v = spec.Get(key);
  if (v.IsUndefined() || v.IsNull()) {
    if (optional) return Tensor{};
    throw std::invalid_argument(std::string("missing tensor ") + key);
  }
  Napi::Object t = v.As<Napi::Object>();
  Napi::Array shape = t.Get("shape").As<Napi::Array>();
  Tensor out;
  const std::string dtype = t.Get("dtype").As<Napi::String>();
  out.dtype = dtype == "mlx4" ? DType::MLX4 : dtype == "mlx8" ? DType::MLX8 : dtypeFromName(dtype);
  out.rows = shape.Length() == 2 ? shape.Get(0u).As<Napi::Number>().Int32Value() : 1;
  out.cols = shape.Get(shape.Length() - 1).As<Napi::Number>().Int32Value();
  if (isMlx(out.dtype)) {
    parseMlx(t, key, files, out);
    return out;
  }
  if (out.cols % blockElems(out.dtype) != 0)
    throw std::invalid_argument(std::string("tensor ") + key + " does not fit its file " + t.Get("file").As<Napi::String>().Utf8Value());
  out.data = mapBytes(t, key, tensorBytes(out.dtype, out.rows, out.cols), files);
  return out;
}

Weights parseWeights(const Napi::Object& w) {
  Weights out;
  out.files = std::make_shared<MappedFiles>();
  MappedFiles& f = *out.files;
  out.embed = parseTensor(w, "embed", f);
  out.finalNorm = parseTensor(w, "finalNorm", f);
  out.lmHead = parseTensor(w, "lmHead", f);
  Napi::Array layers = w.Get("layers").As<Napi::Array>();
  for (uint32_t i = 0; i < layers.Length(); i++) {
    Napi::Object l = layers.Get(i).As<Napi::Object>();
    LayerWeights L;
    L.attnNorm = parseTensor(l, "attnNorm", f);
    L.wq = parseTensor(l, "wq", f);
    L.wk = parseTensor(l, "wk", f);
    L.wv = parseTensor(l, "wv", f);
    L.wo = parseTensor(l, "wo", f);
    L.bq = parseTensor(l, "bq", f, true);
    L.bk = parseTensor(l, "bk", f, true);
    L.bv = parseTensor(l, "bv", f, true);
    L.qNorm = parseTensor(l, "qNorm", f, true);
    L.kNorm = parseTensor(l, "kNorm", f, true);
    L.mlpNorm = parseTensor(l, "mlpNorm", f);
    L.gate = parseTensor(l, "gate", f);
    L.up = parseTensor(l, "up", f);
    L.down = parseTensor(l, "down", f);
    out.layers.push_back(L);
  }
  return out;
}

ModelConfig parseConfig(const Napi::Object& o) {
  ModelConfig c;
  c.hidden = intField(o, "hidden");
  c.intermediate = intField(o, "intermediate");
  c.layers = intField(o, "layers");
  c.heads = intField(o, "heads");
  c.kvHeads = intField(o, "kvHeads");
  c.headDim = intField(o, "headDim");
  c.vocab = intField(o, "vocab");
  c.numBlocks = intField(o, "numBlocks");
  c.blockSize = intField(o, "blockSize");
  c.rmsEps = o.Get("rmsEps").As<Napi::Number>().FloatValue();
  c.attentionScaling = o.Get("attentionScaling").As<Napi::Number>().FloatValue();
  c.invFreq = typed<float, napi_float32_array>(o, "invFreq", c.headDim / 2, "Float32Array");
  const Napi::Value dtype = o.Get("dtype");
  const std::string mode = dtype.IsString() ? dtype.As<Napi::String>().Utf8Value() : "";
  if (mode != "float32" && mode != "bfloat16") throw std::invalid_argument("dtype must be float32 or bfloat16");
  c.bf16 = mode == "bfloat16";
  const Napi::Value kv = o.Get("kvCacheDtype");
  const std::string kvMode = kv.IsString() ? kv.As<Napi::String>().Utf8Value() : "";
  if (kvMode != "float32" && kvMode != "bfloat16" && kvMode != "float16")
    throw std::invalid_argument("kvCacheDtype must be float32, bfloat16 or float16");
  c.kvDtype = kvMode == "float32" ? DType::F32 : kvMode == "bfloat16" ? DType::BF16 : DType::F16;
  if (c.hidden <= 0 || c.layers <= 0 || c.heads <= 0 || c.kvHeads <= 0 || c.heads % c.kvHeads != 0 ||
      c.headDim <= 0 || c.headDim % 2 != 0 || c.vocab <= 0 || c.numBlocks <= 0 || c.blockSize <= 0)
    throw std::invalid_argument("invalid model dimensions");
  return c;
}

StepInput parseStep(const Napi::Object& o) {
  StepInput in;
  in.tokens = int32s(o, "tokens");
  in.positions = int32s(o, "positions");
  in.seqStarts = int32s(o, "seqStarts");
  in.slotMapping = int32s(o, "slotMapping");
  in.blockTables = int32s(o, "blockTables");
  in.contextLens = int32s(o, "contextLens");
  in.maxBlocks = intField(o, "maxBlocks");
  in.sampleRows = int32s(o, "sampleRows");
  const size_t S = in.sampleRows.size();
  auto temperature = typed<float, napi_float32_array>(o, "temperature", S, "Float32Array");
  auto topP = typed<float, napi_float32_array>(o, "topP", S, "Float32Array");
  auto minP = typed<float, napi_float32_array>(o, "minP", S, "Float32Array");
  auto rep = typed<float, napi_float32_array>(o, "repetitionPenalty", S, "Float32Array");
  auto pres = typed<float, napi_float32_array>(o, "presencePenalty", S, "Float32Array");
  auto freq = typed<float, napi_float32_array>(o, "frequencyPenalty", S, "Float32Array");
  auto topK = typed<int32_t, napi_int32_array>(o, "topK", S, "Int32Array");
  auto nLp = typed<int32_t, napi_int32_array>(o, "numLogprobs", S, "Int32Array");
  auto counters = typed<int32_t, napi_int32_array>(o, "counters", S, "Int32Array");
  auto seeds = typed<uint64_t, napi_biguint64_array>(o, "seeds", S, "BigUint64Array");
  auto biasOffsets = typed<int32_t, napi_int32_array>(o, "biasOffsets", S + 1, "Int32Array");
  auto biasIds = int32s(o, "biasIds");
  auto biasValues = typed<float, napi_float32_array>(o, "biasValues", biasIds.size(), "Float32Array");
  if (biasOffsets[0] != 0 || biasOffsets[S] != static_cast<int32_t>(biasIds.size()))
    throw std::invalid_argument("step input 'biasOffsets' does not cover 'biasIds'");
  // Grammar masks: read in place by the step (see StepInput; the worker keeps the arrays alive).
  in.maskOffsets = typed<int32_t, napi_int32_array>(o, "maskOffsets", S, "Int32Array");
  in.maskWords = intField(o, "maskWords");
  Napi::Value masks = o.Get("masks");
  if (!masks.IsTypedArray() || masks.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
    throw std::invalid_argument("step input 'masks' must be an Int32Array");
  in.masks = reinterpret_cast<const uint32_t*>(masks.As<Napi::Int32Array>().Data());
  in.masksLength = masks.As<Napi::Int32Array>().ElementLength();
  for (size_t i = 0; i < S; i++) {
    SamplingParams p;
    p.temperature = temperature[i];
    p.topP = topP[i];
    p.minP = minP[i];
    p.repetitionPenalty = rep[i];
    p.presencePenalty = pres[i];
    p.frequencyPenalty = freq[i];
    p.topK = topK[i];
    p.numLogprobs = nLp[i] < 0 ? 0 : nLp[i];
    p.counter = static_cast<uint32_t>(counters[i]);
    p.seed = seeds[i];
    if (biasOffsets[i] > biasOffsets[i + 1]) throw std::invalid_argument("step input 'biasOffsets' must not decrease");
    for (int32_t j = biasOffsets[i]; j < biasOffsets[i + 1]; j++) p.bias.emplace_back(biasIds[j], biasValues[j]);
    in.params.push_back(p);  // values are checked per row by the step (samplingError): a bad row fails alone
  }
  in.promptOffsets = int32s(o, "promptOffsets");
  in.promptTokens = int32s(o, "promptTokens");
  in.outputOffsets = int32s(o, "outputOffsets");
  in.outputTokens = int32s(o, "outputTokens");
  in.scoreRows = int32s(o, "scoreRows");
  in.scoreTargets = typed<int32_t, napi_int32_array>(o, "scoreTargets", in.scoreRows.size(), "Int32Array");
  in.scoreTopN = typed<int32_t, napi_int32_array>(o, "scoreTopN", in.scoreRows.size(), "Int32Array");
  in.returnLogits = o.Get("returnLogits").ToBoolean();
  if (o.Has("decodeSteps") && !o.Get("decodeSteps").IsUndefined()) in.decodeSteps = intField(o, "decodeSteps");
  return in;
}

template <typename T, typename Arr>
Arr copyOut(Napi::Env env, const std::vector<T>& v) {
  Arr a = Arr::New(env, v.size());
  std::copy(v.begin(), v.end(), a.Data());
  return a;
}

// A JS Model's native side, shared with the work queued on it. Its fields are
// touched on the main thread only; worker threads use the Model, which stays
// alive until the work that uses it has finished.
struct ModelState {
  enum class Life { Live, Disposing, Disposed };
  std::unique_ptr<Backend> model;  // null once disposed
  Life life = Life::Live;
  bool stepping = false;         // one step in flight per model
  // Opened by provideMasks() for a step started with masksPending; shared with the worker thread.
  std::shared_ptr<MaskGate> maskGate = std::make_shared<MaskGate>();
  std::vector<Napi::Promise::Deferred> disposeWaiters;
};

Napi::Promise rejected(Napi::Env env, const std::string& msg) {
  auto d = Napi::Promise::Deferred::New(env);
  d.Reject(Napi::Error::New(env, msg).Value());
  return d.Promise();
}

// Unmaps a model's weights and KV pools on a worker thread (gigabytes of pages), then resolves dispose().
class FreeWorker : public Napi::AsyncWorker {
 public:
  FreeWorker(Napi::Env env, std::shared_ptr<ModelState> state)
      : Napi::AsyncWorker(env), state_(std::move(state)), model_(std::move(state_->model)) {}
  void Execute() override { model_.reset(); }
  void OnOK() override {
    state_->life = ModelState::Life::Disposed;
    for (auto& d : state_->disposeWaiters) d.Resolve(Env().Undefined());
    state_->disposeWaiters.clear();
  }

 private:
  std::shared_ptr<ModelState> state_;
  std::unique_ptr<Backend> model_;
};

class StepWorker : public Napi::AsyncWorker {
 public:
  // `input`: its masks array, which the step reads in place, is kept alive until the step ends.
  StepWorker(Napi::Env env, std::shared_ptr<ModelState> state, StepInput in, const Napi::Object& input)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), state_(std::move(state)),
        model_(state_->model.get()), in_(std::move(in)) {
    state_->stepping = true;
    Napi::Value masks = input.Get("masks");
    if (masks.IsObject()) held_.push_back(Napi::Persistent(masks.As<Napi::Object>()));
  }
  Napi::Promise promise() { return deferred_.Promise(); }

  void Execute() override {
    try {
      const auto run = [this] { out_ = runDecodeSteps(*model_, in_); };
      if (model_->needsComputeThread()) runOnComputeThread(run);
      else run();
    } catch (const std::exception& e) {
      SetError(e.what());
    } catch (...) {
      SetError("unknown native error");
    }
  }
  void OnOK() override {
    stepDone();
    Napi::Env env = Env();
    Napi::Object r = Napi::Object::New(env);
    r.Set("tokens", copyOut<int32_t, Napi::Int32Array>(env, out_.tokens));
    r.Set("logprobs", copyOut<float, Napi::Float32Array>(env, out_.logprobs));
    r.Set("topN", out_.topN);
    r.Set("topIds", copyOut<int32_t, Napi::Int32Array>(env, out_.topIds));
    r.Set("topLogprobs", copyOut<float, Napi::Float32Array>(env, out_.topLogprobs));
    Napi::Array errors = Napi::Array::New(env, out_.rowErrors.size());
    for (uint32_t i = 0; i < out_.rowErrors.size(); i++)
      errors.Set(i, out_.rowErrors[i] ? Napi::Value(Napi::String::New(env, out_.rowErrors[i])) : env.Null());
    r.Set("rowErrors", errors);
    r.Set("scoreLogprobs", copyOut<float, Napi::Float32Array>(env, out_.scoreLogprobs));
    r.Set("scoreRanks", copyOut<int32_t, Napi::Int32Array>(env, out_.scoreRanks));
    r.Set("scoreTopN", out_.scoreTopN);
    r.Set("scoreTopIds", copyOut<int32_t, Napi::Int32Array>(env, out_.scoreTopIds));
    r.Set("scoreTopLogprobs", copyOut<float, Napi::Float32Array>(env, out_.scoreTopLogprobs));
    if (in_.returnLogits) r.Set("logits", copyOut<float, Napi::Float32Array>(env, out_.logits));
    deferred_.Resolve(r);
  }
  void OnError(const Napi::Error& e) override {
    stepDone();
    deferred_.Reject(e.Value());
  }

 private:
  // A dispose() that came during the step frees the model now.
  void stepDone() {
    state_->stepping = false;
    if (state_->life == ModelState::Life::Disposing) (new FreeWorker(Env(), state_))->Queue();
  }

  Napi::Promise::Deferred deferred_;
  std::shared_ptr<ModelState> state_;
  Backend* model_;
  StepInput in_;
  StepOutput out_;
  std::vector<Napi::ObjectReference> held_;
};

// Reads and repacks every matrix (from the files mapped while parsing) and
// reserves the KV pools on a worker thread; resolves with a JS Model.
class LoadWorker : public Napi::AsyncWorker {
 public:
  LoadWorker(Napi::Env env, ModelConfig cfg, Weights w, bool cuda)
      : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)), cfg_(std::move(cfg)), w_(std::move(w)), cuda_(cuda) {}
  Napi::Promise promise() { return deferred_.Promise(); }

  void Execute() override {
    try {
      runOnComputeThread([this] {
        if (cuda_) model_ = loadCudaModel(std::move(cfg_), std::move(w_));
        else model_ = std::make_unique<Model>(std::move(cfg_), std::move(w_));
      });
    } catch (const std::exception& e) {
      SetError(e.what());
    } catch (...) {
      SetError("unknown native error");
    }
  }
  void OnOK() override {
    Napi::Env env = Env();
    try {
      Napi::FunctionReference& ctor = *env.GetInstanceData<Napi::FunctionReference>();
      deferred_.Resolve(ctor.New({Napi::External<std::unique_ptr<Backend>>::New(env, &model_)}));
    } catch (const Napi::Error& e) {
      deferred_.Reject(e.Value());
    }
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  ModelConfig cfg_;
  Weights w_;
  bool cuda_;
  std::unique_ptr<Backend> model_;
};

class ModelWrap : public Napi::ObjectWrap<ModelWrap> {
 public:
  static Napi::Function define(Napi::Env env) {
    return DefineClass(env, "Model", {InstanceMethod("step", &ModelWrap::step), InstanceMethod("info", &ModelWrap::info),
                                      InstanceMethod("takeProfile", &ModelWrap::takeProfile),
                                      InstanceMethod("provideMasks", &ModelWrap::provideMasks),
                                      InstanceMethod("dispose", &ModelWrap::dispose)});
  }
  // Only LoadWorker constructs one, handing over the loaded Model.
  explicit ModelWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ModelWrap>(info) {
    if (info.Length() < 1 || !info[0].IsExternal()) throw Napi::TypeError::New(info.Env(), "models are created by loadModel(spec)");
    state_->model = std::move(*info[0].As<Napi::External<std::unique_ptr<Backend>>>().Data());
  }

 private:
  // Returns a Promise; a second call while a step runs is rejected: one step in flight per model.
  Napi::Value step(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    if (state_->life != ModelState::Life::Live) return rejected(env, "model disposed");
    if (!info[0].IsObject()) return rejected(env, "step(input) needs an input object");
    StepInput in;
    try {
      in = parseStep(info[0].As<Napi::Object>());
      if (state_->stepping) return rejected(env, "a step is already running on this model");
      state_->model->launch(in);
    } catch (const std::exception& e) {
      return rejected(env, e.what());
    }
    if (info[0].As<Napi::Object>().Get("masksPending").ToBoolean()) {
      state_->maskGate->reset();
      in.maskGate = state_->maskGate.get();
    }
    auto* worker = new StepWorker(env, state_, std::move(in), info[0].As<Napi::Object>());
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
  }

  // Hands the masks of the step in flight (started with masksPending) to its sampling.
  Napi::Value provideMasks(const Napi::CallbackInfo& info) {
    state_->maskGate->open(info[0].ToBoolean());
    return info.Env().Undefined();
  }

  // Frees the model at once, or when the step in flight ends; later calls resolve as the first does.
  Napi::Value dispose(const Napi::CallbackInfo& info) {
    Napi::Env env = info.Env();
    auto d = Napi::Promise::Deferred::New(env);
    if (state_->life == ModelState::Life::Disposed) {
      d.Resolve(env.Undefined());
      return d.Promise();
    }
    state_->disposeWaiters.push_back(d);
    if (state_->life == ModelState::Life::Live) {
      state_->life = ModelState::Life::Disposing;
      if (!state_->stepping) (new FreeWorker(env, state_))->Queue();
    }
    return d.Promise();
  }

  Backend& live(const Napi::CallbackInfo& info) {
    if (state_->life != ModelState::Life::Live) throw Napi::Error::New(info.Env(), "model disposed");
    return *state_->model;
  }

  Napi::Value info(const Napi::CallbackInfo& info) {
    Backend& m = live(info);
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("isa", activeKernels().name);
    r.Set("device", m.device());
    r.Set("deviceName", m.deviceName());
    r.Set("threads", omp_get_max_threads());
    r.Set("kvCacheBytes", static_cast<double>(m.kvCacheBytes()));
    r.Set("weightBytes", static_cast<double>(m.weightBytes()));
    r.Set("dtype", m.config().bf16 ? "bfloat16" : "float32");
    const DType kv = m.config().kvDtype;
    r.Set("kvCacheDtype", kv == DType::F32 ? "float32" : kv == DType::BF16 ? "bfloat16" : "float16");
    return r;
  }

  // Seconds per kind of work since the last call (a step in flight finishes first).
  Napi::Value takeProfile(const Napi::CallbackInfo& info) {
    Profile p = live(info).takeProfile();
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("matmul", p.matmul);
    r.Set("attention", p.attention);
    r.Set("lmHead", p.lmHead);
    r.Set("sampling", p.sampling);
    r.Set("other", p.other);
    r.Set("steps", static_cast<double>(p.steps));
    r.Set("tokens", static_cast<double>(p.tokens));
    return r;
  }

  std::shared_ptr<ModelState> state_ = std::make_shared<ModelState>();
};

// Measures the machine's limits on a worker thread (a few seconds); resolves with them.
class RooflineWorker : public Napi::AsyncWorker {
 public:
  explicit RooflineWorker(Napi::Env env) : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise promise() { return deferred_.Promise(); }
  void Execute() override {
    try {
      runOnComputeThread([this] { r_ = measureRooflines(); });
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  void OnOK() override {
    Napi::Object o = Napi::Object::New(Env());
    o.Set("readBytesPerSecond", r_.readBytesPerSecond);
    o.Set("fp32Flops", r_.fp32Flops);
    o.Set("bf16DotFlops", r_.bf16DotFlops);
    o.Set("amxFlops", r_.amxFlops);
    deferred_.Resolve(o);
  }
  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  Rooflines r_;
};

// Parses the spec and maps the files on the main thread (mmap reads no page);
// the reading and repacking run on a worker thread.
Napi::Value loadModel(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsObject()) return rejected(env, "loadModel(spec) needs a spec object");
  Napi::Object spec = info[0].As<Napi::Object>();
  ModelConfig cfg;
  Weights w;
  bool cuda = false;
  try {
    const Napi::Value device = spec.Get("device");
    const std::string name = device.IsString() ? device.As<Napi::String>().Utf8Value() : "cpu";
    if (name != "cpu" && name != "cuda") throw std::invalid_argument("device must be cpu or cuda");
    cuda = name == "cuda";
    cfg = parseConfig(spec);
    w = parseWeights(spec.Get("weights").As<Napi::Object>());
    if (static_cast<int>(w.layers.size()) != cfg.layers) throw std::invalid_argument("layer count mismatch");
  } catch (const std::exception& e) {
    return rejected(env, e.what());
  }
  auto* worker = new LoadWorker(env, std::move(cfg), std::move(w), cuda);
  Napi::Promise p = worker->promise();
  worker->Queue();
  return p;
}

// quantizeWeights(type, values, cols): the rows of `values` (cols each) as ggml blocks of
// `type` ("q8_0", "q4_0", "q4_k", "q5_k", "q6_k"). Synchronous: it is for the CLI's quantizer
// (run on the compute thread, which the caller waits for, as every OpenMP user does).
Napi::Value quantizeWeightsJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  try {
    if (!info[0].IsString() || !info[1].IsTypedArray() || info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float32_array || !info[2].IsNumber())
      throw std::invalid_argument("quantizeWeights(type, Float32Array, cols)");
    const DType d = dtypeFromName(info[0].As<Napi::String>());
    if (!canQuantize(d)) throw std::invalid_argument("quantizeWeights: cannot write " + info[0].As<Napi::String>().Utf8Value());
    auto x = info[1].As<Napi::Float32Array>();
    const int64_t cols = info[2].As<Napi::Number>().Int64Value();
    if (cols <= 0 || x.ElementLength() % static_cast<size_t>(cols) != 0) throw std::invalid_argument("quantizeWeights: the values are not whole rows");
    const int64_t rows = static_cast<int64_t>(x.ElementLength()) / cols;
    if (cols % blockElems(d) != 0)
      throw std::invalid_argument("row length " + std::to_string(cols) + " is not a multiple of the block size " + std::to_string(blockElems(d)));
    auto out = Napi::Uint8Array::New(env, tensorBytes(d, static_cast<size_t>(rows), static_cast<size_t>(cols)));
    runOnComputeThread([&] { quantizeWeights(d, x.Data(), rows, cols, out.Data()); });
    return out;
  } catch (const std::exception& e) {
    throw Napi::Error::New(env, e.what());
  }
}

Napi::Object init(Napi::Env env, Napi::Object exports) {
  env.SetInstanceData(new Napi::FunctionReference(Napi::Persistent(ModelWrap::define(env))));
  exports.Set("loadModel", Napi::Function::New(env, loadModel));
  exports.Set("quantizeWeights", Napi::Function::New(env, quantizeWeightsJs));
  exports.Set("isa", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    try {
      return Napi::String::New(info.Env(), activeKernels().name);
    } catch (const std::exception& e) {
      throw Napi::Error::New(info.Env(), e.what());
    }
  }));
  exports.Set("bf16ByDefault", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    try {
      return Napi::Boolean::New(info.Env(), activeKernels().bf16ByDefault);
    } catch (const std::exception& e) {
      throw Napi::Error::New(info.Env(), e.what());
    }
  }));
  exports.Set("measureRooflines", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    auto* worker = new RooflineWorker(info.Env());
    Napi::Promise p = worker->promise();
    worker->Queue();
    return p;
  }));
  exports.Set("cudaBuilt", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    return Napi::Boolean::New(info.Env(), cudaBuilt());
  }));
  exports.Set("cudaDevices", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    const std::vector<CudaDevice> devices = cudaDevices();
    Napi::Array r = Napi::Array::New(info.Env(), devices.size());
    for (uint32_t i = 0; i < devices.size(); i++) {
      Napi::Object d = Napi::Object::New(info.Env());
      d.Set("name", devices[i].name);
      d.Set("totalBytes", devices[i].totalBytes);
      d.Set("freeBytes", devices[i].freeBytes);
      d.Set("computeCapability", std::to_string(devices[i].major) + "." + std::to_string(devices[i].minor));
      r.Set(i, d);
    }
    return r;
  }));
  exports.Set("cpuFeatures", Napi::Function::New(env, [](const Napi::CallbackInfo& info) -> Napi::Value {
    const CpuFeatures& f = cpuFeatures();
    Napi::Object r = Napi::Object::New(info.Env());
    r.Set("avx2", f.avx2);
    r.Set("avx512", f.avx512);
    r.Set("avx512vnni", f.avx512vnni);
    r.Set("avx512bf16", f.avx512bf16);
    r.Set("amx", f.amx);
    r.Set("bf16DotHalfRate", f.bf16DotHalfRate);
    return r;
  }));
  return exports;
}

}  // namespace
}  // namespace weft

static Napi::Object InitAddon(Napi::Env env, Napi::Object exports) { return weft::init(env, exports); }

NODE_API_MODULE(weft_native, InitAddon)
