/**
 * Reliability and security on the real server: load, client faults, server
 * faults, fuzzed input, rate limits, and tenant isolation of the prefix cache.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import path from "node:path";
import { startServer, metric, fixtureModelDir, type TestServer } from "./support/server.js";
import { DEFAULT_ENGINE_CONFIG, planKv } from "../src/engine/engine-manager.js";
import { readModelConfig } from "../src/model/config.js";
import { percentile } from "../src/bench/stats.js";
import { readSseEvents } from "../src/bench/sse-reader.js";
import { makeModel } from "../src/model/make-model.js";
import { assertEngineIdle, tempDir } from "./helpers.js";

let s: TestServer;
/** Steps left to fail: faults are injected by wrapping the runner, as a native fault would surface. */
let failSteps = 0;
before(async () => (s = await startServer({
  engine: { maxNumSeqs: 32, maxWaitingRequests: 4096, maxWaitingPerTenant: 0 }, sseLimits: { stallTimeoutMs: 300, maxBufferedBytes: 64 * 1024 },
  wrapRunner: (runner) => ({ execute: (seqs) => (failSteps > 0 && failSteps-- > 0 ? Promise.reject(new Error("injected fault")) : runner.execute(seqs)) }),
})));
after(async () => s.close());

const json = { "content-type": "application/json" };

interface StreamResult {
  status: number;
  text: string;
  finish: string | null;
  ttftMs: number | null;
  error: unknown;
}

async function streamCompletion(url: string, body: Record<string, unknown>, opts: { key?: string; abortAfterChunks?: number; abortAfterMs?: number } = {}): Promise<StreamResult> {
  const ctrl = new AbortController();
  const start = performance.now();
  if (opts.abortAfterMs !== undefined) setTimeout(() => ctrl.abort(), opts.abortAfterMs);
  const headers: Record<string, string> = { ...json, ...(opts.key ? { authorization: `Bearer ${opts.key}` } : {}) };
  const out: StreamResult = { status: 0, text: "", finish: null, ttftMs: null, error: null };
  try {
    const res = await fetch(`${url}/v1/completions`, { method: "POST", headers, body: JSON.stringify({ ...body, stream: true }), signal: ctrl.signal });
    out.status = res.status;
    if (res.status !== 200) return (out.error = await res.json()), out;
    let chunks = 0;
    for await (const raw of readSseEvents(res.body!)) {
      const ev = raw as { choices?: { text: string; finish_reason: string | null }[]; error?: unknown };
      if (ev.error) out.error = ev.error;
      const c = ev.choices?.[0];
      if (c?.text) out.ttftMs ??= performance.now() - start;
      out.text += c?.text ?? "";
      out.finish = c?.finish_reason ?? out.finish;
      if (opts.abortAfterChunks !== undefined && ++chunks >= opts.abortAfterChunks) ctrl.abort();
    }
  } catch (e) {
    if (!ctrl.signal.aborted) throw e;
  }
  return out;
}

async function waitIdle(t: TestServer): Promise<void> {
  const deadline = Date.now() + 10000;
  while ((await metric(t.url, "vllm:kv_cache_usage_perc")) > 0 || (await metric(t.url, "vllm:num_requests_running")) > 0) {
    assert.ok(Date.now() < deadline, "the server did not return to idle");
    await new Promise((r) => setTimeout(r, 25));
  }
}

function assertNoLeaks(t: TestServer): void {
  for (const m of t.manager.engines) assertEngineIdle(m.engine);
}

