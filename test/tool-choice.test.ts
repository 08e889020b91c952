/**
 * tool_choice "required" and a named function, enforced by constrained decoding, on the real
 * server with random-weight models (tiny-qwen3 with its own template and the hermes format;
 * tiny-llama with Llama 3.1-style and Mistral-style templates and their formats): only the grammar
 * can make them call a function with arguments valid against its parameters (checked by ajv),
 * greedy and sampled, whole and streamed. Streamed tool-call deltas must have OpenAI's shape and
 * reassemble into exactly the whole answer. Also: one bounded think block when thinking is asked
 * for, and tool_choice "none" never gives tool_calls.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { grammarCompiler } from "../src/engine/grammar.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { DEFAULT_CHAT_SETTINGS } from "../src/server/chat-settings.js";
import { completeFixtureModel } from "./helpers.js";
import { fixtureModelDir, startServer, type TestServer } from "./support/server.js";

type Json = Record<string, unknown>;

const TOOLS = [
  {
    type: "function",
    function: {
      name: "get_weather", description: "Weather in a city",
      parameters: {
        type: "object",
        properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] }, days: { type: "integer", minimum: 1, maximum: 7 } },
        required: ["city", "unit"], additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "add", description: "Adds two numbers",
      parameters: { type: "object", properties: { a: { type: "integer", minimum: 0, maximum: 99 }, b: { type: "integer", minimum: 0, maximum: 99 } }, required: ["a", "b"] },
    },
  },
  { type: "function", function: { name: "now", description: "The time; takes nothing" } },
];
const ajv = new Ajv({ strict: false });
const VALID = new Map(TOOLS.map((t) => [t.function.name, ajv.compile((t.function as Json).parameters ?? { type: "object", maxProperties: 0 })]));

const THINK_BOUND = 12;
const LLAMA_TEMPLATE = "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nCall a function: {\"name\": name, \"parameters\": {...}}.\n" +
  "{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|eot_id|>{% endif %}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}" +
  "<|start_header_id|>assistant<|end_header_id|>\n\n";
const MISTRAL_TEMPLATE = "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}";

/** One server per tool-call format, serving "tiny": tiny-qwen3 with its own template (hermes), tiny-llama with the templates above. */
const servers: Record<string, TestServer> = {};
before(async () => {
  const llama = completeFixtureModel("tiny-llama");
  servers.hermes = await startServer({ chat: { ...DEFAULT_CHAT_SETTINGS, maxThinkTokens: THINK_BOUND } });
  for (const [parser, template] of [["llama3_json", LLAMA_TEMPLATE], ["mistral", MISTRAL_TEMPLATE]] as const) {
    servers[parser] = await startServer({ modelDir: llama, chat: { ...DEFAULT_CHAT_SETTINGS, chatTemplate: template, toolCallParser: parser } });
  }
});
after(async () => {
  for (const s of Object.values(servers)) await s.close();
});

async function post(s: TestServer, body: Json): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${s.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Json };
}

interface Call { id: string; type: string; function: { name: string; arguments: string } }
interface Answer { content: string | null; reasoning: string | null; calls: Call[]; finish: string | null; argPieces: number }

function wholeAnswers(json: Json): Answer[] {
  const choices = json.choices as { message: { content: string | null; reasoning_content?: string | null; tool_calls?: Call[] }; finish_reason: string }[];
  return choices.map((c) => ({ content: c.message.content, reasoning: c.message.reasoning_content ?? null, calls: c.message.tool_calls ?? [], finish: c.finish_reason, argPieces: 0 }));
}

interface CallDelta { index: number; id?: string; type?: string; function?: { name?: string; arguments?: string } }

