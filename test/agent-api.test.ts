/**
 * The agent-facing fields on the real server with the tiny-qwen3 model and its real tokenizer
 * and chat template: tools rendered into the prompt and parsed out of the answer (whole and
 * streamed, through the openai SDK), reasoning split off, tool turns rendered into the next
 * prompt, skip_special_tokens, min_tokens, logit_bias, /tokenize and /detokenize, chat_template.jinja.
 * The weights are random, so the model's answers are mostly scripted: the runner emits chosen text,
 * tokenized with the model's own tokenizer, then EOS. logit_bias and min_tokens' ban on EOS run
 * through the real native sampler.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import OpenAI from "openai";
import type { Runner } from "../src/engine/engine.js";
import type { RunnerSequence, StepResult } from "../src/runtime/model-runner.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { DEFAULT_CHAT_SETTINGS, outputSpec } from "../src/server/chat-settings.js";
import { parseChatRequest } from "../src/server/request-schema.js";
import { encodePrompts } from "../src/server/engine-requests.js";
import { completeFixtureModel } from "./helpers.js";
import { fixtureModelDir, startServer, type TestServer } from "./support/server.js";

const tok = TextTokenizer.fromDir(fixtureModelDir());
const EOS = tok.tokenId("<|im_end|>")!;

/** What the runner answers next (token ids, then EOS forever), and the prompts it was given. */
let script: number[] = [];
const prompts: number[][] = [];

class ScriptedRunner implements Runner {
  execute(seqs: readonly RunnerSequence[]): Promise<StepResult> {
    const samples = seqs.map((s) => {
      if (!s.sample) return null;
      if (s.sample.counter === 0) prompts.push([...s.sample.promptIds]);
      return { tokenId: script[s.sample.counter] ?? EOS, logprob: -1, top: [] };
    });
    return Promise.resolve({ samples, errors: seqs.map(() => null) });
  }
}

const answer = (text: string): void => {
  script = tok.encode(text, false);
};

