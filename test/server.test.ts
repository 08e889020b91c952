/** The OpenAI-compatible server through the official `openai` client and raw HTTP, on loopback. */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { startServer, metric, type TestServer } from "./support/server.js";

let s: TestServer;
let client: OpenAI;
before(async () => {
  s = await startServer();
  client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "unused", maxRetries: 0 });
});
after(async () => s.close());

const messages = [{ role: "user" as const, content: "Tell me a story about a cat." }];

test("chat: non-streaming response has OpenAI's shape and usage", async () => {
  const r = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 8, temperature: 0 });
  assert.equal(r.object, "chat.completion");
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0]!.message.role, "assistant");
  assert.equal(typeof r.choices[0]!.message.content, "string");
  assert.equal(r.choices[0]!.finish_reason, "length");
  assert.equal(r.usage!.completion_tokens, 8);
  assert.equal(r.usage!.total_tokens, r.usage!.prompt_tokens + 8);
});

test("chat: streamed text equals the non-streamed text for the same seed; role first, usage last", async () => {
  const params = { model: "tiny", messages, max_tokens: 12, temperature: 0.9, seed: 42 };
  const whole = await client.chat.completions.create(params);
  const stream = await client.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  assert.equal(chunks[0]!.choices[0]!.delta.role, "assistant");
  const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("");
  assert.equal(text, whole.choices[0]!.message.content);
  const finish = chunks.find((c) => c.choices[0]?.finish_reason);
  assert.equal(finish!.choices[0]!.finish_reason, "length");
  const last = chunks.at(-1)!;
  assert.deepEqual(last.choices, []);
  assert.equal(last.usage!.completion_tokens, 12);
  assert.ok(chunks.filter((c) => c.choices[0]?.delta.content).length > 1, "content is flushed per token");
});

test("chat: n > 1 gives n choices; log-probs with top_logprobs", async () => {
  const r = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 5, n: 3, temperature: 1, seed: 1, logprobs: true, top_logprobs: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  assert.equal(r.usage!.completion_tokens, 15);
  for (const c of r.choices) {
    assert.equal(c.logprobs!.content!.length, 5);
    for (const lp of c.logprobs!.content!) {
      assert.ok(lp.logprob <= 0);
      assert.equal(lp.top_logprobs.length, 2);
      assert.ok(lp.top_logprobs[0]!.logprob >= lp.top_logprobs[1]!.logprob);
    }
  }
  assert.ok(new Set(r.choices.map((c) => c.message.content)).size > 1, "choices sample independently");
});

