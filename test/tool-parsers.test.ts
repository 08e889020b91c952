/**
 * The tool-call parsers and the reasoning parser on text in each family's real
 * output format, whole and streamed in every split: a streamed answer must
 * reassemble into exactly the whole one.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { ChatOutput, type ChatAnswer, type ChatOutputSpec, type ToolCall } from "../src/server/chat-output.js";
import { ThinkSplitter } from "../src/server/reasoning-parser.js";
import { detectToolParser, hermes, llama3Json, mistral, type ToolParser } from "../src/server/tool-parsers.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { tokenizerPackageDir } from "./helpers.js";

const spec = (parser: ToolParser | null, reasoning = false, named: string | null = null, parallel = true): ChatOutputSpec => ({
  reasoning: reasoning ? { promptOpensThink: false } : null,
  tools: parser ? { parser, named, parallel } : null,
});

const calls = (p: ChatAnswer): { name: string; arguments: unknown }[] => p.toolCalls.map((c) => ({ name: c.function.name, arguments: JSON.parse(c.function.arguments) }));

/**
 * Pushes `text` in pieces of `size` characters and reassembles the answer from the pieces as a
 * client does, checking OpenAI's delta shape: a call's first delta has its index, id, type and
 * name with empty arguments; later ones only add arguments. Also returns how many argument
 * pieces came before the end.
 */
function streamed(s: ChatOutputSpec, text: string, size: number, cut = false): ChatAnswer & { earlyArgs: number; calls: readonly ToolCall[] } {
  const out = new ChatOutput(s);
  const all: ChatAnswer & { earlyArgs: number } = { reasoning: "", content: "", toolCalls: [], earlyArgs: 0 };
  const take = (p: ReturnType<ChatOutput["push"]>, early: boolean): void => {
    all.reasoning += p.reasoning;
    all.content += p.content;
    for (const d of p.toolCalls) {
      const call: ToolCall | undefined = all.toolCalls[d.index];
      if (!call) {
        assert.equal(d.index, all.toolCalls.length, "calls open in order");
        assert.ok(d.id && d.type === "function" && d.function.name && d.function.arguments === "", `opening delta ${JSON.stringify(d)}`);
        all.toolCalls.push({ id: d.id, type: "function", function: { name: d.function.name, arguments: "" } });
      } else {
        assert.ok(d.id === undefined && d.function.name === undefined && d.function.arguments !== "", `argument delta ${JSON.stringify(d)}`);
        call.function.arguments += d.function.arguments;
        if (early) all.earlyArgs++;
      }
    }
  };
  for (let i = 0; i < text.length; i += size) take(out.push(text.slice(i, i + size)), true);
  take(out.finish(cut), false);
  return { ...all, calls: out.calls };
}

/**
 * Whole and streamed (every piece size from 1 to 7) agree exactly, call text included; returns the
 * whole answer. `streamsArgs`: calls written name first have their arguments sent in pieces.
 */
function parseAll(s: ChatOutputSpec, text: string, streamsArgs = true): ChatAnswer {
  const whole = ChatOutput.parse(s, text);
  for (let size = 1; size <= 7; size++) {
    const st = streamed(s, text, size);
    assert.equal(st.reasoning, whole.reasoning, `reasoning, pieces of ${size}`);
    assert.equal(st.content, whole.content, `content, pieces of ${size}`);
    assert.deepEqual(st.toolCalls.map((c) => c.function), whole.toolCalls.map((c) => c.function), `calls, pieces of ${size}`);
    assert.deepEqual(st.toolCalls, st.calls, "the streamed calls are the answer's calls, ids included");
    if (streamsArgs && whole.toolCalls.length > 0 && size < 4) assert.ok(st.earlyArgs > 1, `arguments stream in pieces (${st.earlyArgs}), pieces of ${size}`);
  }
  return whole;
}

// Recorded outputs in each family's format (Qwen2.5/Qwen3 hermes, Llama 3.1 / 3.2 JSON, Mistral v3 and v11 tokenizers).
const QWEN_TWO_CALLS = "<tool_call>\n{\"name\": \"get_current_temperature\", \"arguments\": {\"location\": \"San Francisco, CA, USA\"}}\n</tool_call>\n" +
  "<tool_call>\n{\"name\": \"get_temperature_date\", \"arguments\": {\"location\": \"San Francisco, CA, USA\", \"date\": \"2024-10-01\"}}\n</tool_call>";
