import type { RunnerSampling } from "../runtime/model-runner.js";

/**
 * Per-request sampling settings, with OpenAI's / vLLM's defaults: what the
 * sampler reads (RunnerSampling: temperature … logprobs; a random seed when
 * absent makes sampling reproducible under any batch composition), and the
 * engine's own stop rules.
 */
export interface SamplingParams extends RunnerSampling {
  maxTokens: number;
  stop: string[];
  stopTokenIds: number[];
  ignoreEos: boolean;
  /** Keep the matched stop string, or the stop token's text, in the output (vLLM's include_stop_str_in_output). */
  includeStopStrInOutput: boolean;
  /** No stop token or EOS ends the request before this many output tokens (vLLM's min_tokens). */
  minTokens: number;
  /** Special tokens' text is left out of the output (vLLM's skip_special_tokens). */
  skipSpecialTokens: boolean;
  /**
   * Top-N log-probs for every prompt token (vLLM's prompt_logprobs; completions'
   * echo with logprobs), or null for none. Such a request computes its whole
   * prompt: it takes no prefix-cache hit, so every position has logits.
   */
  promptLogprobs: number | null;
}

export const MAX_SEED = Number.MAX_SAFE_INTEGER;

export function defaultSamplingParams(overrides: Partial<SamplingParams> = {}): SamplingParams {
  return {
    temperature: 1,
    topP: 1,
    topK: 0,
    minP: 0,
    repetitionPenalty: 1,
    presencePenalty: 0,
    frequencyPenalty: 0,
    seed: Math.floor(Math.random() * 2 ** 48),
    logprobs: 0,
    maxTokens: 16,
    stop: [],
    stopTokenIds: [],
    ignoreEos: false,
    includeStopStrInOutput: false,
    minTokens: 0,
    skipSpecialTokens: true,
    promptLogprobs: null,
    ...overrides,
  };
}
