/**
 * The agent flows of real client libraries against the real server on loopback, with the
 * random-weight tiny-qwen3 model: only constrained decoding can make a random model answer
 * objects a zod schema accepts and tool calls whose arguments fit their schema. Vercel `ai`
 * (generateObject, generateText with tools and toolChoice "required"), LangChain's ChatOpenAI
 * (withStructuredOutput both ways, bindTools with tool_choice "required"), and the openai SDK
 * (tools, streamed and reassembled). The libraries' packages ask for Node 22 or later; these
 * flows run on Node 20 too (checked on 20.20), so they are not skipped there.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { z } from "zod";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateObject, generateText, tool } from "ai";
import { ChatOpenAI } from "@langchain/openai";
import OpenAI from "openai";
import { LengthFinishReasonError } from "openai/core/error";
import { zodFunction } from "openai/helpers/zod";
import { startServer, type TestServer } from "./support/server.js";

const MAX_TOKENS = 120;
// Strings by pattern, not max(): zod counts UTF-16 units, JSON Schema's maxLength (the grammar's) counts characters.
const Weather = z.object({ city: z.string().regex(/^[A-Z][a-z]{0,7}$/), unit: z.enum(["c", "f"]), days: z.number().int().min(1).max(7) });
const Event = z.object({ name: z.string().regex(/^[a-z]{1,8}$/), day: z.enum(["mon", "tue", "wed"]), guests: z.array(z.string().regex(/^[a-z]{1,4}$/)).max(2) });
const Add = z.object({ a: z.number().int().min(0).max(99), b: z.number().int().min(0).max(99) });

let s: TestServer;
before(async () => {
  s = await startServer();
});
after(async () => s.close());

/** Runs `f` for a few seeds; at least `least` of them must finish (the rest hit max_tokens, which a random model may). */
async function seeds(least: number, f: (seed: number) => Promise<boolean>): Promise<void> {
  let finished = 0;
  for (let seed = 1; seed <= 3; seed++) if (await f(seed)) finished++;
  assert.ok(finished >= least, `only ${finished} of 3 finished`);
}

test("Vercel ai: generateObject with a zod schema; generateText with tools and toolChoice required", async () => {
  const model = createOpenAICompatible({ name: "weft", baseURL: `${s.url}/v1`, supportsStructuredOutputs: true })("tiny");
  await seeds(2, async (seed) => {
    try {
      const r = await generateObject({ model, schema: Event, prompt: "An event, please.", maxOutputTokens: MAX_TOKENS, temperature: 1, seed, maxRetries: 0 });
      Event.parse(r.object);
      assert.equal(r.finishReason, "stop");
      return true;
    } catch (e) {
      // A max_tokens cut is the one allowed failure: the library then cannot parse the object.
      assert.match(String((e as { finishReason?: string }).finishReason ?? e), /length/);
      return false;
    }
  });
  const tools = {
    get_weather: tool({ description: "Weather in a city", inputSchema: Weather }),
    add: tool({ description: "Adds two numbers", inputSchema: Add }),
  };
  await seeds(2, async (seed) => {
    // One call per answer: a random model has no reason to stop making parallel calls before max_tokens.
    const r = await generateText({
      model, tools, toolChoice: "required", prompt: "Weather in Paris?", maxOutputTokens: MAX_TOKENS, temperature: 1, seed, maxRetries: 0,
      providerOptions: { weft: { parallel_tool_calls: false } },
    });
    if (r.finishReason === "length") return false;
    assert.equal(r.finishReason, "tool-calls");
    assert.equal(r.toolCalls.length, 1);
    for (const c of r.toolCalls) {
      assert.ok(!c.invalid, `the library refused the call: ${JSON.stringify(c)}`);
      (c.toolName === "add" ? Add : Weather).parse(c.input);
    }
    return true;
  });
  const named = await generateText({
    model, tools, toolChoice: { type: "tool", toolName: "add" }, prompt: "2 + 3?", maxOutputTokens: MAX_TOKENS, temperature: 0, maxRetries: 0,
    providerOptions: { weft: { parallel_tool_calls: false } },
  });
  assert.deepEqual([named.finishReason, named.toolCalls.map((c) => c.toolName)], ["tool-calls", ["add"]]);
  Add.parse(named.toolCalls[0]!.input);
});

