#include "step.h"
#include <chrono>
#include <algorithm>
#include <stdexcept>
#include <string>

namespace weft {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("invalid step input: " + what);
}

// Multi-step decode (StepInput::decodeSteps): one sampled row a sequence, and block tables that
// hold every sub-step's position.
void validateDecodeSteps(const ModelConfig& cfg, const StepInput& in) {
  require(in.decodeSteps >= 1, "decodeSteps must be at least 1");
  if (in.decodeSteps == 1) return;
  const size_t T = in.tokens.size(), B = in.seqStarts.size() - 1;
  require(B == T && in.sampleRows.size() == T, "decode steps need one sampled row per sequence");
  for (size_t i = 0; i < T; i++) {
    require(in.sampleRows[i] == static_cast<int32_t>(i) && in.maskOffsets[i] == -1, "decode steps sample every row in order, without masks");
    require(in.contextLens[i] == in.positions[i] + 1, "a decode row is its sequence's last token");
    // The blocks through the last sub-step's position; validateStep checked those of this one.
    const int blocks = (in.positions[i] + in.decodeSteps + cfg.blockSize - 1) / cfg.blockSize;
    require(blocks <= in.maxBlocks, "the block table does not hold every decode step");
    for (int b = (in.contextLens[i] + cfg.blockSize - 1) / cfg.blockSize; b < blocks; b++) {
      const int32_t id = in.blockTables[i * in.maxBlocks + b];
      require(id >= 0, "the block table does not hold every decode step");
      require(id < cfg.numBlocks, "block id out of range");
    }
  }
  require(in.scoreRows.empty() && !in.returnLogits, "decode steps return no logits or prompt scores");
}

// The next sub-step of a multi-step decode: each row's token is the one it sampled (0 after a failure),
// at the next position, with its seed's counter and its penalties' output tokens advanced.
void advanceDecodeStep(const ModelConfig& cfg, StepInput& in, const StepOutput& prev) {
  const size_t T = in.tokens.size();
  const int bs = cfg.blockSize;
  std::vector<int32_t> outputs;
  std::vector<int32_t> offsets{0};
  for (size_t i = 0; i < T; i++) {
    const int32_t token = prev.tokens[i] >= 0 ? prev.tokens[i] : 0;
    const int pos = ++in.positions[i];
    in.tokens[i] = token;
    in.contextLens[i] = pos + 1;
    in.slotMapping[i] = in.blockTables[i * in.maxBlocks + pos / bs] * bs + pos % bs;
    in.params[i].counter++;
    outputs.insert(outputs.end(), in.outputTokens.begin() + in.outputOffsets[i], in.outputTokens.begin() + in.outputOffsets[i + 1]);
    outputs.push_back(token);
    offsets.push_back(static_cast<int32_t>(outputs.size()));
  }
  in.outputTokens = std::move(outputs);
  in.outputOffsets = std::move(offsets);
}

template <class T>
void append(std::vector<T>& to, const std::vector<T>& from) {
  to.insert(to.end(), from.begin(), from.end());
}

}  // namespace

StepOutput runDecodeSteps(Backend& m, StepInput in) {
  const int steps = in.decodeSteps;
  if (steps == 1) return m.step(in);
  validateStep(m.config(), in);  // the whole run's checks, which its single steps do not repeat
  StepOutput out;
  if (m.decodeOnDevice(in, out)) return out;
  in.decodeSteps = 1;
  out = m.step(in);
  const StepOutput* prev = &out;
  std::vector<const char*> failed(out.rowErrors);
  std::vector<StepOutput> later;
  later.reserve(steps - 1);
  for (int j = 1; j < steps; j++) {
    advanceDecodeStep(m.config(), in, *prev);
    later.push_back(m.step(in));
    StepOutput& o = later.back();
    for (size_t i = 0; i < failed.size(); i++) {
      if (failed[i]) o.rowErrors[i] = failed[i], o.tokens[i] = -1;
      else failed[i] = o.rowErrors[i];
    }
    prev = &o;
  }
  for (const StepOutput& o : later) {
    append(out.tokens, o.tokens);
    append(out.rowErrors, o.rowErrors);
    append(out.logprobs, o.logprobs);
    append(out.topIds, o.topIds);
    append(out.topLogprobs, o.topLogprobs);
  }
  return out;
}