/** A streamed request's answers, reassembled from the deltas as a client does; OpenAI's delta shape is checked on the way. */
async function streamedAnswers(s: TestServer, body: Json): Promise<Answer[]> {
  const res = await fetch(`${s.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  assert.equal(res.status, 200);
  const out: Answer[] = [];
  for (const line of (await res.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: { index: number; delta: { content?: string; reasoning_content?: string; tool_calls?: CallDelta[] }; finish_reason: string | null }[] };
    for (const c of chunk.choices) {
      const a = (out[c.index] ??= { content: null, reasoning: null, calls: [], finish: null, argPieces: 0 });
      if (c.delta.content) a.content = (a.content ?? "") + c.delta.content;
      if (c.delta.reasoning_content) a.reasoning = (a.reasoning ?? "") + c.delta.reasoning_content;
      for (const d of c.delta.tool_calls ?? []) {
        const call = a.calls[d.index];
        if (!call) {
          assert.equal(d.index, a.calls.length, "calls open in order");
          assert.ok(d.id && d.type === "function" && d.function?.name && d.function.arguments === "", `a call's first delta: ${JSON.stringify(d)}`);
          a.calls.push({ id: d.id, type: "function", function: { name: d.function.name, arguments: "" } });
        } else {
          assert.ok(d.id === undefined && d.function?.name === undefined && d.function?.arguments, `an arguments delta: ${JSON.stringify(d)}`);
          call.function.arguments += d.function.arguments;
          a.argPieces++;
        }
      }
      if (c.finish_reason) a.finish = c.finish_reason;
    }
  }
  return out;
}

/**
 * Every answer is calls only, each finished one to an allowed function with valid arguments; an
 * answer cut by max_tokens ends with an unfinished call. Parallel calls may go on to max_tokens
 * (a random model has no reason to stop), but each answer has a valid call; single calls mostly finish.
 */
function checkCalls(label: string, answers: Answer[], allowed: string[], parallel: boolean): void {
  for (const a of answers) {
    assert.ok(a.finish === "tool_calls" || a.finish === "length", `${label}: finish_reason ${a.finish}`);
    assert.ok(a.calls.length >= 1 && (parallel || a.calls.length === 1), `${label}: ${a.calls.length} calls: ${JSON.stringify(a)}`);
    assert.equal(a.content, null, `${label}: content beside the calls`);
    const finished = a.finish === "tool_calls" ? a.calls : a.calls.slice(0, -1);
    if (parallel) assert.ok(finished.length >= 1, `${label}: no finished call: ${JSON.stringify(a)}`);
    for (const c of finished) {
      assert.ok(allowed.includes(c.function.name), `${label}: call to ${c.function.name}`);
      const args = JSON.parse(c.function.arguments) as unknown;
      assert.ok(VALID.get(c.function.name)!(args), `${label}: ${c.function.name}(${c.function.arguments}) against its parameters`);
    }
  }
  const done = answers.filter((a) => a.finish === "tool_calls");
  assert.ok(parallel || done.length * 2 >= answers.length, `${label}: ${answers.length - done.length} of ${answers.length} hit max_tokens`);
  if (process.env.SHOW_OUTPUTS) console.log(label, JSON.stringify(answers.map((a) => [a.finish, a.reasoning, a.calls.map((c) => c.function)])));
}

/** The answers without call ids (random per answer). */
const comparable = (answers: Answer[]): unknown => answers.map((a) => ({ content: a.content, reasoning: a.reasoning, finish: a.finish, calls: a.calls.map((c) => c.function) }));

const CASES = [{ server: "hermes", model: "tiny-qwen3" }, { server: "llama3_json", model: "tiny-llama" }, { server: "mistral", model: "tiny-llama" }];
const CHOICES: { choice: unknown; allowed: string[] }[] = [
  { choice: "required", allowed: TOOLS.map((t) => t.function.name) },
  { choice: { type: "function", function: { name: "get_weather" } }, allowed: ["get_weather"] },
];