test("LangChain ChatOpenAI: withStructuredOutput (JSON schema and function calling) and bindTools with tool_choice required", async () => {
  const chat = (seed: number): ChatOpenAI => new ChatOpenAI({
    model: "tiny", apiKey: "none", configuration: { baseURL: `${s.url}/v1` }, temperature: 1, maxTokens: MAX_TOKENS, maxRetries: 0, modelKwargs: { seed },
  });
  for (const method of ["jsonSchema", "functionCalling"] as const) {
    await seeds(2, async (seed) => {
      const r = await chat(seed).withStructuredOutput(Event, { method, includeRaw: true }).invoke("An event, please.");
      if ((r.raw.response_metadata as { finish_reason?: string }).finish_reason === "length") return false;
      assert.ok(r.parsed, `${method}: nothing parsed from ${JSON.stringify(r.raw.content)}`);
      Event.parse(r.parsed);
      return true;
    });
  }
  const weather = { name: "get_weather", description: "Weather in a city", schema: Weather };
  const add = { name: "add", description: "Adds two numbers", schema: Add };
  await seeds(2, async (seed) => {
    const m = await chat(seed).bindTools([weather, add], { tool_choice: "required", parallel_tool_calls: false }).invoke("Weather in Paris?");
    if (m.response_metadata.finish_reason === "length") return false;
    assert.equal(m.response_metadata.finish_reason, "tool_calls");
    assert.ok((m.tool_calls ?? []).length === 1 && (m.invalid_tool_calls ?? []).length === 0, JSON.stringify(m));
    for (const c of m.tool_calls!) (c.name === "add" ? Add : Weather).parse(c.args);
    return true;
  });
});

test("openai SDK: tools streamed with chat.completions.stream reassemble into the whole answer's calls", async () => {
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none", maxRetries: 0 });
  const tools = [zodFunction({ name: "get_weather", parameters: Weather }), zodFunction({ name: "add", parameters: Add })];
  await seeds(2, async (seed) => {
    const body = {
      model: "tiny", messages: [{ role: "user" as const, content: "Weather in Paris?" }], tools, tool_choice: "required" as const, parallel_tool_calls: false,
      max_tokens: MAX_TOKENS, seed, temperature: 1,
    };
    const stream = client.chat.completions.stream(body);
    let pieces = 0;
    stream.on("tool_calls.function.arguments.delta", () => pieces++);
    let streamed;
    try {
      streamed = await stream.finalChatCompletion();
    } catch (e) {
      // The SDK refuses to parse an answer cut by max_tokens; the whole answer must have been cut too.
      assert.ok(e instanceof LengthFinishReasonError, String(e));
      await assert.rejects(client.chat.completions.parse(body), LengthFinishReasonError);
      return false;
    }
    const whole = await client.chat.completions.parse(body);
    const calls = (r: typeof whole): unknown => (r.choices[0]!.message.tool_calls ?? []).map((c) => c.type === "function" ? [c.function.name, c.function.arguments] : c);
    assert.deepEqual(calls(streamed), calls(whole), "streamed deltas reassemble into the whole answer's calls");
    assert.equal(streamed.choices[0]!.finish_reason, whole.choices[0]!.finish_reason);
    if (whole.choices[0]!.finish_reason !== "tool_calls") return false;
    assert.ok(pieces > 1, `arguments arrive in pieces (${pieces})`);
    assert.equal(whole.choices[0]!.message.tool_calls?.length, 1);
    for (const c of whole.choices[0]!.message.tool_calls ?? []) {
      assert.ok(c.type === "function");
      // parse() validated the arguments with the zod schemas the tools were made from.
      (c.function.name === "add" ? Add : Weather).parse(c.function.parsed_arguments);
    }
    return true;
  });
});
