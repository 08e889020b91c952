/**
 * Prompt log-probs (completions' echo with logprobs, vLLM's prompt_logprobs) against
 * transformers' float32 logits, through the real server, with prefill split in chunks
 * and prefix caching on; echo without log-probs, with max_tokens 0, and streamed.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readReference, readReferenceLogits } from "./helpers.js";
import { startServer, type TestServer } from "./support/server.js";

let s: TestServer;
before(async () => {
  // 8 tokens a step: the 33-token reference prompt is computed in five chunks.
  s = await startServer({ engine: { dtype: "float32", maxNumBatchedTokens: 8 } });
});
after(async () => s.close());

type Json = Record<string, unknown>;
interface Legacy { tokens: string[]; token_logprobs: (number | null)[]; top_logprobs: (Record<string, number> | null)[]; text_offset: number[] }
type PromptEntry = Record<string, { logprob: number; rank: number; decoded_token: string }> | null;

async function post(body: Json): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "tiny", ...body }) });
  return { status: res.status, json: (await res.json()) as Json };
}

function firstChoice(json: Json): Json {
  return (json.choices as Json[])[0]!;
}

/** log-softmax of one row of reference logits, in float64. */
function logSoftmax(row: Float32Array): Float64Array {
  let max = -Infinity;
  for (const v of row) max = Math.max(max, v);
  let sum = 0;
  for (const v of row) sum += Math.exp(v - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(row, (v) => v - lse);
}

/** The ids of the n largest values, largest first. */
function topIds(v: Float64Array, n: number): number[] {
  const best: number[] = [];
  v.forEach((x, id) => {
    if (best.length === n && x <= v[best[n - 1]!]!) return;
    const at = best.findIndex((b) => x > v[b]!);
    best.splice(at === -1 ? best.length : at, 0, id);
    best.length = Math.min(best.length, n);
  });
  return best;
}

test("echo + logprobs and prompt_logprobs equal log-softmax of transformers' logits at every reference position, across prefill chunks", async () => {
  const refs = readReference("tiny-qwen3");
  const logits = readReferenceLogits("tiny-qwen3");
  const N = 5;
  let maxErr = 0;
  for (const [i, ref] of refs.entries()) {
    const ids = ref.input_ids;
    const expected = logits.get(`logits_${i}`)!;
    const positions = logits.get(`positions_${i}`)!.data as BigInt64Array;
    const V = expected.shape[1]!;
    // Twice: the second run finds the prompt's blocks in the prefix cache and must score them all the same.
    for (const run of [0, 1]) {
      const { status, json } = await post({ prompt: ids, echo: true, logprobs: N, prompt_logprobs: N, max_tokens: 0 });
      assert.equal(status, 200, JSON.stringify(json));
      const lp = firstChoice(json).logprobs as Legacy;
      const pl = firstChoice(json).prompt_logprobs as PromptEntry[];
      assert.equal(lp.tokens.length, ids.length);
      assert.equal(lp.token_logprobs[0], null);
      assert.equal(lp.top_logprobs[0], null);
      assert.equal(pl.length, ids.length);
      assert.equal(pl[0], null);
      assert.equal((json.usage as Json).completion_tokens, 0);
      if (run === 1) assert.equal(((json.usage as Json).prompt_tokens_details as Json).cached_tokens, 0, "a scored prompt takes no prefix-cache hit");
      positions.forEach((p64, j) => {
        const p = Number(p64);
        if (p + 1 >= ids.length) return; // the last position's logits predict a generated token
        const want = logSoftmax(expected.data.subarray(j * V, (j + 1) * V) as Float32Array);
        const target = ids[p + 1]!;
        const got = lp.token_logprobs[p + 1]!;
        maxErr = Math.max(maxErr, Math.abs(got - want[target]!));
        const entry = pl[p + 1]!;
        assert.equal(entry[String(target)]!.logprob, got);
        // Its rank, and the top N, against the reference (ids whose log-probs are within noise of a neighbour may swap).
        const above = want.reduce((n, v) => n + (v > want[target]! + 1e-4 ? 1 : 0), 0);
        const within = want.reduce((n, v) => n + (Math.abs(v - want[target]!) <= 1e-4 ? 1 : 0), 0);
        const rank = entry[String(target)]!.rank;
        assert.ok(rank >= above + 1 && rank <= above + within, `rank ${rank} at position ${p + 1}`);
        const order = topIds(want, N);
        const tops = Object.entries(entry).filter(([, e]) => e.rank <= N).sort((a, b) => a[1].rank - b[1].rank);
        assert.ok(tops.length >= N - 1);
        tops.forEach(([id, e], k) => {
          maxErr = Math.max(maxErr, Math.abs(e.logprob - want[Number(id)]!));
          assert.ok(Math.abs(e.logprob - want[order[k]!]!) < 1e-4, `top ${k} at position ${p + 1}`);
        });
        const legacyTop = Object.values(lp.top_logprobs[p + 1]!).sort((a, b) => b - a);
        assert.equal(legacyTop.length, N);
        legacyTop.forEach((v, k) => assert.ok(Math.abs(v - want[order[k]!]!) < 1e-4));
      });
    }
  }
  console.log(`tiny-qwen3 prompt log-probs: max |Δ| against transformers = ${maxErr.toExponential(3)}`);
  assert.ok(maxErr < 1e-4, `prompt log-prob error ${maxErr}`);
});

test("echo: the text starts with the prompt; log-probs cover prompt then generated tokens with running text offsets", async () => {
  const prompt = "Once upon a time";
  const plain = await post({ prompt, echo: true, max_tokens: 4, temperature: 0 });
  assert.equal(plain.status, 200);
  const text = firstChoice(plain.json).text as string;
  assert.ok(text.startsWith(prompt));
  assert.equal(firstChoice(plain.json).logprobs, null);

  const { json } = await post({ prompt, echo: true, max_tokens: 4, temperature: 0, logprobs: 2 });
  assert.equal(firstChoice(json).text, text);
  const lp = firstChoice(json).logprobs as Legacy;
  const promptTokens = (json.usage as Json).prompt_tokens as number;
  assert.equal(lp.tokens.length, promptTokens + 4);
  assert.equal(lp.token_logprobs.filter((v) => v === null).length, 1);
  assert.ok(lp.token_logprobs.slice(1).every((v) => v !== null && v <= 0));
  assert.equal(lp.tokens.slice(0, promptTokens).join(""), prompt);
  lp.text_offset.forEach((o, k) => assert.equal(o, lp.tokens.slice(0, k).join("").length));
  // The generated part is what a request without echo returns.
  const { json: bare } = await post({ prompt, max_tokens: 4, temperature: 0, logprobs: 2 });
  assert.deepEqual((firstChoice(bare).logprobs as Legacy).token_logprobs, lp.token_logprobs.slice(promptTokens));
});

test("echo with max_tokens 0 returns just the prompt; max_tokens 0 without echo is a 400", async () => {
  const { status, json } = await post({ prompt: "The quick brown fox", echo: true, max_tokens: 0 });
  assert.equal(status, 200);
  assert.equal(firstChoice(json).text, "The quick brown fox");
  assert.equal(firstChoice(json).finish_reason, "length");
  assert.equal((json.usage as Json).completion_tokens, 0);
  const bad = await post({ prompt: "The quick brown fox", max_tokens: 0 });
  assert.equal(bad.status, 400);
  assert.equal((bad.json.error as Json).param, "max_tokens");
  const streamed = await post({ prompt: "x", prompt_logprobs: 1, stream: true });
  assert.equal(streamed.status, 400);
  assert.equal((streamed.json.error as Json).param, "prompt_logprobs");
});

test("streamed echo with logprobs: the first chunk carries the prompt and its log-probs; the whole equals the non-streamed answer", async () => {
  const body = { prompt: "Hello there, my friend", echo: true, max_tokens: 5, temperature: 0, logprobs: 3 };
  const { json: whole } = await post(body);
  const res = await fetch(`${s.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ model: "tiny", ...body, stream: true }) });
  const events = (await res.text()).split("\n\n").filter((e) => e.startsWith("data: {")).map((e) => JSON.parse(e.slice(6)) as Json);
  const choices = events.map((e) => (e.choices as Json[])[0]).filter((c): c is Json => c !== undefined);
  let text = "";
  const merged: Legacy = { tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for (const c of choices) {
    text += c.text as string;
    const lp = c.logprobs as Legacy | null;
    if (!lp) continue;
    merged.tokens.push(...lp.tokens);
    merged.token_logprobs.push(...lp.token_logprobs);
    merged.top_logprobs.push(...lp.top_logprobs);
    merged.text_offset.push(...lp.text_offset);
  }
  assert.ok((choices[0]!.text as string).startsWith("Hello there, my friend"));
  assert.equal((choices[0]!.logprobs as Legacy).token_logprobs[0], null);
  assert.equal(text, firstChoice(whole).text);
  assert.deepEqual(merged, firstChoice(whole).logprobs);
});

test("chat: prompt_logprobs covers the templated prompt, on the response", async () => {
  const res = await fetch(`${s.url}/v1/chat/completions`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 2, prompt_logprobs: 1 }),
  });
  const json = (await res.json()) as Json;
  assert.equal(res.status, 200);
  const pl = json.prompt_logprobs as PromptEntry[];
  assert.equal(pl.length, (json.usage as Json).prompt_tokens);
  assert.equal(pl[0], null);
  for (const entry of pl.slice(1)) {
    const ranks = Object.values(entry!).map((e) => e.rank);
    assert.ok(ranks.includes(1) && ranks.length <= 2 && Object.values(entry!).every((e) => e.logprob <= 0));
  }
});