test("load: 128 concurrent streaming clients × 3 requests, mixed lengths and priorities: all complete, no 5xx, memory bounded", async () => {
  const s = await startServer({ engine: { maxNumSeqs: 32, maxWaitingRequests: 4096 } });
  after(() => s.close());
  const keys = { high: s.store.create("load-high", "high"), normal: s.store.create("load-normal", "normal"), low: s.store.create("load-low", "low") };
  await new Promise((r) => setTimeout(r, 1100)); // the key cache refreshes every second
  const tiers = Object.values(keys);
  const results: StreamResult[] = [];
  const rssBefore = process.memoryUsage().rss;
  await Promise.all(Array.from({ length: 128 }, async (_, c) => {
    for (let r = 0; r < 3; r++) {
      const promptLen = 1 + ((c * 7 + r * 13) % 60);
      const res = await streamCompletion(s.url, { model: "tiny", prompt: Array.from({ length: promptLen }, (_, i) => 100 + ((c + i) % 5000)), max_tokens: 1 + ((c + r) % 24), ignore_eos: true },
        { key: tiers[(c + r) % 3]! });
      results.push(res);
    }
  }));
  assert.equal(results.length, 384);
  for (const r of results) {
    assert.equal(r.status, 200, JSON.stringify(r.error));
    assert.equal(r.finish, "length");
    assert.equal(r.error, null);
  }
  const ttfts = results.map((r) => r.ttftMs!).filter((x) => x !== null);
  const rssGrowth = (process.memoryUsage().rss - rssBefore) / 2 ** 20;
  console.log(`load: 384 requests, TTFT p50 ${percentile(ttfts, 50).toFixed(0)} ms, p99 ${percentile(ttfts, 99).toFixed(0)} ms; RSS growth ${rssGrowth.toFixed(0)} MiB`);
  assert.ok(rssGrowth < 512, `RSS grew by ${rssGrowth} MiB under load`);
  await waitIdle(s);
  assertNoLeaks(s);
});

test("200 aborts at random points (before the first token, mid-stream, during a long prefill): no leaks, still serving", async () => {
  let seed = 11;
  const rand = (): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  await Promise.all(Array.from({ length: 200 }, async (_, i) => {
    const kind = i % 3;
    const prompt = kind === 2 ? Array.from({ length: 900 }, (_, j) => 100 + j) : [100 + i, 200 + i];
    const body = { model: "tiny", prompt, max_tokens: 100, ignore_eos: true };
    if (kind === 0) await streamCompletion(s.url, body, { abortAfterMs: Math.floor(rand() * 3) });
    else if (kind === 1) await streamCompletion(s.url, body, { abortAfterChunks: 1 + Math.floor(rand() * 20) });
    else await streamCompletion(s.url, body, { abortAfterMs: 1 + Math.floor(rand() * 10) });
  }));
  await waitIdle(s);
  assertNoLeaks(s);
  const ok = await streamCompletion(s.url, { model: "tiny", prompt: "still here?", max_tokens: 3 });
  assert.equal(ok.finish, "length");
});

test("a slow reader that stops reading is cut off after the stall timeout and its blocks are freed", async () => {
  // A raw socket that never reads: the server's socket buffer fills, then the stall timer fires.
  const port = Number(new URL(s.url).port);
  const sock = net.connect(port, "127.0.0.1");
  await new Promise((r) => sock.once("connect", r));
  // 16 choices × 1000 tokens with 20 log-probs each: far more than the loopback socket buffers hold.
  const body = JSON.stringify({ model: "tiny", prompt: "x", max_tokens: 1000, n: 16, ignore_eos: true, stream: true, logprobs: 20 });
  sock.write(`POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  sock.pause();
  const closed = new Promise((r) => sock.once("close", r));
  // Filling loopback's socket buffers (several MiB) takes about 15 s of generation on 2 cores.
  const deadline = Date.now() + 40000;
  while (!s.logs.some((l) => l.includes("stream reader stalled"))) {
    assert.ok(Date.now() < deadline, "the stalled stream was never cut off");
    await new Promise((r) => setTimeout(r, 50));
  }
  sock.resume();
  await closed;
  await waitIdle(s);
  assertNoLeaks(s);
});

test("connections dropped mid-body admit nothing and leave the server serving", async () => {
  const port = Number(new URL(s.url).port);
  for (let i = 0; i < 20; i++) {
    const sock = net.connect(port, "127.0.0.1");
    await new Promise((r) => sock.once("connect", r));
    sock.write(`POST /v1/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n{"model": "tiny", "prompt": "hel`);
    sock.destroy();
  }
  await waitIdle(s);
  assertNoLeaks(s);
  assert.equal((await streamCompletion(s.url, { model: "tiny", prompt: "ok", max_tokens: 2 })).finish, "length");
});

test("a failure injected into one engine step ends that step's requests with a 500-type error; the engine recovers", async () => {
  const engine = (await s.manager.acquire("tiny", "test")).engine;
  const stepsBefore = engine.stats().steps;
  failSteps = 1;
  const a = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: json, body: JSON.stringify({ model: "tiny", prompt: "a", max_tokens: 5 }) });
  assert.equal(a.status, 500);
  const err = (await a.json()) as { error: { type: string; message: string } };
  assert.equal(err.error.type, "server_error");
  assert.match(err.error.message, /request req-/);
  assert.ok(!/at .*\.js/.test(err.error.message), "no stack trace");
  failSteps = 1;
  const b = await streamCompletion(s.url, { model: "tiny", prompt: "b", max_tokens: 5 });
  assert.equal((b.error as { type: string }).type, "server_error", "the stream ends with an error event");
  await waitIdle(s);
  assertNoLeaks(s);
  assert.equal((await streamCompletion(s.url, { model: "tiny", prompt: "after", max_tokens: 4 })).finish, "length");
  assert.equal((await s.manager.acquire("tiny", "test")).engine, engine, "the engine that failed is the one that recovered");
  assert.ok(engine.stats().steps > stepsBefore, "and it ran the later steps");
});