const QWEN3_THINK_CALL = "<think>\nThe user wants the weather in Paris, so I should call get_weather.\n</think>\n\n" +
  "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
const LLAMA31 = "<|python_tag|>{\"name\": \"get_current_conditions\", \"parameters\": {\"location\": \"San Francisco, CA\", \"unit\": \"Fahrenheit\"}}";
const LLAMA32 = "{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"Europe/Paris\"}}";
const MISTRAL_V3 = "[TOOL_CALLS] [{\"name\": \"get_current_weather\", \"arguments\": {\"location\": \"Paris, France\", \"format\": \"celsius\"}}]";
const MISTRAL_V11 = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}";

test("hermes (Qwen2.5/Qwen3): parallel calls, arguments as JSON strings, no content", () => {
  const p = parseAll(spec(hermes), QWEN_TWO_CALLS);
  assert.deepEqual(calls(p), [
    { name: "get_current_temperature", arguments: { location: "San Francisco, CA, USA" } },
    { name: "get_temperature_date", arguments: { location: "San Francisco, CA, USA", date: "2024-10-01" } },
  ]);
  assert.equal(p.content, "");
  for (const c of p.toolCalls) assert.match(c.id, /^call_[0-9a-f]{24}$/);
});

test("hermes: text before a call is content; a missing closing tag at EOS still parses; parallel_tool_calls false keeps the first", () => {
  const p = parseAll(spec(hermes), "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}");
  assert.equal(p.content, "Let me check.\n");
  assert.deepEqual(calls(p), [{ name: "f", arguments: { x: 1 } }]);
  assert.equal(parseAll(spec(hermes, false, null, false), QWEN_TWO_CALLS).toolCalls.length, 1);
});

test("hermes: malformed or cut-off calls stay text, and a call to another function than the named one is not a call", () => {
  for (const bad of ["<tool_call>\n{\"arguments\": {}}\n</tool_call>", "<tool_call>\nnot json\n</tool_call>",
    "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>"]) {
    const p = parseAll(spec(hermes), `Hi ${bad}`);
    assert.equal(p.toolCalls.length, 0, bad);
    assert.equal(p.content, `Hi ${bad}`, "the model's text is returned as it is");
  }
  // Cut off by max_tokens, the call read so far is the answer's, unfinished (as OpenAI's are), whole and streamed alike;
  // the same text ended by the model is malformed: whole, it is content.
  const cut = "Hi <tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1";
  assert.deepEqual(ChatOutput.parse(spec(hermes), cut), { reasoning: "", content: cut, toolCalls: [] });
  const whole = ChatOutput.parse(spec(hermes), cut, true);
  assert.deepEqual([whole.content, whole.toolCalls.map((c) => c.function)], ["Hi ", [{ name: "f", arguments: "{\"x\":1" }]]);
  for (let size = 1; size <= 7; size++) {
    const st = streamed(spec(hermes), cut, size, true);
    assert.deepEqual([st.content, st.toolCalls.map((c) => c.function)], ["Hi ", [{ name: "f", arguments: "{\"x\":1" }]]);
  }
  const named = parseAll(spec(hermes, false, "other"), QWEN_TWO_CALLS);
  assert.equal(named.toolCalls.length, 0);
  assert.equal(named.content, QWEN_TWO_CALLS);
  assert.equal(parseAll(spec(hermes, false, "get_weather"), QWEN3_THINK_CALL.split("</think>\n\n")[1]!).toolCalls.length, 1);
});

test("arguments are the model's JSON text without whitespace outside strings, streamed and whole alike", () => {
  const text = "<tool_call>\n{\"name\": \"f\", \"arguments\": { \"x\" : 1.0, \"s\": \"a b\\\" }\" ,\"e\": \"\\u00e9\" }}\n</tool_call>";
  const p = parseAll(spec(hermes), text);
  assert.equal(p.toolCalls[0]!.function.arguments, "{\"x\":1.0,\"s\":\"a b\\\" }\",\"e\":\"\\u00e9\"}");
  assert.deepEqual(JSON.parse(p.toolCalls[0]!.function.arguments), { x: 1, s: "a b\" }", e: "é" });
  const two = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}; {\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}";
  assert.deepEqual(calls(parseAll(spec(llama3Json), two)), [{ name: "get_weather", arguments: { city: "Paris" } }, { name: "get_time", arguments: { tz: "CET" } }]);
});