void validateStep(const ModelConfig& cfg, const StepInput& in) {
  const size_t T = in.tokens.size();
  require(T > 0, "empty batch");
  require(in.positions.size() == T && in.slotMapping.size() == T, "positions/slotMapping length != tokens");
  require(in.seqStarts.size() >= 2 && in.seqStarts.front() == 0 &&
              static_cast<size_t>(in.seqStarts.back()) == T, "seqStarts must run from 0 to the token count");
  const size_t B = in.seqStarts.size() - 1;
  require(in.contextLens.size() == B, "contextLens length != sequences");
  require(in.maxBlocks > 0 && in.blockTables.size() == B * in.maxBlocks, "blockTables size != sequences * maxBlocks");
  const int bs = cfg.blockSize;
  for (size_t s = 0; s < B; s++) {
    require(in.seqStarts[s] < in.seqStarts[s + 1], "every sequence needs at least one token");
    const int ctx = in.contextLens[s];
    require(ctx > 0 && (ctx + bs - 1) / bs <= in.maxBlocks, "context length exceeds its block table");
    const int32_t* table = &in.blockTables[s * in.maxBlocks];
    for (int b = 0; b < (ctx + bs - 1) / bs; b++)
      require(table[b] >= 0 && table[b] < cfg.numBlocks, "block id out of range");
    for (int t = in.seqStarts[s]; t < in.seqStarts[s + 1]; t++) {
      const int pos = in.positions[t];
      require(pos >= 0 && pos < ctx, "position outside its context");
      require(in.tokens[t] >= 0 && in.tokens[t] < cfg.vocab, "token id out of vocabulary");
      require(in.slotMapping[t] == table[pos / bs] * bs + pos % bs, "slot does not match the block table");
    }
  }
  const size_t S = in.sampleRows.size();
  require(in.params.size() == S, "sampling params length != sample rows");
  require(in.promptOffsets.size() == S + 1 && in.outputOffsets.size() == S + 1, "penalty offsets length != rows + 1");
  for (size_t i = 0; i < S; i++) require(in.sampleRows[i] >= 0 && static_cast<size_t>(in.sampleRows[i]) < T, "sample row out of range");
  require(in.maskOffsets.size() == S, "maskOffsets length != sample rows");
  for (size_t i = 0; i < S; i++) {
    if (in.maskOffsets[i] == -1) continue;
    require(in.maskWords == (cfg.vocab + 31) / 32, "a token mask does not cover the vocabulary");
    require(in.maskOffsets[i] >= 0 && static_cast<size_t>(in.maskOffsets[i]) + in.maskWords <= in.masksLength, "maskOffsets points outside masks");
  }
  const size_t R = in.scoreRows.size();
  require(in.scoreTargets.size() == R && in.scoreTopN.size() == R, "scoreTargets/scoreTopN length != scoreRows");
  for (size_t i = 0; i < R; i++) {
    require(in.scoreRows[i] >= 0 && static_cast<size_t>(in.scoreRows[i]) < T, "score row out of range");
    require(in.scoreTargets[i] >= 0 && in.scoreTargets[i] < cfg.vocab, "score target out of vocabulary");
    require(in.scoreTopN[i] >= 0 && in.scoreTopN[i] <= 1000, "scoreTopN must be between 0 and 1000");
  }
  for (auto* list : {&in.promptTokens, &in.outputTokens})
    for (int32_t t : *list) require(t >= 0 && t < cfg.vocab, "penalty token out of vocabulary");
  for (auto* offs : {&in.promptOffsets, &in.outputOffsets})
    for (size_t i = 0; i < S; i++) require((*offs)[i] >= 0 && (*offs)[i] <= (*offs)[i + 1], "penalty offsets not monotonic");
  require(static_cast<size_t>(in.promptOffsets[S]) <= in.promptTokens.size() &&
              static_cast<size_t>(in.outputOffsets[S]) <= in.outputTokens.size(), "penalty offsets past their tokens");
  validateDecodeSteps(cfg, in);
}

StepOutput beginSampling(const StepInput& in) {
  const int S = static_cast<int>(in.sampleRows.size());
  StepOutput out;
  out.tokens.assign(S, -1);
  out.logprobs.assign(S, 0.0f);
  out.rowErrors.resize(S);
  for (int i = 0; i < S; i++) {
    out.rowErrors[i] = samplingError(in.params[i]);
    if (!out.rowErrors[i]) out.topN = std::max(out.topN, in.params[i].numLogprobs);
  }
  out.topIds.assign(static_cast<size_t>(S) * out.topN, -1);
  out.topLogprobs.assign(static_cast<size_t>(S) * out.topN, 0.0f);
  return out;
}

void MaskGate::reset() {
  std::lock_guard<std::mutex> lock(m_);
  state_ = 0;
}

void MaskGate::open(bool made) {
  {
    std::lock_guard<std::mutex> lock(m_);
    state_ = made ? 1 : 2;
  }
  cv_.notify_all();
}

bool MaskGate::wait(int patience) {
  std::unique_lock<std::mutex> lock(m_);
  cv_.wait_for(lock, std::chrono::seconds(patience), [this] { return state_ != 0; });
  return state_ == 1;
}

bool awaitMasks(const StepInput& in) { return !in.maskGate || in.maskGate->wait(60); }

void sampleRow(const Kernels& k, const StepInput& in, int i, const float* logits, int vocab, StepOutput& out,
               std::vector<float>& scratch, bool masksMade) {
  if (out.rowErrors[i]) return;
  const SamplingParams& p = in.params[i];
  const uint32_t* mask = in.maskOffsets[i] == -1 ? nullptr : in.masks + in.maskOffsets[i];
  if (mask && !masksMade) {
    out.rowErrors[i] = "the token mask could not be made";
    return;
  }
  Sampled s = sampleToken(k, logits, vocab, p, mask, in.promptTokens.data() + in.promptOffsets[i], in.promptOffsets[i + 1] - in.promptOffsets[i],
                          in.outputTokens.data() + in.outputOffsets[i], in.outputOffsets[i + 1] - in.outputOffsets[i],
                          p.numLogprobs, out.topIds.data() + static_cast<size_t>(i) * out.topN,
                          out.topLogprobs.data() + static_cast<size_t>(i) * out.topN, scratch);
  out.tokens[i] = s.token;
  out.logprobs[i] = s.logprob;
  out.rowErrors[i] = s.error;
}

}  // namespace weft
