/**
 * Multi-step decode (--num-scheduler-steps, NativeStepInput.decodeSteps): k decode steps in one
 * native call give what k single steps give, sample for sample, on the real addon; the engine
 * runs them only while every request decodes, drops what a run computes past a request's stop,
 * and leaves no KV block behind.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Engine, type Runner } from "../src/engine/engine.js";
import { Priority, Request } from "../src/engine/request.js";
import { Scheduler } from "../src/engine/scheduler.js";
import { KvCacheManager } from "../src/kv/kv-cache-manager.js";
import { DEFAULT_ENGINE_CONFIG, type EngineConfig } from "../src/engine/engine-config.js";
import { defaultSamplingParams, type SamplingParams } from "../src/engine/sampling-params.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { ModelRunner, type RunnerSampling, type RunnerSequence, type StepResult } from "../src/runtime/model-runner.js";
import { assertEngineIdle, completeFixtureModel } from "./helpers.js";
import { startServer } from "./support/server.js";

const BLOCK = 4;
const dir = completeFixtureModel("tiny-qwen3");
const ckpt = loadCheckpoint(dir);
const tokenizer = TextTokenizer.fromDir(dir);
const runner = await ModelRunner.create(ckpt, { numBlocks: 256, blockSize: BLOCK }, "float32");
const prompts = [[352, 24944, 50865, 95443, 92077], [9707, 1052, 374], [100, 2000, 30000, 4000, 500, 60, 7]];
const samplings: RunnerSampling[] = [
  defaultSamplingParams({ temperature: 0, maxTokens: 64 }),
  defaultSamplingParams({ temperature: 0.9, topP: 0.9, seed: 11, maxTokens: 64, presencePenalty: 0.8, frequencyPenalty: 0.5, repetitionPenalty: 1.3, logprobs: 2 }),
  defaultSamplingParams({ temperature: 1.2, topK: 40, seed: 5, maxTokens: 64, logprobs: 1 }),
];
/** Sequence i owns blocks 60·i, 60·i + 1, ...: enough for its prompt and 40 more tokens. */
const table = (i: number): number[] => Array.from({ length: 16 }, (_, b) => 60 * i + b);
const decodeRow = (i: number, outputs: number[]): RunnerSequence => ({
  tokenIds: [outputs[outputs.length - 1]!], startPosition: prompts[i]!.length + outputs.length - 1, blockTable: table(i),
  sample: { params: samplings[i]!, counter: outputs.length, promptIds: prompts[i]!, outputIds: outputs },
});

/** Prefills every prompt, then decodes `steps` tokens each in calls of `k` steps; each sequence's samples in order. */
async function generate(steps: number, k: number): Promise<{ tokenId: number; logprob: number; top: unknown }[][]> {
  const first = await runner.execute(prompts.map((p, i) => ({
    tokenIds: p, startPosition: 0, blockTable: table(i), sample: { params: samplings[i]!, counter: 0, promptIds: p, outputIds: [] },
  })));
  const out = first.samples.map((s) => [s!]);
  while (out[0]!.length < steps) {
    const n = Math.min(k, steps - out[0]!.length);
    const r = await runner.execute(out.map((o, i) => decodeRow(i, o.map((s) => s.tokenId))), n);
    assert.equal(r.following?.length ?? 0, n - 1);
    for (const step of [r, ...(r.following ?? [])]) step.samples.forEach((s, i) => out[i]!.push(s!));
  }
  return out;
}

test("k decode steps in one call give the samples, log-probs and top log-probs of k single steps (greedy, seeded, penalties, across blocks)", async () => {
  const single = await generate(23, 1);
  for (const k of [2, 5, 8]) assert.deepEqual(await generate(23, k), single, `decodeSteps ${k}`);
});

test("a multi-step input that breaks its rules is refused with a clear error", async () => {
  const outputs = [500];
  const row = decodeRow(0, outputs);
  await assert.rejects(runner.execute([{ ...row, blockTable: table(0).slice(0, 2) }], 8), /block table does not hold every decode step/);
  await assert.rejects(runner.execute([{ ...row, tokenIds: [1, 2], startPosition: 4 }], 3), /one sampled row per sequence/);
  await assert.rejects(runner.execute([row], 0), /decodeSteps must be at least 1/);
  await assert.rejects(runner.execute([{ ...row, allLogits: true }], 2), /no logits or prompt scores/);
});

/** Counts the decode steps a runner is asked for per call. */
class CountingRunner implements Runner {
  readonly calls: number[] = [];
  execute(seqs: readonly RunnerSequence[], decodeSteps = 1): Promise<StepResult> {
    this.calls.push(decodeSteps);
    return runner.execute(seqs, decodeSteps);
  }
}