test("plain text with a '<' is not held back forever and is never a call", () => {
  const text = "a < b and <tool is not <tool_call";
  const p = parseAll(spec(hermes), text);
  assert.equal(p.content, text);
  assert.equal(p.toolCalls.length, 0);
});

test("Qwen3: reasoning, then a tool call", () => {
  const p = parseAll(spec(hermes, true), QWEN3_THINK_CALL);
  assert.equal(p.reasoning, "\nThe user wants the weather in Paris, so I should call get_weather.\n");
  assert.equal(p.content, "", "whitespace before the calls is no content, streamed or not");
  assert.deepEqual(calls(p), [{ name: "get_weather", arguments: { city: "Paris", unit: "celsius" } }]);
  assert.equal(parseAll(spec(hermes, true), "<think>\nhm\n</think>\n\n").content, "\n\n", "whitespace alone is the content");
});

test("llama3_json (Llama 3.1 with <|python_tag|>, Llama 3.2 plain, several calls split by ';')", () => {
  assert.deepEqual(calls(parseAll(spec(llama3Json), LLAMA31)), [{ name: "get_current_conditions", arguments: { location: "San Francisco, CA", unit: "Fahrenheit" } }]);
  // The first call here has "type" before "name": it and the calls after it are sent whole, at the end.
  assert.deepEqual(calls(parseAll(spec(llama3Json), LLAMA32, false)), [
    { name: "get_weather", arguments: { city: "Paris" } }, { name: "get_time", arguments: { tz: "Europe/Paris" } }]);
  const prose = parseAll(spec(llama3Json), "The weather is {sunny}.");
  assert.equal(prose.content, "The weather is {sunny}.");
  const notCall = parseAll(spec(llama3Json), "{\"answer\": 42}");
  assert.equal(notCall.toolCalls.length, 0, "a JSON answer without a name is not a call");
  assert.equal(notCall.content, "{\"answer\": 42}");
});

test("mistral: [TOOL_CALLS] with a JSON list (v3) and name[ARGS]{…} (v11); ids are 9 alphanumerics", () => {
  const v3 = parseAll(spec(mistral), `Sure. ${MISTRAL_V3}`);
  assert.equal(v3.content, "Sure. ");
  assert.deepEqual(calls(v3), [{ name: "get_current_weather", arguments: { location: "Paris, France", format: "celsius" } }]);
  assert.match(v3.toolCalls[0]!.id, /^[A-Za-z0-9]{9}$/);
  assert.deepEqual(calls(parseAll(spec(mistral), MISTRAL_V11)), [{ name: "get_weather", arguments: { city: "Paris" } }, { name: "get_time", arguments: { tz: "CET" } }]);
  assert.equal(mistral.needsSpecialTokens, true);
});

test("reasoning parser: think blocks split off; no think block is all content; an unclosed one is all reasoning", () => {
  const s = spec(null, true);
  assert.deepEqual(parseAll(s, "<think>\nhmm\n</think>\n\nThe answer is 4."), { reasoning: "\nhmm\n", content: "\n\nThe answer is 4.", toolCalls: [] });
  assert.deepEqual(parseAll(s, "The answer is 4."), { reasoning: "", content: "The answer is 4.", toolCalls: [] });
  assert.deepEqual(parseAll(s, "<think>\nstill thinking"), { reasoning: "\nstill thinking", content: "", toolCalls: [] });
  assert.deepEqual(parseAll(s, "<thin"), { reasoning: "", content: "<thin", toolCalls: [] });
  const forced = new ThinkSplitter(true);
  assert.deepEqual(forced.push("abc</think>done"), { reasoning: "abc", content: "done" });
});

test("the parser is chosen from the chat template: Qwen3's is hermes; a template without tools has none", () => {
  const qwen = TextTokenizer.fromDir(tokenizerPackageDir("qwen3"));
  assert.equal(detectToolParser(qwen.chatTemplate!)?.name, "hermes");
  const llama = TextTokenizer.fromDir(tokenizerPackageDir("llama3_1"));
  assert.equal(detectToolParser(llama.chatTemplate!), null);
  assert.equal(detectToolParser("{{- '[TOOL_CALLS]' + tool_calls|tojson }}")?.name, "mistral");
  assert.equal(detectToolParser("{%- if tools %}{{- '<|python_tag|>' }}{% endif %}")?.name, "llama3_json");
});