const WEATHER = {
  type: "function" as const,
  function: {
    name: "get_weather", description: "Current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const CALL = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
const USER = [{ role: "user" as const, content: "Weather in Paris?" }];

let s: TestServer;
let client: OpenAI;
let templated: string;

before(async () => {
  // A model directory whose chat_template.jinja replaces tokenizer_config.json's template.
  templated = completeFixtureModel("tiny-qwen3");
  fs.writeFileSync(path.join(templated, "chat_template.jinja"), "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]");
  // "real" runs the real native step (random weights); the other models answer from the script.
  s = await startServer({ models: { templated, real: fixtureModelDir() }, wrapRunner: (runner, id) => (id === "real" ? runner : new ScriptedRunner()) });
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
});
after(async () => s.close());

async function post(route: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${s.url}${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}

const lastPromptText = (): string => tok.decode(prompts.at(-1)!, false);

test("tools: rendered by the chat template into the prompt; a hermes call comes back as tool_calls with finish_reason tool_calls", async () => {
  answer(CALL);
  const r = await client.chat.completions.create({ model: "tiny", messages: USER, tools: [WEATHER], max_tokens: 64 });
  const prompt = lastPromptText();
  assert.match(prompt, /# Tools[\s\S]*<tools>\n\{"type": "function", "function": \{"name": "get_weather"/);
  const tokenized = await post("/tokenize", { model: "tiny", messages: USER, tools: [WEATHER] });
  assert.deepEqual(tokenized.json.tokens, prompts.at(-1), "/tokenize gives the engine's prompt");
  const c = r.choices[0]!;
  assert.equal(c.finish_reason, "tool_calls");
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls?.length, 1);
  const call = c.message.tool_calls![0]!;
  assert.equal(call.type, "function");
  assert.ok(call.type === "function" && call.function.name === "get_weather");
  assert.deepEqual(call.type === "function" ? JSON.parse(call.function.arguments) : null, { city: "Paris" });
  assert.match(call.id, /^call_/);
});

test("tools, streamed through the SDK: id and name first, then the arguments; they reassemble into the whole answer's call", async () => {
  answer(`Checking.\n${CALL}\n${CALL.replace("Paris", "Lyon")}`);
  const stream = await client.chat.completions.create({ model: "tiny", messages: USER, tools: [WEATHER], max_tokens: 96, stream: true });
  let content = "";
  const calls: { id?: string; name: string; args: string }[] = [];
  let finish: string | null = null;
  let sawNameBeforeArgs = false;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    content += ch.delta.content ?? "";
    for (const d of ch.delta.tool_calls ?? []) {
      if (d.id) {
        calls[d.index] = { id: d.id, name: d.function?.name ?? "", args: d.function?.arguments ?? "" };
        sawNameBeforeArgs = d.function?.arguments === "";
      } else calls[d.index]!.args += d.function?.arguments ?? "";
    }
    finish = ch.finish_reason ?? finish;
  }
  assert.equal(finish, "tool_calls");
  assert.equal(content, "Checking.\n");
  assert.ok(sawNameBeforeArgs);
  assert.deepEqual(calls.map((c) => [c.name, JSON.parse(c.args)]), [["get_weather", { city: "Paris" }], ["get_weather", { city: "Lyon" }]]);
  assert.equal(new Set(calls.map((c) => c.id)).size, 2, "each call has its own id");
  answer(`Checking.\n${CALL}\n${CALL.replace("Paris", "Lyon")}`);
  const whole = await client.chat.completions.create({ model: "tiny", messages: USER, tools: [WEATHER], max_tokens: 96 });
  assert.equal(whole.choices[0]!.message.content, "Checking.\n");
  assert.deepEqual(whole.choices[0]!.message.tool_calls!.map((c) => (c.type === "function" ? [c.function.name, JSON.parse(c.function.arguments)] : null)),
    calls.map((c) => [c.name, JSON.parse(c.args)]));
});

test("tool_choice none renders no tools and parses no calls; parallel_tool_calls false keeps the first call", async () => {
  answer(CALL);
  const none = await post("/v1/chat/completions", { model: "tiny", messages: USER, tools: [WEATHER], tool_choice: "none", max_tokens: 64 });
  assert.doesNotMatch(lastPromptText(), /<tools>/);
  const c = (none.json.choices as { message: { content: string; tool_calls?: unknown }; finish_reason: string }[])[0]!;
  assert.equal(c.message.content, CALL);
  assert.equal(c.message.tool_calls, undefined);
  assert.equal(c.finish_reason, "stop");
  answer(`${CALL}${CALL}`);
  const one = await client.chat.completions.create({ model: "tiny", messages: USER, tools: [WEATHER], parallel_tool_calls: false, max_tokens: 96 });
  assert.equal(one.choices[0]!.message.tool_calls?.length, 1);
});

// tool_choice required and named are enforced by constrained decoding: test/tool-choice.test.ts runs them on real models.
test("tool_choice naming a function not in tools, or a tool without a name, is a 400", async () => {
  const unknown = await post("/v1/chat/completions", { model: "tiny", messages: USER, tools: [WEATHER], tool_choice: { type: "function", function: { name: "nope" } } });
  assert.equal(unknown.status, 400);
  assert.equal((unknown.json.error as { param: string }).param, "tool_choice");
  const badTool = await post("/v1/chat/completions", { model: "tiny", messages: USER, tools: [{ type: "function", function: {} }] });
  assert.equal((badTool.json.error as { param: string }).param, "tools[0].function.name");
});

test("an assistant turn with tool_calls and the tool's answer render into the next prompt", async () => {
  const messages = [
    ...USER,
    { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } }] },
    { role: "tool", tool_call_id: "call_1", content: "22C and sunny" },
  ];
  answer("It is 22C.");
  const r = await post("/v1/chat/completions", { model: "tiny", messages, tools: [WEATHER], max_tokens: 32 });
  assert.equal(r.status, 200);
  const prompt = lastPromptText();
  assert.ok(prompt.includes("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>"), prompt);
  assert.ok(prompt.includes("<|im_start|>user\n<tool_response>\n22C and sunny\n</tool_response><|im_end|>"), prompt);
  const missingId = await post("/v1/chat/completions", { model: "tiny", messages: [...USER, { role: "tool", content: "x" }] });
  assert.equal((missingId.json.error as { param: string }).param, "messages[1].tool_call_id");
});

test("reasoning: <think> is returned as reasoning_content, whole and streamed; chat_template_kwargs reach the template", async () => {
  answer("<think>\nThe user greets me.\n</think>\n\nHello!");
  const whole = await post("/v1/chat/completions", { model: "tiny", messages: USER, max_tokens: 32 });
  const msg = (whole.json.choices as { message: Record<string, unknown> }[])[0]!.message;
  assert.equal(msg.reasoning_content, "\nThe user greets me.\n");
  assert.equal(msg.content, "\n\nHello!");
  assert.ok(lastPromptText().endsWith("<|im_start|>assistant\n"));
  const stream = await client.chat.completions.create({ model: "tiny", messages: USER, max_tokens: 32, stream: true });
  let reasoning = "", content = "";
  for await (const chunk of stream) {
    const d = chunk.choices[0]?.delta as { content?: string; reasoning_content?: string } | undefined;
    reasoning += d?.reasoning_content ?? "";
    content += d?.content ?? "";
  }
  assert.equal(reasoning, msg.reasoning_content);
  assert.equal(content, msg.content);
  answer("Hi.");
  await post("/v1/chat/completions", { model: "tiny", messages: USER, max_tokens: 8, chat_template_kwargs: { enable_thinking: false } });
  assert.ok(lastPromptText().endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "enable_thinking false reached the template");
  const bad = await post("/v1/chat/completions", { model: "tiny", messages: USER, chat_template_kwargs: "no" });
  assert.equal((bad.json.error as { param: string }).param, "chat_template_kwargs");
});