test("KV exhaustion under load: preemption, never failure, outputs identical to an unconstrained run", async () => {
  // 20 blocks of 16 tokens: any one request fits, sixteen at once cannot.
  // The block size in bytes of this host's KV cache type (auto: bf16 where bf16 compute is the default), as `s` has.
  const perBlock = planKv(readModelConfig(fixtureModelDir()), { ...DEFAULT_ENGINE_CONFIG, blockSize: 16 }).bytesPerBlock;
  const tight = await startServer({ engine: { kvCacheMemory: 20 * perBlock, blockSize: 16, maxNumSeqs: 16 } });
  try {
    const prompts = Array.from({ length: 16 }, (_, i) => Array.from({ length: 20 + i * 3 }, (_, j) => 300 + i * 50 + j));
    const run = (url: string): Promise<StreamResult[]> => Promise.all(prompts.map((p) => streamCompletion(url, { model: "tiny", prompt: p, max_tokens: 40, ignore_eos: true, temperature: 0 })));
    const [constrained, free] = [await run(tight.url), await run(s.url)];
    assert.deepEqual(constrained.map((r) => r.text), free.map((r) => r.text));
    for (const r of constrained) assert.equal(r.finish, "length");
    const preemptions = await metric(tight.url, "vllm:num_preemptions_total");
    console.log(`KV exhaustion: ${(await tight.manager.acquire("tiny", "test")).engine.limits.numBlocks} blocks, ${preemptions} preemptions, 16/16 requests identical`);
    assert.ok(preemptions > 0, "the small pool must force preemptions");
    await waitIdle(tight);
    assertNoLeaks(tight);
  } finally {
    await tight.close();
  }
});