test("completions: text, token-id and list prompts; echo; return_token_ids", async () => {
  const r = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 4, temperature: 0 });
  assert.equal(r.object, "text_completion");
  assert.equal(r.choices[0]!.finish_reason, "length");
  const ids = await client.completions.create({ model: "tiny", prompt: [[9707, 1052], [785, 3974]], max_tokens: 3, temperature: 0 });
  assert.deepEqual(ids.choices.map((c) => c.index), [0, 1]);
  assert.equal(ids.usage!.prompt_tokens, 4);
  const echo = await client.completions.create({ model: "tiny", prompt: "Once upon a time", max_tokens: 4, temperature: 0, echo: true });
  assert.equal(echo.choices[0]!.text, "Once upon a time" + r.choices[0]!.text);
  const raw = await (await fetch(`${s.url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 3, temperature: 0, return_token_ids: true }),
  })).json() as { prompt_token_ids: number[]; choices: { token_ids: number[] }[] };
  assert.deepEqual(raw.prompt_token_ids, [9707]);
  assert.equal(raw.choices[0]!.token_ids.length, 3);
});

test("completions: logprobs: K; streaming with include_usage", async () => {
  const r = await client.completions.create({ model: "tiny", prompt: "Hello", max_tokens: 3, temperature: 0, logprobs: 2 });
  const lp = r.choices[0]!.logprobs!;
  assert.equal(lp.tokens!.length, 3);
  assert.equal(lp.token_logprobs!.length, 3);
  assert.equal(Object.keys(lp.top_logprobs![0]!).length, 2);
  const stream = await client.completions.create({ model: "tiny", prompt: "Hello", max_tokens: 3, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "";
  let usage = null;
  for await (const c of stream) {
    text += c.choices[0]?.text ?? "";
    usage = c.usage ?? usage;
  }
  assert.equal(text, r.choices[0]!.text);
  assert.equal(usage!.completion_tokens, 3);
});

test("stop strings end generation and are not returned", async () => {
  const free = await client.completions.create({ model: "tiny", prompt: "The", max_tokens: 16, temperature: 0 });
  const text = free.choices[0]!.text;
  const stop = text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
  assert.ok(stop.trim().length > 0, `need a stop string inside ${JSON.stringify(text)}`);
  const cut = await client.completions.create({ model: "tiny", prompt: "The", max_tokens: 16, temperature: 0, stop: [stop] });
  assert.equal(cut.choices[0]!.text, text.slice(0, text.indexOf(stop)));
  assert.equal(cut.choices[0]!.finish_reason, "stop");
  const streamed = await client.completions.create({ model: "tiny", prompt: "The", max_tokens: 16, temperature: 0, stop, stream: true });
  let st = "";
  for await (const c of streamed) st += c.choices[0]?.text ?? "";
  assert.equal(st, cut.choices[0]!.text);
});

test("models: list and get", async () => {
  const list = await client.models.list();
  assert.deepEqual(list.data.map((m) => m.id), ["tiny"]);
  const one = await client.models.retrieve("tiny");
  assert.equal(one.id, "tiny");
  await assert.rejects(client.models.retrieve("nope"), (e: InstanceType<typeof OpenAI.APIError>) => e.status === 404);
});

interface Case {
  name: string;
  path?: string;
  body?: unknown;
  raw?: string;
  headers?: Record<string, string>;
  status: number;
  type: string;
  param?: string;
}

const chat = (extra: Record<string, unknown>): Record<string, unknown> => ({ model: "tiny", messages, max_tokens: 2, ...extra });
const CASES: Case[] = [
  { name: "missing model", body: { messages }, status: 400, type: "invalid_request_error", param: "model" },
  { name: "unknown model", body: chat({ model: "gpt-9" }), status: 404, type: "invalid_request_error", param: "model" },
  { name: "messages not a list", body: chat({ messages: "hi" }), status: 400, type: "invalid_request_error", param: "messages" },
  { name: "empty messages", body: chat({ messages: [] }), status: 400, type: "invalid_request_error", param: "messages" },
  { name: "bad role", body: chat({ messages: [{ role: "robot", content: "x" }] }), status: 400, type: "invalid_request_error", param: "messages[0].role" },
  { name: "image part", body: chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }), status: 400, type: "invalid_request_error", param: "messages[0].content[0].type" },
  { name: "temperature too high", body: chat({ temperature: 5 }), status: 400, type: "invalid_request_error", param: "temperature" },
  { name: "temperature a string", body: chat({ temperature: "hot" }), status: 400, type: "invalid_request_error", param: "temperature" },
  { name: "top_p zero", body: chat({ top_p: 0 }), status: 400, type: "invalid_request_error", param: "top_p" },
  { name: "max_tokens zero", body: chat({ max_tokens: 0 }), status: 400, type: "invalid_request_error", param: "max_tokens" },
  { name: "max_tokens fractional", body: chat({ max_tokens: 1.5 }), status: 400, type: "invalid_request_error", param: "max_tokens" },
  { name: "n too large", body: chat({ n: 100 }), status: 400, type: "invalid_request_error", param: "n" },
  { name: "too many stops", body: chat({ stop: Array.from({ length: 17 }, (_, i) => `s${i}`) }), status: 400, type: "invalid_request_error", param: "stop" },
  { name: "stop not strings", body: chat({ stop: [1, 2] }), status: 400, type: "invalid_request_error", param: "stop" },
  { name: "top_logprobs without logprobs", body: chat({ top_logprobs: 2 }), status: 400, type: "invalid_request_error", param: "top_logprobs" },
  { name: "top_logprobs too many", body: chat({ logprobs: true, top_logprobs: 50 }), status: 400, type: "invalid_request_error", param: "top_logprobs" },
  { name: "presence_penalty out of range", body: chat({ presence_penalty: 3 }), status: 400, type: "invalid_request_error", param: "presence_penalty" },
  { name: "stream not boolean", body: chat({ stream: "yes" }), status: 400, type: "invalid_request_error", param: "stream" },
  { name: "context exceeded", body: chat({ max_tokens: 5000 }), status: 400, type: "invalid_request_error", param: "max_tokens" },
  { name: "prompt token out of vocabulary", path: "/v1/completions", body: { model: "tiny", prompt: [999999999] }, status: 400, type: "invalid_request_error", param: "prompt" },
  { name: "empty prompt", path: "/v1/completions", body: { model: "tiny", prompt: "" }, status: 400, type: "invalid_request_error", param: "prompt" },
  { name: "prompt an object", path: "/v1/completions", body: { model: "tiny", prompt: { a: 1 } }, status: 400, type: "invalid_request_error", param: "prompt" },
  { name: "completions logprobs too many", path: "/v1/completions", body: { model: "tiny", prompt: "x", logprobs: 99 }, status: 400, type: "invalid_request_error", param: "logprobs" },
  { name: "body is an array", body: [1, 2], status: 400, type: "invalid_request_error" },
  { name: "invalid JSON", raw: "{\"model\": ", status: 400, type: "invalid_request_error" },
  { name: "wrong content type", raw: "model=tiny", headers: { "content-type": "text/plain" }, status: 415, type: "invalid_request_error" },
  { name: "body too large", raw: JSON.stringify(chat({ messages: [{ role: "user", content: "x".repeat(2 * 1024 * 1024) }] })), status: 413, type: "invalid_request_error" },
  { name: "unknown route", path: "/v1/nothing", body: {}, status: 404, type: "invalid_request_error" },
];

test(`bad input matrix (${CASES.length} cases): exact status and OpenAI error type; the server still serves`, async () => {
  assert.ok(CASES.length >= 20);
  for (const c of CASES) {
    const res = await fetch(`${s.url}${c.path ?? "/v1/chat/completions"}`, {
      method: "POST",
      headers: { "content-type": "application/json", ...c.headers },
      body: c.raw ?? JSON.stringify(c.body),
    });
    const body = await res.json() as { error: { type: string; param: string | null; message: string; code: string } };
    assert.equal(res.status, c.status, `${c.name}: status (${body.error?.message})`);
    assert.equal(body.error.type, c.type, `${c.name}: type`);
    assert.equal(typeof body.error.message, "string");
    if (c.param) assert.equal(body.error.param, c.param, `${c.name}: param`);
  }
  const ok = await client.chat.completions.create({ model: "tiny", messages, max_tokens: 2 });
  assert.equal(ok.choices.length, 1);
});

test("a client that disconnects mid-stream is aborted and the KV usage metric returns to 0", async () => {
  const ctrl = new AbortController();
  const res = await fetch(`${s.url}/v1/completions`, {
    method: "POST", headers: { "content-type": "application/json" }, signal: ctrl.signal,
    body: JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 900, ignore_eos: true, stream: true }),
  });
  const reader = res.body!.getReader();
  await reader.read();
  await reader.read();
  assert.ok(await metric(s.url, "vllm:kv_cache_usage_perc") > 0, "blocks are in use mid-stream");
  ctrl.abort();
  const deadline = Date.now() + 5000;
  while (await metric(s.url, "vllm:kv_cache_usage_perc") > 0) {
    assert.ok(Date.now() < deadline, "KV usage did not return to 0");
    await new Promise((r) => setTimeout(r, 20));
  }
  assert.equal(await metric(s.url, "vllm:num_requests_running"), 0);
});

test("metrics use vLLM's names", async () => {
  const text = await (await fetch(`${s.url}/metrics`)).text();
  const types = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
  const expected: [string, string][] = [
    ["vllm:prompt_tokens_total", "counter"], ["vllm:generation_tokens_total", "counter"], ["vllm:prefix_cache_queries_total", "counter"],
    ["vllm:prefix_cache_hits_total", "counter"], ["vllm:request_success_total", "counter"], ["vllm:num_preemptions_total", "counter"],
    ["vllm:num_requests_running", "gauge"], ["vllm:num_requests_waiting", "gauge"], ["vllm:kv_cache_usage_perc", "gauge"], ["vllm:cache_config_info", "gauge"],
    ["vllm:time_to_first_token_seconds", "histogram"], ["vllm:inter_token_latency_seconds", "histogram"], ["vllm:e2e_request_latency_seconds", "histogram"],
    ["vllm:request_queue_time_seconds", "histogram"], ["vllm:iteration_tokens_total", "histogram"],
    ["weft_waiting_requests", "gauge"], ["weft_aging_promotions_total", "counter"],
  ];
  for (const [name, type] of expected) assert.equal(types.get(name), type, `${name} is exported as a ${type}`);
  assert.match(text, /^vllm:request_success_total\{model_name="tiny",finished_reason="(stop|length)"\} \d+$/m);
  assert.match(text, /vllm:cache_config_info\{model_name="tiny",block_size="16",num_gpu_blocks="\d+",cache_dtype="(float32|bfloat16|float16)"\} 1/);
});

test("health stays open; one log line per request without prompt text", async () => {
  const h = await fetch(`${s.url}/health`);
  assert.equal(h.status, 200);
  const secret = "my-very-secret-prompt-text";
  await client.completions.create({ model: "tiny", prompt: secret, max_tokens: 2 });
  const line = s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "request").at(-1)!;
  for (const k of ["id", "tenant", "model", "priority", "prompt_tokens", "completion_tokens", "ttft_ms", "duration_ms", "finish_reason"]) assert.ok(k in line, k);
  assert.ok(!s.logs.some((l) => l.includes(secret)));
});

test("beyond --max-waiting-requests: 429 with Retry-After, and the accepted requests still complete", async () => {
  const small = await startServer({ engine: { maxWaitingRequests: 1, maxNumSeqs: 1 } });
  try {
    const send = (): Promise<Response> => fetch(`${small.url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "Hello", max_tokens: 50, ignore_eos: true }),
    });
    const results = await Promise.all(Array.from({ length: 6 }, send));
    const statuses = results.map((r) => r.status);
    assert.ok(statuses.includes(429), `statuses ${statuses}`);
    assert.ok(statuses.includes(200));
    for (const r of results) {
      const body = await r.json() as { error?: { type: string }; choices?: unknown[] };
      if (r.status === 429) {
        assert.equal(body.error!.type, "rate_limit_error");
        assert.ok(Number(r.headers.get("retry-after")) > 0);
      } else {
        assert.equal(body.choices!.length, 1);
      }
    }
  } finally {
    await small.close();
  }
});

test("--protect-metrics: /metrics needs a key, /health does not", async () => {
  const p = await startServer({ protectMetrics: true, apiKey: "static-key" });
  try {
    assert.equal((await fetch(`${p.url}/metrics`)).status, 401);
    assert.equal((await fetch(`${p.url}/metrics`, { headers: { authorization: "Bearer static-key" } })).status, 200);
    assert.equal((await fetch(`${p.url}/health`)).status, 200);
  } finally {
    await p.close();
  }
});