const config = (numSchedulerSteps: number): EngineConfig => ({ ...DEFAULT_ENGINE_CONFIG, blockSize: BLOCK, maxNumSeqs: 8, maxNumBatchedTokens: 64, numSchedulerSteps });
const limits = { numBlocks: 256, maxModelLen: 256, vocabSize: ckpt.config.vocab, eosTokenIds: [] };

async function serve(numSchedulerSteps: number, requests: { prompt: number[]; params: SamplingParams; after?: number }[]) {
  const counting = new CountingRunner();
  const engine = new Engine(counting, config(numSchedulerSteps), limits, tokenizer);
  const outs = await Promise.all(requests.map(async (r) => {
    if (r.after) await new Promise((resolve) => setTimeout(resolve, r.after));
    const o = await engine.add({ promptTokenIds: r.prompt, params: r.params }).collect();
    return { tokens: o.tokenIds, text: o.text, finish: o.finishReason, stop: o.stopReason, logprobs: o.logprobs };
  }));
  assertEngineIdle(engine);
  return { outs, calls: counting.calls };
}

test("the engine with --num-scheduler-steps 6 serves what it serves with 1: stops by token, string and length inside a run; a late arrival; no leaks", async () => {
  const greedy = (maxTokens: number, over: Partial<SamplingParams> = {}): SamplingParams => defaultSamplingParams({ temperature: 0, maxTokens, ignoreEos: true, ...over });
  const free = await serve(1, [{ prompt: prompts[0]!, params: greedy(30) }]);
  const tokens = free.outs[0]!.tokens, text = free.outs[0]!.text;
  const stopToken = tokens[9]!, stopString = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
  const requests = [
    { prompt: prompts[0]!, params: greedy(30, { stopTokenIds: [stopToken] }) },
    { prompt: prompts[0]!, params: greedy(30, { stop: [stopString] }) },
    { prompt: prompts[1]!, params: greedy(17) },
    { prompt: prompts[2]!, params: defaultSamplingParams({ temperature: 0.8, seed: 3, maxTokens: 25, ignoreEos: true, frequencyPenalty: 0.7, logprobs: 2 }) },
    { prompt: prompts[1]!, params: greedy(9, { minTokens: 4 }), after: 5 },
  ];
  const one = await serve(1, requests), six = await serve(6, requests);
  assert.deepEqual(six.outs, one.outs);
  assert.ok(one.calls.every((k) => k === 1));
  assert.ok(six.calls.some((k) => k === 6), "runs of six steps were used");
  assert.ok(six.calls.length < one.calls.length / 2, `${six.calls.length} calls against ${one.calls.length}`);
  assert.equal(one.outs[0]!.finish, "stop");
  assert.equal(one.outs[0]!.tokens.length, tokens.indexOf(stopToken) + 1);
  assert.equal(one.outs[1]!.finish, "stop");
  assert.equal(one.outs[2]!.tokens.length, 17);
});

/** Samples token 1000 + its counter for every row; sequence `failing` fails from its third sample on, in whichever step of a run that falls. */
class FailingRunner implements Runner {
  constructor(private readonly failing: number) {}
  execute(seqs: readonly RunnerSequence[], decodeSteps = 1): Promise<StepResult> {
    const step = (j: number): Pick<StepResult, "samples" | "errors"> => {
      const fails = seqs.map((s) => s.sample !== null && s.sample !== undefined && s.sample.promptIds[0] === this.failing && s.sample.counter + j >= 2);
      return {
        samples: seqs.map((s, i) => (s.sample && !fails[i] ? { tokenId: 1000 + s.sample.counter + j, logprob: -1, top: [] } : null)),
        errors: fails.map((f) => (f ? "the model produced non-finite logits" : null)),
      };
    };
    const [first, ...following] = Array.from({ length: decodeSteps }, (_, j) => step(j));
    return Promise.resolve(decodeSteps === 1 ? first! : { ...first!, following });
  }
}

test("a row that fails inside a run ends its stream after the tokens before it, with the error; the other rows go on", async () => {
  for (const k of [1, 6]) {
    const engine = new Engine(new FailingRunner(7), config(k), limits);
    const params = defaultSamplingParams({ temperature: 0, maxTokens: 10, ignoreEos: true });
    const [bad, good] = await Promise.all([7, 8].map((p) => engine.add({ promptTokenIds: [p, 1, 2], params }).collect()));
    assert.deepEqual(bad!.tokenIds, [1000, 1001], `k ${k}`);
    assert.equal(bad!.finishReason, "error");
    assert.match(bad!.error ?? "", /step failed for this request: the model produced non-finite logits/);
    assert.deepEqual(good!.tokenIds, Array.from({ length: 10 }, (_, i) => 1000 + i));
    assert.equal(good!.finishReason, "length");
    assertEngineIdle(engine);
  }
});

