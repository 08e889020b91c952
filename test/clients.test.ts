/**
 * Third-party clients against the real server with auth on: Vercel `ai` through its OpenAI-compatible
 * provider, and LangChain's ChatOpenAI. Greedy decoding makes every client's text comparable with
 * the server's own answer over raw HTTP.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { APICallError, generateText, streamText, type LanguageModel } from "ai";
import { AIMessageChunk } from "@langchain/core/messages";
import { ChatOpenAI } from "@langchain/openai";
import { startServer, type TestServer } from "./support/server.js";

const PROMPT = "Tell me a story about a cat.";
const MAX_TOKENS = 16;

interface RawAnswer {
  content: string;
  finishReason: string;
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number };
}

let s: TestServer;
let key: string;
let reference: RawAnswer;
let stop: string;

before(async () => {
  s = await startServer();
  key = s.store.create("clients", "normal");
  await authOn();
  reference = await raw();
  assert.equal(reference.finishReason, "length");
  // A stop string from the middle of the greedy text, so the same request ends on it.
  const mid = Math.floor(reference.content.length / 2);
  stop = reference.content.slice(mid, mid + 3);
  assert.ok(stop.trim().length > 0, `need a stop string inside ${JSON.stringify(reference.content)}`);
});
after(async () => s.close());

/** Waits for the authenticator's next read of the key table (once a second). */
async function authOn(): Promise<void> {
  for (const start = Date.now(); Date.now() - start < 5000; await new Promise((r) => setTimeout(r, 50))) {
    if ((await fetch(`${s.url}/v1/models`)).status === 401) return;
  }
  assert.fail("auth did not turn on within 5 s of creating a key");
}