for (const { server, model } of CASES) {
  test(`${server} format on ${model}: required and named tool_choice always give valid calls, greedy and sampled, whole and streamed alike`, async () => {
    const s = servers[server]!;
    let streamedPieces = 0;
    for (const { choice, allowed } of CHOICES) {
      for (const parallel of [true, false]) {
        const label = `${server} ${JSON.stringify(choice)} parallel=${parallel}`;
        // A named function gets one call, as vLLM's; "required" as many as parallel_tool_calls allows.
        const many = parallel && choice === "required";
        const body = { model: "tiny", messages: [{ role: "user", content: "Weather in Paris?" }], tools: TOOLS, tool_choice: choice, parallel_tool_calls: parallel, max_tokens: 90 };
        const greedy = await post(s, { ...body, temperature: 0 });
        assert.equal(greedy.status, 200, JSON.stringify(greedy.json));
        checkCalls(`${label} greedy`, wholeAnswers(greedy.json), allowed, many);
        const sampledBody = { ...body, temperature: 1, n: 3, seed: 5 };
        const sampled = wholeAnswers((await post(s, sampledBody)).json);
        checkCalls(`${label} sampled`, sampled, allowed, many);
        const streamed = await streamedAnswers(s, sampledBody);
        checkCalls(`${label} streamed`, streamed, allowed, many);
        assert.deepEqual(comparable(streamed), comparable(sampled), `${label}: streamed deltas reassemble into the whole answers`);
        assert.deepEqual(comparable(await streamedAnswers(s, { ...body, temperature: 0 })), comparable(wholeAnswers(greedy.json)), `${label}: greedy, streamed`);
        streamedPieces += streamed.reduce((n, a) => n + a.argPieces, 0);
      }
    }
    assert.ok(streamedPieces > 20, `arguments arrive in pieces as they are generated (${streamedPieces} pieces)`);
  });
}

test("without enable_thinking a required call starts at once; with it, one think block of at most --max-think-tokens tokens comes first", async () => {
  const s = servers.hermes!;
  const tok = TextTokenizer.fromDir(fixtureModelDir());
  const [open, close] = [tok.tokenId("<think>")!, tok.tokenId("</think>")!];
  const body = { model: "tiny", messages: [{ role: "user", content: "Add 2 and 3." }], tools: TOOLS, tool_choice: "required", max_tokens: 120, temperature: 1, n: 3, seed: 9 };
  const plain = wholeAnswers((await post(s, body)).json);
  checkCalls("no thinking", plain, TOOLS.map((t) => t.function.name), true);
  for (const a of plain) assert.equal(a.reasoning, null);

  // The model is pushed to open a think block and never to close it: the bound closes it.
  const thinking = { ...body, chat_template_kwargs: { enable_thinking: true }, logit_bias: { [open]: 100, [close]: -100 } };
  const whole = wholeAnswers((await post(s, thinking)).json);
  checkCalls("thinking", whole, TOOLS.map((t) => t.function.name), true);
  for (const a of whole.filter((x) => x.finish === "tool_calls")) {
    assert.ok(a.reasoning, "a think block came first");
    // "<think>" and the block's text take the bound; the closing tag is then forced.
    assert.equal(tok.encode(`<think>${a.reasoning}`, false).length, THINK_BOUND, JSON.stringify(a.reasoning));
  }
  assert.deepEqual(comparable(await streamedAnswers(s, thinking)), comparable(whole), "streamed, reasoning included");
  // Free to close it: the model may think less; it still thinks once and calls.
  const free = wholeAnswers((await post(s, { ...body, chat_template_kwargs: { enable_thinking: true }, logit_bias: { [open]: 100 } })).json);
  checkCalls("thinking, free to close", free, TOOLS.map((t) => t.function.name), true);
  for (const a of free) if (a.finish === "tool_calls") assert.ok(tok.encode(`<think>${a.reasoning}`, false).length <= THINK_BOUND);
});