test("over HTTP with the openai client, --num-scheduler-steps 5 streams and returns what 1 does (text, log-probs, finish reasons, usage)", async () => {
  const serve = async (numSchedulerSteps: number) => {
    const calls: number[] = [];
    const s = await startServer({
      engine: { numSchedulerSteps },
      wrapRunner: (r) => ({ execute: (seqs, k = 1) => (calls.push(k), r.execute(seqs, k)) }),
    });
    const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
    try {
      const stream = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 23, temperature: 0, stream: true, stream_options: { include_usage: true } });
      let text = "", finish: string | null = null, usage: unknown = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta.content ?? "";
        finish = chunk.choices[0]?.finish_reason ?? finish;
        usage = chunk.usage ?? usage;
      }
      const completion = await client.completions.create({ model: "tiny", prompt: "Once upon", max_tokens: 17, temperature: 0.7, seed: 4, logprobs: 2 });
      const c = completion.choices[0]!;
      return { chat: { text, finish, usage }, completion: { text: c.text, finish: c.finish_reason, logprobs: c.logprobs, usage: completion.usage }, calls };
    } finally {
      await s.close();
    }
  };
  const one = await serve(1), five = await serve(5);
  assert.deepEqual(five.chat, one.chat);
  assert.deepEqual(five.completion, one.completion);
  assert.equal(one.chat.finish, "length");
  assert.ok(five.calls.includes(5) && !one.calls.some((k) => k > 1), "runs of five steps were used, and only with the flag");
});

test("a full batch runs multi-step while the queue behind it cannot start, with the outputs of single steps", async () => {
  const params = defaultSamplingParams({ temperature: 0, maxTokens: 24, ignoreEos: true });
  const run = async (k: number) => {
    const counting = new CountingRunner();
    const engine = new Engine(counting, { ...config(k), maxNumSeqs: 2 }, limits, tokenizer);
    const outs = await Promise.all([0, 1, 2, 0].map((p) => engine.add({ promptTokenIds: prompts[p]!, params }).collect()));
    assertEngineIdle(engine);
    return { tokens: outs.map((o) => o.tokenIds), calls: counting.calls };
  };
  const one = await run(1), four = await run(4);
  assert.deepEqual(four.tokens, one.tokens);
  assert.ok(four.calls.filter((k) => k === 4).length >= 8, `runs while two requests waited: ${four.calls.join(",")}`);
});

test("admission is pending (no multi-step run) while a slot is free or a waiting request of better priority would take one", () => {
  const clock = { t: 0 };
  const cfg = { ...config(4), maxNumSeqs: 2 };
  const s = new Scheduler(cfg, limits, new KvCacheManager(limits.numBlocks, BLOCK), () => clock.t);
  let seq = 0;
  const add = (priority: Priority): void => s.add(new Request(`r${seq}`, [1, 2, 3], defaultSamplingParams({ maxTokens: 8 }), priority, "", "", clock.t, seq++));
  assert.equal(s.admissionPending, false, "nothing waits");
  add(Priority.LOW);
  assert.equal(s.admissionPending, true, "a free slot");
  add(Priority.LOW);
  s.schedule();
  add(Priority.LOW);
  assert.equal(s.admissionPending, false, "a full batch, and the head of the queue no better than it");
  add(Priority.HIGH);
  assert.equal(s.admissionPending, true, "a HIGH request takes a LOW one's slot at the next step");
});

test("a request near its max_tokens does not shorten the batch's runs: it ends inside one, with its own length", async () => {
  const greedy = (maxTokens: number): SamplingParams => defaultSamplingParams({ temperature: 0, maxTokens, ignoreEos: true });
  const requests = [{ prompt: prompts[0]!, params: greedy(3) }, { prompt: prompts[1]!, params: greedy(30) }];
  const one = await serve(1, requests), six = await serve(6, requests);
  assert.deepEqual(six.outs, one.outs);
  assert.deepEqual(six.outs.map((o) => o.tokens.length), [3, 30]);
  // Calls: A's prompt, B's prompt with A's second token, then runs of both though A has one token left.
  assert.equal(six.calls[2], 6, `the first call with both decoding runs six steps: ${six.calls.join(",")}`);
});