/** The server's own greedy answer over raw HTTP. */
async function raw(stopAt?: string): Promise<RawAnswer> {
  const res = await fetch(`${s.url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model: "tiny", messages: [{ role: "user", content: PROMPT }], max_tokens: MAX_TOKENS, temperature: 0,
      ...(stopAt ? { stop: [stopAt] } : {}),
    }),
  });
  assert.equal(res.status, 200);
  const body = (await res.json()) as { choices: { message: { content: string }; finish_reason: string }[]; usage: RawAnswer["usage"] };
  const choice = body.choices[0]!;
  return { content: choice.message.content, finishReason: choice.finish_reason, usage: body.usage };
}

function aiModel(apiKey: string): LanguageModel {
  return createOpenAICompatible({ name: "weft", baseURL: `${s.url}/v1`, apiKey, includeUsage: true })("tiny");
}

function chatOpenAI(apiKey: string): ChatOpenAI {
  return new ChatOpenAI({ model: "tiny", apiKey, configuration: { baseURL: `${s.url}/v1` }, temperature: 0, maxTokens: MAX_TOKENS, maxRetries: 0 });
}

test("ai generateText: the server's text, usage and finish reasons ('length', then 'stop' on a stop sequence)", async () => {
  const r = await generateText({ model: aiModel(key), prompt: PROMPT, maxOutputTokens: MAX_TOKENS, temperature: 0, maxRetries: 0 });
  assert.ok(reference.content.length > 0);
  assert.equal(r.text, reference.content);
  assert.equal(r.finishReason, "length");
  assert.equal(r.rawFinishReason, reference.finishReason);
  assert.equal(r.usage.inputTokens, reference.usage.prompt_tokens);
  assert.ok(r.usage.inputTokens! > 0);
  assert.equal(r.usage.outputTokens, MAX_TOKENS);
  assert.equal(r.usage.totalTokens, r.usage.inputTokens! + MAX_TOKENS);

  const cut = await generateText({ model: aiModel(key), prompt: PROMPT, maxOutputTokens: MAX_TOKENS, temperature: 0, maxRetries: 0, stopSequences: [stop] });
  assert.equal(cut.text, reference.content.slice(0, reference.content.indexOf(stop)));
  assert.equal(cut.finishReason, "stop");
  assert.equal(cut.usage.outputTokens, (await raw(stop)).usage.completion_tokens);
  assert.ok(cut.usage.outputTokens! > 0 && cut.usage.outputTokens! < MAX_TOKENS);
});

test("ai streamText: streamed deltas join to the server's text; usage and finish reason arrive with the stream", async () => {
  const r = streamText({ model: aiModel(key), prompt: PROMPT, maxOutputTokens: MAX_TOKENS, temperature: 0, maxRetries: 0 });
  const deltas: string[] = [];
  for await (const delta of r.textStream) deltas.push(delta);
  assert.equal(deltas.join(""), reference.content);
  assert.ok(deltas.length > 1 && deltas.length <= MAX_TOKENS, `${deltas.length} deltas for ${MAX_TOKENS} tokens`);
  assert.equal(await r.finishReason, "length");
  const usage = await r.usage;
  assert.equal(usage.inputTokens, reference.usage.prompt_tokens);
  assert.equal(usage.outputTokens, MAX_TOKENS);
  assert.equal(usage.totalTokens, reference.usage.total_tokens);
});

test("LangChain ChatOpenAI invoke: the server's text, usage metadata and finish reason", async () => {
  const m = await chatOpenAI(key).invoke(PROMPT);
  assert.equal(m.content, reference.content);
  assert.equal(m.response_metadata.finish_reason, reference.finishReason);
  assert.deepEqual(
    [m.usage_metadata?.input_tokens, m.usage_metadata?.output_tokens, m.usage_metadata?.total_tokens],
    [reference.usage.prompt_tokens, MAX_TOKENS, reference.usage.total_tokens],
  );
  const cut = await chatOpenAI(key).invoke(PROMPT, { stop: [stop] });
  assert.equal(cut.content, reference.content.slice(0, reference.content.indexOf(stop)));
  assert.equal(cut.response_metadata.finish_reason, "stop");
});

test("LangChain ChatOpenAI stream: chunks join to the server's text; usage comes once, with the stream", async () => {
  const chunks: AIMessageChunk[] = [];
  for await (const c of await chatOpenAI(key).stream(PROMPT)) chunks.push(c);
  const whole = chunks.reduce((a, c) => a.concat(c));
  assert.equal(whole.content, reference.content);
  assert.ok(chunks.filter((c) => c.content !== "").length > 1, "content arrives in more than one chunk");
  assert.equal(chunks.filter((c) => c.usage_metadata).length, 1);
  assert.equal(whole.usage_metadata?.input_tokens, reference.usage.prompt_tokens);
  assert.equal(whole.usage_metadata?.output_tokens, MAX_TOKENS);
  assert.equal(whole.usage_metadata?.total_tokens, reference.usage.total_tokens);
  assert.equal(whole.response_metadata.finish_reason, "length");
});

test("a wrong key is an authentication error (401, not retryable) through each client", async () => {
  const isAuthError = (e: unknown): boolean => {
    assert.ok(APICallError.isInstance(e), `not an APICallError: ${String(e)}`);
    assert.equal(e.statusCode, 401);
    assert.equal(e.isRetryable, false);
    assert.equal((JSON.parse(e.responseBody!) as { error: { type: string } }).error.type, "authentication_error");
    return true;
  };
  await assert.rejects(generateText({ model: aiModel("weft-wrong"), prompt: PROMPT, maxOutputTokens: 2, maxRetries: 0 }), isAuthError);

  const streamErrors: unknown[] = [];
  const r = streamText({ model: aiModel("weft-wrong"), prompt: PROMPT, maxOutputTokens: 2, maxRetries: 0, onError: ({ error }) => void streamErrors.push(error) });
  let text = "";
  for await (const delta of r.textStream) text += delta;
  assert.equal(text, "");
  assert.equal(streamErrors.length, 1);
  isAuthError(streamErrors[0]);

  const langchain = (e: unknown): boolean => {
    const err = e as { status?: number; lc_error_code?: string };
    assert.equal(err.status, 401);
    assert.equal(err.lc_error_code, "MODEL_AUTHENTICATION");
    return true;
  };
  await assert.rejects(chatOpenAI("weft-wrong").invoke(PROMPT), langchain);
  await assert.rejects(async () => {
    for await (const chunk of await chatOpenAI("weft-wrong").stream(PROMPT)) assert.fail(`a chunk despite the wrong key: ${String(chunk.content)}`);
  }, langchain);
});
