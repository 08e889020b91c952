/** Tokenizer ids, chat templates and incremental detokenization against transformers' reference. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { FIXTURES, tokenizerPackageDir } from "./helpers.js";
import { TextTokenizer } from "../src/model/tokenizer.js";
import { IncrementalDetokenizer } from "../src/model/detokenizer.js";
import { charsPerTokenBound, NFC_UNITS_PER_BYTE } from "../src/model/prompt-limits.js";
import type { TokenizerFamily } from "../src/model/tokenizer-packages.js";

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

test("charsPerToken: each shipped tokenizer's longest token (× 1.5 under NFC), and no text beats it", () => {
  const expected = { qwen3: 128 * NFC_UNITS_PER_BYTE, llama3_1: 128, llama2: 16 };
  for (const [family, bound] of Object.entries(expected) as [TokenizerFamily, number][]) {
    const tok = TextTokenizer.fromDir(tokenizerPackageDir(family));
    assert.equal(tok.charsPerToken, bound, family);
    const texts = [" ".repeat(4096), "\n".repeat(3000), "u\u0308\u0304".repeat(500), "\u03b1\u0314\u0342\u0345".repeat(400),
      "=".repeat(3000), "你好世界".repeat(300), "🚀".repeat(300), "<|im_start|><|endoftext|>".repeat(100), "ab".repeat(2000)];
    for (const t of texts) {
      const n = tok.encode(t, false).length;
      assert.ok(n * tok.charsPerToken >= t.length, `${family}: ${t.length} characters in ${n} tokens: ${JSON.stringify(t.slice(0, 12))}`);
    }
  }
});

test("NFC composes at most 1.5 UTF-16 code units into each UTF-8 byte (u + ◌̈ + ◌̄ → ǖ)", () => {
  let most = 0;
  for (let cp = 0; cp <= 0x10ffff; cp++) {
    if (cp >= 0xd800 && cp <= 0xdfff) continue;
    const c = String.fromCodePoint(cp);
    // The longest text NFC turns into this character's NFC: the character itself or its full decomposition.
    most = Math.max(most, Math.max(c.length, c.normalize("NFD").length) / Buffer.byteLength(c.normalize("NFC")));
  }
  assert.equal(most, NFC_UNITS_PER_BYTE);
});

test("charsPerToken is Infinity where a tokenizer can drop text", () => {
  const bpe = { type: "BPE", vocab: { ab: 0 }, byte_fallback: true };
  const json = (over: Record<string, unknown>): Record<string, unknown> => ({ model: bpe, normalizer: null, pre_tokenizer: null, ...over });
  assert.equal(charsPerTokenBound(json({})), 2);
  assert.equal(charsPerTokenBound(json({ model: { ...bpe, byte_fallback: false, unk_token: "<unk>", fuse_unk: true } })), Infinity);
  assert.equal(charsPerTokenBound(json({ model: { type: "WordPiece", vocab: { ab: 0 } } })), Infinity);
  assert.equal(charsPerTokenBound(json({ normalizer: { type: "Strip", left: true, right: true } })), Infinity);
  assert.equal(charsPerTokenBound(json({ pre_tokenizer: { type: "Whitespace" } })), Infinity);
  assert.equal(charsPerTokenBound(json({ pre_tokenizer: { type: "Split", pattern: { String: " " }, behavior: "Removed" } })), Infinity);
});