/** Mutations of valid bodies: wrong types, huge and non-finite numbers, deep nesting, bad UTF-8, enormous strings, duplicate keys, bad token ids. */
function fuzzBodies(n: number): { body: Buffer; path: string }[] {
  let seed = 7;
  const rand = (): number => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
  const pick = <T>(xs: T[]): T => xs[Math.floor(rand() * xs.length)]!;
  const bases: [string, Record<string, unknown>][] = [
    ["/v1/chat/completions", { model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }],
    ["/v1/completions", { model: "tiny", prompt: "hi", max_tokens: 1 }],
    ["/v1/batch/completions", { model: "tiny", prompt: [1, 2, 3], max_tokens: 1 }],
  ];
  const fields = ["model", "messages", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
    "presence_penalty", "frequency_penalty", "repetition_penalty", "logprobs", "top_logprobs", "stream", "stream_options", "user", "ignore_eos", "echo", "return_token_ids"];
  const values: (() => unknown)[] = [
    () => null, () => true, () => "x", () => -1, () => 0, () => 1e308, () => -1e308, () => 2 ** 53 + 1, () => 1.5, () => [], () => {}, () => ({ a: [1, { b: 2 }] }),
    () => "y".repeat(Math.floor(rand() * 200000)), () => [99999999, -5], () => [[1, 2], "x"], () => [{ role: "user", content: [{ type: "image_url" }] }],
    () => [{ role: "user", content: null }], () => [{ role: "user" }], () => ({ include_usage: "yes" }), () => Array.from({ length: 40 }, () => "s"),
  ];
  const out: { body: Buffer; path: string }[] = [];
  for (let i = 0; i < n; i++) {
    const [p, base] = pick(bases);
    const body: Record<string, unknown> = { ...base };
    for (let m = 0; m < 1 + Math.floor(rand() * 3); m++) body[pick(fields)] = pick(values)();
    let text = JSON.stringify(body);
    const raw = rand();
    if (raw < 0.08) text = text.replace(/"max_tokens":\s*[^,}]+/, `"max_tokens": ${pick(["NaN", "Infinity", "-Infinity", "1e999", "0x10"])}`);
    else if (raw < 0.14) text = "[".repeat(5000 + Math.floor(rand() * 50000)) + "]".repeat(10);
    else if (raw < 0.2) text = text.replace("{", `{"model": "tiny", "model": ${pick(["1", "null", "\"tiny\""])}, `);
    else if (raw < 0.26) text = text.slice(0, Math.floor(rand() * text.length));
    let buf = Buffer.from(text);
    if (rand() < 0.06) buf = Buffer.concat([buf.subarray(0, buf.length >> 1), Buffer.from([0xff, 0xfe, 0xc3]), buf.subarray(buf.length >> 1)]);
    out.push({ body: buf, path: p });
  }
  return out;
}

test("fuzz: 1200 mutated request bodies → never a crash or a 5xx, always an OpenAI error object", async () => {
  const cases = fuzzBodies(1200);
  let errors = 0, ok = 0;
  for (let i = 0; i < cases.length; i += 16) {
    await Promise.all(cases.slice(i, i + 16).map(async ({ body, path: p }) => {
      const res = await fetch(`${s.url}${p}`, { method: "POST", headers: json, body });
      const text = await res.text();
      assert.ok(res.status < 500, `5xx for ${body.subarray(0, 200).toString()}: ${text.slice(0, 200)}`);
      if (res.status >= 400) {
        const e = JSON.parse(text) as { error: { message: string; type: string; code: string } };
        assert.equal(typeof e.error.message, "string");
        assert.equal(typeof e.error.type, "string");
        errors++;
      } else ok++;
    }));
  }
  console.log(`fuzz: ${cases.length} bodies, ${errors} rejected with an OpenAI error, ${ok} served`);
  assert.ok(errors > 600);
  await waitIdle(s);
  assertNoLeaks(s);
});

test("per-key rate limits: requests and tokens per minute → 429 with Retry-After", async () => {
  const limited = await startServer({ rateLimits: { requestsPerMinute: 3, tokensPerMinute: 0 } });
  const tokens = await startServer({ rateLimits: { requestsPerMinute: 0, tokensPerMinute: 30 } });
  try {
    const a = limited.store.create("a", "normal"), b = limited.store.create("b", "normal");
    await new Promise((r) => setTimeout(r, 1100));
    const send = (url: string, key: string | null, maxTokens = 1): Promise<Response> => fetch(`${url}/v1/completions`, {
      method: "POST", headers: { ...json, ...(key ? { authorization: `Bearer ${key}` } : {}) },
      body: JSON.stringify({ model: "tiny", prompt: "hello", max_tokens: maxTokens, ignore_eos: true }),
    });
    for (let i = 0; i < 3; i++) assert.equal((await send(limited.url, a)).status, 200);
    const over = await send(limited.url, a);
    assert.equal(over.status, 429);
    assert.ok(Number(over.headers.get("retry-after")) >= 1);
    assert.equal(((await over.json()) as { error: { code: string } }).error.code, "rate_limit_exceeded");
    assert.equal((await send(limited.url, b)).status, 200, "another key has its own budget");
    const tooBig = await send(tokens.url, null, 40); // 1 + 40 > 30: can never fit
    assert.equal(tooBig.status, 400);
    assert.equal(((await tooBig.json()) as { error: { param: string } }).error.param, "max_tokens");
    assert.equal((await send(tokens.url, null, 20)).status, 200); // reserves 21, uses at most 21
    const t = await send(tokens.url, null, 20); // 21 do not fit the 9 or more left
    assert.equal(t.status, 429);
    assert.ok(Number(t.headers.get("retry-after")) >= 1);
  } finally {
    await limited.close();
    await tokens.close();
  }
});

