/**
 * Stop handling is decided once, in the scheduler: the token that stopped a
 * request (EOS, or one of stop_token_ids, whatever ignore_eos says) never
 * shows its text, unless include_stop_str_in_output asks for it; vLLM's
 * stop_reason says which stop it was.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { Engine, type Runner } from "../src/engine/engine.js";
import { DEFAULT_ENGINE_CONFIG } from "../src/engine/engine-config.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { grammarCompiler } from "../src/engine/grammar.js";
import type { RunnerSequence, StepResult } from "../src/runtime/model-runner.js";
import { assertEngineIdle, completeFixtureModel } from "./helpers.js";

const tok = TextTokenizer.fromDir(completeFixtureModel("tiny-qwen3"));
const id = (text: string): number => {
  const ids = tok.encode(text, false);
  assert.equal(ids.length, 1, `"${text}" is one token`);
  return ids[0]!;
};
const [A, B, EOS, STOP, C] = [id("Hello"), id(" there"), id(" EOS"), id(" STOP"), id(" after")];

/** Emits A B, then the token under test, then C forever. */
class ScriptedRunner implements Runner {
  /** Rows sampled, over all steps. */
  sampled = 0;
  constructor(private readonly third: number) {}
  execute(seqs: readonly RunnerSequence[]): Promise<StepResult> {
    this.sampled += seqs.filter((s) => s.sample).length;
    const samples = seqs.map((s) => (s.sample ? { tokenId: [A, B, this.third][s.sample.counter] ?? C, logprob: -1, top: [] } : null));
    return Promise.resolve({ samples, errors: seqs.map(() => null) });
  }
}

async function run(third: number, over: { ignoreEos: boolean; stopTokenIds: number[]; include: boolean }): Promise<{ text: string; reason: string | undefined; stopReason: unknown; tokens: number[] }> {
  const engine = new Engine(new ScriptedRunner(third), { ...DEFAULT_ENGINE_CONFIG, blockSize: 4 },
    { numBlocks: 64, maxModelLen: 256, vocabSize: 151936, eosTokenIds: [EOS] }, tok);
  const params = defaultSamplingParams({ temperature: 0, maxTokens: 5, ignoreEos: over.ignoreEos, stopTokenIds: over.stopTokenIds, includeStopStrInOutput: over.include });
  const out = await engine.add({ promptTokenIds: [id("Hi")], params }).collect();
  return { text: out.text, reason: out.finishReason, stopReason: out.stopReason, tokens: out.tokenIds };
}

test("the stopping token's text is absent in every combination of ignore_eos, stop_token_ids and EOS; include_stop_str_in_output puts it back", async () => {
  let cases = 0;
  for (const third of [EOS, STOP]) {
    for (const ignoreEos of [false, true]) {
      for (const stopTokenIds of [[], [STOP], [EOS], [EOS, STOP]]) {
        for (const include of [false, true]) {
          const r = await run(third, { ignoreEos, stopTokenIds, include });
          const stops = stopTokenIds.includes(third) || (third === EOS && !ignoreEos);
          const what = `token ${third === EOS ? "EOS" : "STOP"}, ignore_eos ${ignoreEos}, stop_token_ids [${stopTokenIds.map((t) => (t === EOS ? "EOS" : "STOP"))}], include ${include}`;
          cases++;
          if (stops) {
            assert.equal(r.reason, "stop", what);
            assert.deepEqual(r.tokens, [A, B, third], `${what}: the stop token is still reported as generated`);
            assert.equal(r.text, include ? tok.decode([A, B, third]) : tok.decode([A, B]), what);
            const eosStop = third === EOS && !ignoreEos; // EOS is checked first, as in vLLM
            assert.equal(r.stopReason, eosStop ? null : third, `${what}: stop_reason`);
          } else {
            assert.equal(r.reason, "length", what);
            assert.equal(r.text, tok.decode([A, B, third, C, C]), `${what}: a token that does not stop is ordinary text`);
          }
        }
      }
    }
  }
  assert.equal(cases, 32);
});

