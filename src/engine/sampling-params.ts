/** Per-request sampling settings, with OpenAI's / vLLM's defaults. */
export interface SamplingParams {
  /** 0 = greedy. */
  temperature: number;
  topP: number;
  /** 0 = off. */
  topK: number;
  minP: number;
  repetitionPenalty: number;
  presencePenalty: number;
  frequencyPenalty: number;
  /** Makes sampling reproducible under any batch composition; a random one is drawn when absent. */
  seed: number;
  /** Top-N log-probs to return per generated token (0 = none; the chosen token's log-prob is always computed). */
  logprobs: number;
  maxTokens: number;
  stop: string[];
  stopTokenIds: number[];
  ignoreEos: boolean;
  /** Keep the matched stop string, or the stop token's text, in the output (vLLM's include_stop_str_in_output). */
  includeStopStrInOutput: boolean;
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
    ...overrides,
  };
}