test("a think block the prompt opened: the grammar starts inside it, and closes it at the bound", async () => {
  const tok = TextTokenizer.fromDir(fixtureModelDir());
  const c = grammarCompiler(tok, 151936, [tok.tokenId("<|im_end|>")!]);
  const g = await c.compile({ type: "think_then", maxTokens: 4, opened: true, then: { type: "regex", pattern: "[a-z]+" } });
  const allowed = (mask: Int32Array | undefined, id: number): boolean => mask !== undefined && ((mask[id >> 5]! >>> (id & 31)) & 1) === 1;
  const feed = async (m: Awaited<ReturnType<typeof g.matcher>>, text: string): Promise<void> => {
    for (const id of tok.encode(text, false)) {
      assert.ok(allowed(await m.nextMask(), id), `${JSON.stringify(tok.decode([id], false))} in ${JSON.stringify(text)}`);
      assert.ok(m.accept(id));
    }
  };
  const closing = await g.matcher();
  await feed(closing, "a < b</think>\n\nyes");
  closing.dispose();
  const bounded = await g.matcher();
  await feed(bounded, " one two three four");
  const mask = await bounded.nextMask();
  assert.ok(allowed(mask, tok.tokenId("</think>")!) && !allowed(mask, tok.encode(" five", false)[0]!), "at the bound only the closing tag may come");
  await feed(bounded, "</think>\n\nok");
  bounded.dispose();
});

test("response_format with enable_thinking: one bounded think block, then JSON valid against the schema", async () => {
  const s = servers.hermes!;
  const tok = TextTokenizer.fromDir(fixtureModelDir());
  const schema = { type: "object", properties: { n: { type: "integer", minimum: 0, maximum: 9 }, ok: { type: "boolean" } }, required: ["n", "ok"], additionalProperties: false };
  const r = await post(s, {
    model: "tiny", messages: [{ role: "user", content: "?" }], max_tokens: 60, temperature: 1, n: 3, seed: 4,
    response_format: { type: "json_schema", json_schema: { name: "x", schema, strict: true } },
    chat_template_kwargs: { enable_thinking: true }, logit_bias: { [tok.tokenId("<think>")!]: 100 },
  });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const check = ajv.compile(schema);
  for (const a of wholeAnswers(r.json)) {
    assert.equal(a.finish, "stop");
    assert.ok(a.reasoning !== null && tok.encode(`<think>${a.reasoning}`, false).length <= THINK_BOUND, JSON.stringify(a.reasoning));
    assert.ok(check(JSON.parse(a.content!)), a.content!);
  }
});

test("tool_choice none: the answer has no tool_calls, even when its text is a call", async () => {
  const call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  const r = await post(servers.hermes!, {
    model: "tiny", messages: [{ role: "user", content: "?" }], tools: TOOLS, tool_choice: "none", max_tokens: 40, temperature: 0,
    structured_outputs: { choice: [call] },
  });
  assert.equal(r.status, 200, JSON.stringify(r.json));
  const [a] = wholeAnswers(r.json);
  assert.deepEqual([a!.content, a!.calls, a!.finish], [call, [], "stop"]);
  // The same text with tool_choice auto is a call.
  const auto = wholeAnswers((await post(servers.hermes!, { model: "tiny", messages: [{ role: "user", content: "?" }], tools: TOOLS, max_tokens: 40, temperature: 0, structured_outputs: { choice: [call] } })).json)[0]!;
  assert.deepEqual([auto.calls.map((c) => c.function), auto.finish], [[{ name: "now", arguments: "{}" }], "tool_calls"]);
});

test("a required call with response_format is a 400; a bad parameters schema is a 400 naming tools", async () => {
  const base = { model: "tiny", messages: [{ role: "user", content: "?" }], max_tokens: 5 };
  const both = await post(servers.hermes!, { ...base, tools: TOOLS, tool_choice: "required", response_format: { type: "json_object" } });
  assert.equal(both.status, 400);
  assert.equal((both.json.error as Json).param, "tool_choice");
  const bad = await post(servers.hermes!, { ...base, tool_choice: "required", tools: [{ type: "function", function: { name: "f", parameters: { type: "bogus" } } }] });
  assert.equal(bad.status, 400, JSON.stringify(bad.json));
  assert.equal((bad.json.error as Json).param, "tools");
  assert.match((bad.json.error as Json).message as string, /bogus/);
});