test("stop strings: removed with what follows, kept with include_stop_str_in_output; stop_reason is the string", async () => {
  const engine = new Engine(new ScriptedRunner(STOP), { ...DEFAULT_ENGINE_CONFIG, blockSize: 4 },
    { numBlocks: 64, maxModelLen: 256, vocabSize: 151936, eosTokenIds: [] }, tok);
  const go = (include: boolean) => engine.add({ promptTokenIds: [id("Hi")], params: defaultSamplingParams({ temperature: 0, maxTokens: 5, stop: ["there"], includeStopStrInOutput: include }) }).collect();
  const plain = await go(false);
  assert.equal(plain.text, "Hello ");
  assert.equal(plain.stopReason, "there");
  assert.equal((await go(true)).text, "Hello there");
});

test("a stop string found while the next step computes: that step's row for the request is dropped, and its blocks are freed", async () => {
  const runner = new ScriptedRunner(STOP);
  const engine = new Engine(runner, { ...DEFAULT_ENGINE_CONFIG, blockSize: 4 }, { numBlocks: 64, maxModelLen: 256, vocabSize: 151936, eosTokenIds: [] }, tok);
  const out = await engine.add({ promptTokenIds: [id("Hi")], params: defaultSamplingParams({ temperature: 0, maxTokens: 5, stop: ["there"] }) }).collect();
  // " there" (the second token) completes the stop string once the third step is launched: three rows sampled, two tokens reported.
  assert.equal(runner.sampled, 3);
  assert.deepEqual(out.tokenIds, [A, B]);
  assert.equal(out.usage?.completionTokens, 2);
  assert.equal(out.finishReason, "stop");
  assertEngineIdle(engine);
});

test("min_tokens: a stop string before min_tokens is not a stop (as vLLM), after it is", async () => {
  const engine = new Engine(new ScriptedRunner(STOP), { ...DEFAULT_ENGINE_CONFIG, blockSize: 4 },
    { numBlocks: 64, maxModelLen: 256, vocabSize: 151936, eosTokenIds: [] }, tok);
  const go = (minTokens: number) => engine.add({ promptTokenIds: [id("Hi")], params: defaultSamplingParams({ temperature: 0, maxTokens: 5, stop: ["there"], minTokens }) }).collect();
  assert.equal((await go(0)).text, "Hello ");
  const late = await go(4);
  assert.equal(late.finishReason, "length", "the stop string came before min_tokens");
  assert.equal(late.text, tok.decode([A, B, STOP, C, C]));
});

/** Makes each row's deferred mask after the step starts, one after another, as ModelRunner does; a mask that fails fails the step. */
class MaskingRunner extends ScriptedRunner {
  override async execute(seqs: readonly RunnerSequence[]): Promise<StepResult> {
    const result = super.execute(seqs);
    for (const s of seqs) if (typeof s.sample?.mask === "function") await s.sample.mask();
    return result;
  }
}

test("a stop string ends two constrained requests while the next step makes their masks: the other request in that step is unharmed", async () => {
  const engine = new Engine(new MaskingRunner(STOP), { ...DEFAULT_ENGINE_CONFIG, blockSize: 4 },
    { numBlocks: 64, maxModelLen: 256, vocabSize: 151936, eosTokenIds: [] }, tok);
  const grammar = await grammarCompiler(tok, 151936, []).compile({ type: "ebnf", grammar: 'root ::= "Hello there" [ a-zA-Z]*' });
  const constrained = () => engine.add({ promptTokenIds: [id("Hi")], grammar, params: defaultSamplingParams({ temperature: 0, maxTokens: 5, stop: ["there"] }) }).collect();
  const [a, b, plain] = await Promise.all([constrained(), constrained(),
    engine.add({ promptTokenIds: [id("Hi")], params: defaultSamplingParams({ temperature: 0, maxTokens: 5 }) }).collect()]);
  for (const o of [a, b]) assert.deepEqual([o.finishReason, o.text], ["stop", "Hello "], o.error);
  assert.equal(plain.finishReason, "length", plain.error);
  assert.equal(plain.text, tok.decode([A, B, STOP, C, C]));
  assertEngineIdle(engine);
});
