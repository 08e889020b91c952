/** `weft generate`: one request through the engine, printed as text or as one JSON object. */
import { createModel, DEFAULT_ENGINE_CONFIG } from "../engine/engine-manager.js";
import { defaultSamplingParams } from "../engine/sampling-params.js";
import type { EngineConfig } from "../engine/engine-config.js";
import { resolveModelSource } from "../model/registry.js";

export interface GenerateOptions {
  dtype?: EngineConfig["dtype"];
  device?: EngineConfig["device"];
  model: string;
  prompt?: string;
  promptIds?: string;
  chat?: boolean;
  maxTokens: number;
  temperature: number;
  topP: number;
  topK: number;
  seed?: number;
  logprobs?: number;
  ignoreEos?: boolean;
  json?: boolean;
}

export async function generate(o: GenerateOptions): Promise<void> {
  if ((o.prompt === undefined) === (o.promptIds === undefined)) throw new Error("give exactly one of --prompt and --prompt-ids");
  const log = (msg: string): void => void process.stderr.write(`${msg}\n`);
  const m = await createModel("cli", await resolveModelSource(o.model, { log }), { ...DEFAULT_ENGINE_CONFIG, kvCacheMemory: 256 * 2 ** 20, maxNumSeqs: 1, dtype: o.dtype ?? DEFAULT_ENGINE_CONFIG.dtype,
    device: o.device ?? DEFAULT_ENGINE_CONFIG.device },
    { log });
  let promptIds: number[];
  if (o.promptIds !== undefined) {
    promptIds = o.promptIds.split(",").map((s) => Number(s.trim()));
    if (promptIds.some((n) => !Number.isInteger(n))) throw new Error("--prompt-ids must be comma-separated integers");
  } else {
    if (!m.tokenizer) throw new Error(`${o.model} has no tokenizer.json: use --prompt-ids`);
    promptIds = o.chat ? m.tokenizer.encodeChat([{ role: "user", content: o.prompt! }]) : m.tokenizer.encode(o.prompt!);
  }
  const params = defaultSamplingParams({
    maxTokens: o.maxTokens, temperature: o.temperature, topP: o.topP, topK: o.topK,
    logprobs: o.logprobs ?? 0, ignoreEos: o.ignoreEos ?? false, ...(o.seed !== undefined ? { seed: o.seed } : {}),
  });
  const stream = m.engine.add({ promptTokenIds: promptIds, params });
  const tokenIds: number[] = [];
  const logprobs: { token_id: number; logprob: number; top_logprobs: { token_id: number; logprob: number }[] }[] = [];
  let text = "", finish = "length";
  for await (const out of stream) {
    tokenIds.push(...out.tokenIds);
    text += out.text;
    for (const lp of out.logprobs) {
      logprobs.push({ token_id: lp.tokenId, logprob: lp.logprob, top_logprobs: lp.top.map((t) => ({ token_id: t.tokenId, logprob: t.logprob })) });
    }
    if (!o.json) process.stdout.write(out.text);
    if (out.finished) {
      if (out.finishReason === "error") throw new Error(out.error ?? "generation failed");
      finish = out.finishReason ?? "length";
    }
  }
  if (o.json) {
    const result: Record<string, unknown> = { prompt_token_ids: promptIds, token_ids: tokenIds, text, finish_reason: finish };
    if (o.logprobs !== undefined) result.logprobs = logprobs;
    process.stdout.write(`${JSON.stringify(result)}\n`);
  } else {
    process.stdout.write("\n");
  }
}