test("--reasoning-parser none leaves think blocks in the content; a template without <think> has no reasoning parser", () => {
  const r = parseChatRequest({ model: "tiny", messages: USER });
  assert.deepEqual(outputSpec(r, tok, { ...DEFAULT_CHAT_SETTINGS, reasoningParser: "none" }, [1], "tiny").reasoning, null);
  assert.notEqual(outputSpec(r, tok, DEFAULT_CHAT_SETTINGS, [1], "tiny").reasoning, null);
  const plain = { ...DEFAULT_CHAT_SETTINGS, chatTemplate: "{% for m in messages %}{{ m.content }}{% endfor %}" };
  assert.equal(outputSpec(r, tok, plain, [1], "tiny").reasoning, null);
  assert.notEqual(outputSpec(r, tok, { ...plain, reasoningParser: "qwen3" }, [1], "tiny").reasoning, null);
});

test("--chat-template replaces the model's template in the prompts the engine runs", async () => {
  const model = await s.manager.acquire("tiny", "test");
  const chat = { ...DEFAULT_CHAT_SETTINGS, chatTemplate: "<<{{ messages[0].content }}|{{ enable_thinking }}>>" };
  const r = parseChatRequest({ model: "tiny", messages: USER, chat_template_kwargs: { enable_thinking: false } });
  const [ids] = await encodePrompts(r, model, undefined, chat);
  assert.equal(tok.decode(ids!, false), "<<Weather in Paris?|false>>");
});

test("skip_special_tokens false keeps special tokens' text; the default leaves it out", async () => {
  script = [...tok.encode("a", false), tok.tokenId("<|im_start|>")!, ...tok.encode("b", false)];
  const text = async (extra: object): Promise<string> => {
    const r = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 8, ...extra });
    return (r.json.choices as { text: string }[])[0]!.text;
  };
  assert.equal(await text({}), "ab");
  assert.equal(await text({ skip_special_tokens: false }), "a<|im_start|>b");
});

test("min_tokens: EOS and stop tokens do not end a request before min_tokens", async () => {
  script = [...tok.encode("a", false), EOS, ...tok.encode("b", false), EOS];
  const run = async (extra: object): Promise<{ finish_reason: string; tokens: number }> => {
    const r = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 6, ...extra });
    return { finish_reason: (r.json.choices as { finish_reason: string }[])[0]!.finish_reason, tokens: (r.json.usage as { completion_tokens: number }).completion_tokens };
  };
  assert.deepEqual(await run({}), { finish_reason: "stop", tokens: 2 });
  assert.deepEqual(await run({ min_tokens: 3 }), { finish_reason: "stop", tokens: 4 }, "the second EOS, past min_tokens, stops");
  assert.deepEqual(await run({ min_tokens: 5 }), { finish_reason: "stop", tokens: 5 }, "the EOS that makes min_tokens stops");
  const tooMany = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 6, min_tokens: 7 });
  assert.equal((tooMany.json.error as { param: string }).param, "min_tokens");
  const stopTok = tok.encode("b", false)[0]!;
  assert.deepEqual(await run({ stop_token_ids: [stopTok], ignore_eos: true, min_tokens: 4 }), { finish_reason: "length", tokens: 6 });
});

test("logit_bias in the native sampler: +100 makes a token the greedy choice, -100 keeps the greedy one out", async () => {
  const greedy = async (extra: object): Promise<number[]> => {
    const r = await post("/v1/completions", { model: "real", prompt: "Hello", max_tokens: 6, temperature: 0, ignore_eos: true, return_token_ids: true, ...extra });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return (r.json.choices as { token_ids: number[] }[])[0]!.token_ids;
  };
  const plain = await greedy({});
  const forced = tok.encode(" banana", false)[0]!;
  assert.ok(!plain.includes(forced));
  assert.deepEqual(await greedy({ logit_bias: { [forced]: 100 } }), Array(6).fill(forced));
  const first = plain[0]!;
  const banned = await greedy({ logit_bias: { [first]: -100 } });
  assert.ok(!banned.includes(first), "a -100 bias keeps the token out");
  for (const bad of [{ "12": 101 }, { abc: 1 }, [1], { "999999999": 1 }]) {
    const r = await post("/v1/completions", { model: "real", prompt: "x", logit_bias: bad });
    assert.equal(r.status, 400, JSON.stringify(bad));
    assert.equal((r.json.error as { param: string }).param, "logit_bias");
  }
});

