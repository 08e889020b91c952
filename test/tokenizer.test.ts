/** Tokenizer ids, chat templates and incremental detokenization against transformers' reference. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { FIXTURES, tokenizerPackageDir } from "./helpers.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { IncrementalDetokenizer } from "../src/model/detokenizer.js";

interface Reference {
  encode: { text: string; ids: number[] }[];
  chat: { messages: { role: string; content: string }[]; rendered: string; ids: number[] }[];
}
const reference = JSON.parse(fs.readFileSync(path.join(FIXTURES, "tokenizer_reference.json"), "utf8")) as Record<string, Reference>;

for (const family of ["qwen3", "llama2"] as const) {
  const tok = TextTokenizer.fromDir(tokenizerPackageDir(family));
  const ref = reference[family]!;

  test(`${family}: encode matches the Python tokenizers library`, () => {
    for (const { text, ids } of ref.encode) assert.deepEqual(tok.encode(text), ids, text);
  });

  test(`${family}: chat template renders as transformers does`, () => {
    for (const c of ref.chat) {
      assert.equal(tok.renderChat(c.messages), c.rendered);
      assert.deepEqual(tok.encodeChat(c.messages), c.ids);
    }
  });

  test(`${family}: incremental detokenization equals a full decode and never splits a character`, () => {
    for (const { text } of ref.encode) {
      const ids = tok.encode(text, false);
      const prompt = ids.slice(0, 1);
      const detok = new IncrementalDetokenizer(tok, prompt);
      const deltas = ids.slice(1).map((id) => detok.push(id));
      deltas.push(detok.flush());
      for (const d of deltas) assert.ok(!d.includes("\uFFFD"), `broken character in ${JSON.stringify(d)}`);
      assert.equal(tok.decode(prompt) + deltas.join(""), tok.decode(ids), text);
    }
  });
}

test("qwen3: a multi-byte emoji split over byte-level tokens is emitted whole", () => {
  const tok = TextTokenizer.fromDir(tokenizerPackageDir("qwen3"));
  const ids = tok.encode(" 🚀");
  assert.ok(ids.length > 1, "the rocket takes several byte tokens");
  const detok = new IncrementalDetokenizer(tok, [tok.encode("a")[0]!]);
  const deltas = ids.map((id) => detok.push(id));
  assert.deepEqual(deltas.slice(0, -1).join(""), "");
  assert.equal(deltas.at(-1), " 🚀");
});