test("tenant isolation: B's first request with A's cached prompt is as slow as a cold one; A's repeat is fast", async () => {
  const dir = path.join(tempDir(), "small");
  makeModel({ preset: "small", out: dir });
  const t = await startServer({ modelDir: dir, engine: { maxNumBatchedTokens: 2048, kvCacheMemory: 2 ** 28, maxModelLen: 4096 } });
  try {
    const a = t.store.create("tenant-a", "normal"), b = t.store.create("tenant-b", "normal");
    await new Promise((r) => setTimeout(r, 1100));
    const timed = async (key: string, prompt: number[]): Promise<{ ms: number; cached: number }> => {
      const start = performance.now();
      const res = await fetch(`${t.url}/v1/completions`, {
        method: "POST", headers: { ...json, authorization: `Bearer ${key}` }, body: JSON.stringify({ model: "tiny", prompt, max_tokens: 1 }),
      });
      const body = (await res.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } } };
      return { ms: performance.now() - start, cached: body.usage.prompt_tokens_details.cached_tokens };
    };
    await timed(a, [1, 2, 3]); // load the engine
    const rows: { coldA: number; warmA: number; firstB: number }[] = [];
    for (let i = 0; i < 5; i++) {
      const prompt = Array.from({ length: 1500 }, (_, j) => 1000 + i * 2000 + j);
      const coldA = await timed(a, prompt), warmA = await timed(a, prompt), firstB = await timed(b, prompt);
      assert.equal(coldA.cached, 0);
      assert.ok(warmA.cached >= 1400, `A's repeat hit ${warmA.cached} cached tokens`);
      assert.equal(firstB.cached, 0, "B must not hit A's blocks");
      rows.push({ coldA: coldA.ms, warmA: warmA.ms, firstB: firstB.ms });
    }
    // The fastest of five: a busy host only ever adds time (a median over three failed once, cold
    // 258 ms against B's 139, while a build shared the two cores).
    const best = (k: keyof (typeof rows)[number]): number => Math.min(...rows.map((r) => r[k]));
    console.log(`tenant isolation (1500-token prompt, fastest ms of 5): A cold ${best("coldA").toFixed(1)}, A repeat ${best("warmA").toFixed(1)}, B first ${best("firstB").toFixed(1)}`);
    assert.ok(best("warmA") < 0.5 * best("coldA"), "A's repeat should be fast");
    assert.ok(best("firstB") > 0.6 * best("coldA"), "B's first request should be as slow as a cold one");
  } finally {
    await t.close();
  }
});

test("logs never hold API keys or prompt text", async () => {
  const s = await startServer();
  after(() => s.close());
  const key = s.store.create("log-check", "normal");
  await new Promise((r) => setTimeout(r, 1100));
  const secret = "zebra-quartz-prompt-8842";
  await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { ...json, authorization: `Bearer ${key}` }, body: JSON.stringify({ model: "tiny", prompt: secret, max_tokens: 2 }) });
  await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { ...json, authorization: `Bearer ${key}x` }, body: JSON.stringify({ model: "tiny", prompt: secret }) });
  const all = s.logs.join("\n");
  assert.ok(all.includes("log-check"), "the request was logged, by key name");
  assert.ok(!all.includes(secret), "prompt text in the logs");
  assert.ok(!all.includes(key), "API key in the logs");
});