test("min_tokens bans EOS from sampling until it is reached (native), even when EOS is the only likely token", async () => {
  const r = await post("/v1/completions", { model: "real", prompt: "Hello", max_tokens: 8, temperature: 0, logit_bias: { [EOS]: 100 }, min_tokens: 3, return_token_ids: true });
  const c = (r.json.choices as { token_ids: number[]; finish_reason: string }[])[0]!;
  assert.deepEqual(c.token_ids.slice(0, 3).filter((t) => t === EOS), []);
  assert.equal(c.token_ids.length, 4, "EOS is sampled the moment min_tokens allows it");
  assert.equal(c.token_ids[3], EOS);
  assert.equal(c.finish_reason, "stop");
});

test("seed: all 64 bits choose the stream (seeds equal in their low 32 bits differ); negative seeds are two's complement", async () => {
  const sampled = async (seed: number): Promise<number[]> => {
    const r = await post("/v1/completions", { model: "real", prompt: "Hello", max_tokens: 8, temperature: 1, ignore_eos: true, return_token_ids: true, seed });
    assert.equal(r.status, 200, JSON.stringify(r.json));
    return (r.json.choices as { token_ids: number[] }[])[0]!.token_ids;
  };
  const low = await sampled(5);
  assert.deepEqual(await sampled(5), low, "same seed, same tokens");
  assert.notDeepEqual(await sampled(5 + 2 ** 32), low, "bits above 32 count");
  assert.notDeepEqual(await sampled(5 + 2 ** 52), low, "bits above 52 count");
  assert.deepEqual(await sampled(-1), await sampled(-1));
  const over = await post("/v1/completions", { model: "real", prompt: "x", seed: 2 ** 64 });
  assert.equal((over.json.error as { param: string }).param, "seed");
});

test("/tokenize and /detokenize in vLLM's shapes", async () => {
  const t = await post("/tokenize", { model: "tiny", prompt: "Hello world", return_token_strs: true });
  assert.equal(t.status, 200);
  assert.deepEqual(t.json.tokens, tok.encode("Hello world"));
  assert.equal(t.json.count, (t.json.tokens as number[]).length);
  assert.equal(t.json.max_model_len, 1024);
  assert.deepEqual(t.json.token_strs, ["Hello", "Ġworld"]);
  const d = await post("/detokenize", { model: "tiny", tokens: t.json.tokens });
  assert.deepEqual(d.json, { prompt: "Hello world" });
  const chat = await post("/tokenize", { model: "tiny", messages: USER, add_generation_prompt: false });
  assert.equal(tok.decode(chat.json.tokens as number[], false), "<|im_start|>user\nWeather in Paris?<|im_end|>\n");
  assert.equal(chat.json.token_strs, null);
  const bad = await post("/detokenize", { model: "tiny", tokens: [1, 10_000_000] });
  assert.equal(bad.status, 400);
  assert.equal((bad.json.error as { param: string }).param, "tokens");
  assert.equal((await post("/tokenize", { model: "nope", prompt: "x" })).status, 404);
});

test("/tokenize and /detokenize need a key when keys are on", async () => {
  const keyed = await startServer({ apiKey: "sk-test" });
  try {
    const res = await fetch(`${keyed.url}/tokenize`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "tiny", prompt: "x" }) });
    assert.equal(res.status, 401);
    const ok = await fetch(`${keyed.url}/detokenize`, {
      method: "POST", headers: { "content-type": "application/json", authorization: "Bearer sk-test" }, body: JSON.stringify({ model: "tiny", tokens: [9707] }),
    });
    assert.equal(ok.status, 200);
  } finally {
    await keyed.close();
  }
});

test("a chat_template.jinja in the model directory is the template; tools need a template with a tool format", async () => {
  const r = await post("/tokenize", { model: "templated", messages: USER });
  assert.equal(tok.decode(r.json.tokens as number[], false), "[user]Weather in Paris?[assistant]");
  const tools = await post("/v1/chat/completions", { model: "templated", messages: USER, tools: [WEATHER] });
  assert.equal(tools.status, 400);
  assert.equal((tools.json.error as { param: string }).param, "tools");
});
