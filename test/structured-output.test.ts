/**
 * Structured outputs by grammar-constrained decoding, on the real server with random-weight
 * models (tiny-qwen3 and tiny-llama) and the real native sampler: only the token mask can make
 * their outputs parse. Every output that ends with finish_reason "stop" must parse and validate
 * against its schema (checked by ajv); outputs cut off by max_tokens ("length") are excluded,
 * and most outputs must not be cut off.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import OpenAI from "openai";
import { z } from "zod";
import { zodResponseFormat } from "openai/helpers/zod";
import { grammarCompiler } from "../src/engine/grammar.js";
import { completeFixtureModel } from "./helpers.js";
import { startServer, type TestServer } from "./support/server.js";

let s: TestServer;
before(async () => {
  s = await startServer({ models: { "tiny-llama": completeFixtureModel("tiny-llama") } });
});
after(async () => s.close());

type Json = Record<string, unknown>;

async function post(path: string, body: Json): Promise<{ status: number; json: Json }> {
  const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Json };
}

/** The text and finish_reason of each choice of a streamed request. */
async function streamed(path: string, body: Json): Promise<{ text: string; finish: string | null }[]> {
  const res = await fetch(`${s.url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...body, stream: true }) });
  assert.equal(res.status, 200);
  const out: { text: string; finish: string | null }[] = [];
  for (const line of (await res.text()).split("\n")) {
    if (!line.startsWith("data: ") || line === "data: [DONE]") continue;
    const chunk = JSON.parse(line.slice(6)) as { choices: { index: number; text?: string; delta?: { content?: string | null }; finish_reason: string | null }[] };
    for (const c of chunk.choices) {
      out[c.index] ??= { text: "", finish: null };
      out[c.index]!.text += c.text ?? c.delta?.content ?? "";
      if (c.finish_reason) out[c.index]!.finish = c.finish_reason;
    }
  }
  return out;
}

interface Choice { text: string; finish: string | null }

function choices(path: string, json: Json): Choice[] {
  const list = json.choices as { text?: string; message?: { content: string | null }; finish_reason: string }[];
  return list.map((c) => ({ text: path.includes("chat") ? (c.message?.content ?? "") : (c.text ?? ""), finish: c.finish_reason }));
}

const SCHEMAS: Record<string, Json> = {
  nested: {
    $schema: "http://json-schema.org/draft-07/schema#",
    title: "Person",
    type: "object",
    properties: {
      name: { type: "string", title: "Name", maxLength: 6 },
      age: { type: "integer", minimum: 0, maximum: 120 },
      address: { type: "object", properties: { zip: { type: "string", pattern: "^[0-9]{5}$" }, city: { enum: ["Paris", "Oslo", "Lima"] } }, required: ["zip", "city"] },
    },
    required: ["name", "age", "address"],
    additionalProperties: false,
  },
  arrays: {
    $schema: "https://json-schema.org/draft/2020-12/schema",
    type: "object",
    properties: { tags: { type: "array", items: { enum: ["a", "b", "c"] }, minItems: 2, maxItems: 4 }, flag: { type: "boolean" } },
    required: ["tags", "flag"],
  },
  anyOf: {
    type: "object",
    properties: { value: { anyOf: [{ type: "integer", minimum: -5, maximum: 5 }, { type: "string", pattern: "^[a-z]{1,4}$" }, { type: "null" }] } },
    required: ["value"],
  },
  optional: {
    // strict: true with an optional property, as client libraries send it.
    type: "object",
    properties: { id: { type: "integer", minimum: 1, maximum: 999 }, note: { type: "string", maxLength: 3 } },
    required: ["id"],
    additionalProperties: false,
  },
};

const ajv = new Ajv({ strict: false });

/** Every finished output parses and validates; most outputs finish. */
function checkOutputs(label: string, outs: Choice[], valid: (text: string) => boolean): void {
  const done = outs.filter((c) => c.finish === "stop");
  assert.ok(done.length * 2 >= outs.length, `${label}: ${outs.length - done.length} of ${outs.length} outputs hit max_tokens`);
  for (const c of outs) assert.ok(c.finish === "stop" || c.finish === "length", `${label}: finish_reason ${c.finish}`);
  for (const c of done) assert.ok(valid(c.text), `${label}: invalid output ${JSON.stringify(c.text)}`);
  if (process.env.SHOW_OUTPUTS) console.log(label, outs.map((c) => c.text));
}

function validator(schema: Json): (text: string) => boolean {
  const check = ajv.compile({ ...schema, $schema: undefined });
  return (text) => {
    try {
      return check(JSON.parse(text));
    } catch {
      return false;
    }
  };
}

const CASES: { model: string; path: string; base: Json }[] = [
  { model: "tiny", path: "/v1/chat/completions", base: { messages: [{ role: "user", content: "Describe someone." }] } },
  { model: "tiny", path: "/v1/completions", base: { prompt: "JSON:" } },
  { model: "tiny-llama", path: "/v1/completions", base: { prompt: "JSON:" } },
];

for (const { model, path, base } of CASES) {
  test(`json_schema on ${model} ${path}: every output parses and validates, whole and streamed, at temperature 0 and 1`, async () => {
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const body = { ...base, model, max_tokens: 120, response_format: { type: "json_schema", json_schema: { name, schema, strict: true } } };
      const valid = validator(schema);
      const greedy = await post(path, { ...body, temperature: 0 });
      assert.equal(greedy.status, 200, JSON.stringify(greedy.json));
      checkOutputs(`${name} greedy`, choices(path, greedy.json), valid);
      const sampled = await post(path, { ...body, temperature: 1, n: 3, seed: 7 });
      assert.equal(sampled.status, 200);
      checkOutputs(`${name} sampled`, choices(path, sampled.json), valid);
      checkOutputs(`${name} streamed`, await streamed(path, { ...body, temperature: 1, n: 2, seed: 11 }), valid);
    }
  });
}

test("json_object gives a JSON object; structured_outputs json takes a schema too", async () => {
  for (const path of ["/v1/chat/completions", "/v1/completions"]) {
    const base = path.includes("chat") ? { messages: [{ role: "user", content: "hi" }] } : { prompt: "x" };
    const r = await post(path, { ...base, model: "tiny", max_tokens: 60, temperature: 1, n: 4, seed: 3, response_format: { type: "json_object" } });
    assert.equal(r.status, 200);
    // A bare object holds keys and values of any length; only its opening is sure within 60 tokens.
    for (const c of choices(path, r.json)) {
      assert.ok(c.text.startsWith("{"), c.text);
      if (c.finish === "stop") assert.equal(typeof JSON.parse(c.text), "object");
    }
  }
  const schema = SCHEMAS.optional!;
  const r = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 60, n: 4, seed: 5, structured_outputs: { json: schema } });
  checkOutputs("structured_outputs.json", choices("/v1/completions", r.json), validator(schema));
});

test("regex and choice outputs match, on both models", async () => {
  for (const model of ["tiny", "tiny-llama"]) {
    const re = await post("/v1/completions", { model, prompt: "Code:", max_tokens: 40, n: 4, seed: 1, structured_outputs: { regex: "[A-Z]{2}-[0-9]{3}( ok)?" } });
    assert.equal(re.status, 200, JSON.stringify(re.json));
    checkOutputs(`${model} regex`, choices("/v1/completions", re.json), (t) => /^[A-Z]{2}-[0-9]{3}( ok)?$/.test(t));
    const options = ["yes", "no", "maybe so"];
    const ch = await post("/v1/chat/completions", { model, messages: [{ role: "user", content: "?" }], max_tokens: 20, n: 4, seed: 2, structured_outputs: { choice: options } });
    if (model === "tiny-llama") {
      assert.equal(ch.status, 400); // no chat template
    } else {
      checkOutputs(`${model} choice`, choices("/v1/chat/completions", ch.json), (t) => options.includes(t));
    }
    const grammar = await post("/v1/completions", { model, prompt: "x", max_tokens: 20, temperature: 0, structured_outputs: { grammar: 'root ::= "(" [0-9] ("+" [0-9])? ")"' } });
    checkOutputs(`${model} grammar`, choices("/v1/completions", grammar.json), (t) => /^\([0-9](\+[0-9])?\)$/.test(t));
  }
});

test("a constrained row does not change the other rows of its batch", async () => {
  const plain = { model: "tiny", prompt: "Once upon a time", max_tokens: 12, temperature: 1, seed: 42 };
  const alone = await post("/v1/completions", plain);
  const [together] = await Promise.all([
    post("/v1/completions", plain),
    post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 40, structured_outputs: { json: SCHEMAS.nested } }),
    post("/v1/completions", { model: "tiny", prompt: "y", max_tokens: 40, structured_outputs: { regex: "[a-z]+" } }),
  ]);
  assert.deepEqual(choices("/v1/completions", together.json), choices("/v1/completions", alone.json));
});

test("invalid schemas and unsupported fields are a 400 naming the field", async () => {
  const cases: [Json, string][] = [
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "bogus" } } } }, "response_format"],
    [{ response_format: { type: "xml" } }, "response_format.type"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: 3 } } }, "response_format.json_schema.schema"],
    [{ structured_outputs: { regex: "[a-z" } }, "structured_outputs"],
    [{ structured_outputs: { grammar: "root ::= [a-z" } }, "structured_outputs"],
    [{ structured_outputs: { choice: [] } }, "structured_outputs.choice"],
    [{ structured_outputs: { regex: "a", choice: ["a"] } }, "structured_outputs"],
  ];
  for (const [extra, param] of cases) {
    const r = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 5, ...extra });
    assert.equal(r.status, 400, JSON.stringify(extra));
    const err = r.json.error as Json;
    assert.equal(err.param, param, JSON.stringify(err));
  }
  const bad = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 5, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "bogus" } } } });
  assert.match((bad.json.error as Json).message as string, /bogus/);
  // The server goes on serving constrained requests after a refused grammar.
  const ok = await post("/v1/completions", { model: "tiny", prompt: "x", max_tokens: 20, temperature: 0, structured_outputs: { choice: ["a", "b"] } });
  assert.equal(ok.status, 200);
});

test("a thinking template does not think before a constrained answer", async () => {
  const r = await post("/v1/chat/completions", { model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 20, temperature: 0, structured_outputs: { choice: ["red", "blue"] } });
  assert.equal(r.status, 200);
  const msg = (r.json.choices as { message: { content: string; reasoning_content?: string | null } }[])[0]!.message;
  assert.ok(["red", "blue"].includes(msg.content), msg.content);
  assert.ok(!msg.reasoning_content, "no reasoning before a constrained answer");
});

test("openai SDK chat.completions.parse with a zod schema", async () => {
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "none" });
  const Event = z.object({ name: z.string().max(8), day: z.enum(["mon", "tue", "wed"]), guests: z.array(z.string().max(4)).max(3), count: z.number().int().min(0).max(50) });
  let parsed = 0;
  for (let seed = 0; seed < 4; seed++) {
    const r = await client.chat.completions.parse({
      model: "tiny", messages: [{ role: "user", content: "An event, please." }], max_tokens: 150, seed,
      response_format: zodResponseFormat(Event, "event"),
    });
    const c = r.choices[0]!;
    if (c.finish_reason !== "stop") continue;
    assert.ok(c.message.parsed, c.message.content ?? "");
    Event.parse(c.message.parsed);
    parsed++;
  }
  assert.ok(parsed >= 2, `only ${parsed} of 4 finished`);
});

test("a length-bounded JSON string admits no control characters (XGrammar 0.1.27 lets them in; JSON forbids them)", async () => {
  const model = await s.manager.acquire("tiny-llama", "test");
  const tok = model.tokenizer!;
  const c = grammarCompiler(tok, model.engine.limits.vocabSize, model.engine.limits.eosTokenIds);
  const g = await c.compile({ type: "json_schema", schema: JSON.stringify({ type: "object", properties: { s: { type: "string", maxLength: 8 } }, required: ["s"] }) });
  const m = await g.matcher();
  // {"s":"a, token by token (sentencepiece would put a space before a whole encoded text).
  for (const id of ["{", "<0x22>", "s", "<0x22>", ":", "<0x22>", "a"].map((p) => tok.tokenId(p)!)) {
    await m.nextMask();
    assert.ok(m.accept(id));
  }
  const mask = await m.nextMask();
  assert.ok(mask, "a live matcher makes a mask");
  const allowed = (id: number): boolean => ((mask[id >> 5]! >>> (id & 31)) & 1) === 1;
  assert.ok(allowed(tok.tokenId("b")!), "a letter may follow");
  for (const byte of ["<0x15>", "<0x09>", "<0x0A>"]) assert.ok(!allowed(tok.tokenId(byte)!), `${byte} may not`);
  m.dispose();
});

test("a matcher disposed while its mask is being made still makes it (its memory is freed after); once disposed it makes none", async () => {
  const model = await s.manager.acquire("tiny-llama", "test");
  const g = await grammarCompiler(model.tokenizer!, model.engine.limits.vocabSize, model.engine.limits.eosTokenIds).compile({ type: "regex", pattern: "[a-z]+" });
  const m = await g.matcher();
  const pending = m.nextMask();
  m.dispose();
  assert.ok(await pending, "the mask asked for before dispose()");
  assert.equal(await m.nextMask(), undefined);
});
