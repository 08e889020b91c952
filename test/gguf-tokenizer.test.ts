/**
 * The tokenizer built from a GGUF's own metadata gives llama.cpp's token ids
 * (node-llama-cpp on the same file) for Qwen2-family and Llama 3 byte-level
 * BPE and Llama 2 SentencePiece vocabularies.
 */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { Tokenizer } from "@huggingface/tokenizers";
import { readGguf } from "../src/model/gguf.js";
import { ggufTokenizerFiles } from "../src/model/gguf-tokenizer.js";
import { writeGguf, tokenizerMeta, ALIGN, type Meta } from "../src/model/gguf-export.js";
import { tempDir, tokenizerPackageDir } from "./helpers.js";
import type { TokenizerFamily } from "../src/model/tokenizer-packages.js";

const TEXTS = [
  "Hello world", " Hello world", "  two leading spaces", "trailing space ", "\tTabs\tand\nnew\n\nlines\r\n",
  "Numbers 1234567 and 3.14159, 42nd, 1,000,000", "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
  "<s>[INST] a <</SYS>> b</s>", "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhey<|eot_id|>",
  "我爱自然语言处理。日本語のテキスト", "한국어 텍스트와 Ελληνικά", "emoji 😀👍🏽 👨‍👩‍👧 flags 🇫🇷", "don't won't I'LL it's",
  "a\u0301 composed é vs decomposed e\u0301", "lone \ud800 surrogate and \udfff too", "replacement \ufffd char",
  "code: `x = f(a, b) -> {k: v}`;  // comment", "    indented\n        more", "", " ", "<think>\nreasoning\n</think>",
  "ααααααααααααα", "https://example.com/path?q=1&r=2", "MiXeD CaSe WORDS", "!!!???...",
];

type Llama = import("node-llama-cpp").Llama;
let llama: Llama | undefined;
after(async () => { await llama?.dispose(); });

async function llamaCppIds(file: string, texts: string[]): Promise<number[][]> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  llama ??= await getLlama({ gpu: false, logLevel: LlamaLogLevel.error });
  const model = await llama.loadModel({ modelPath: file, vocabOnly: true });
  try {
    return texts.map((t) => model.tokenize(t, true).map(Number));
  } finally {
    await model.dispose();
  }
}

/** A vocabulary-only GGUF (llama.cpp loads it with vocab_only) holding a tokenizer package's vocabulary. */
function vocabGguf(family: TokenizerFamily, arch: string, vocabSize: number, extra: Meta[] = []): string {
  const file = path.join(tempDir("weft-gguf-tok-"), `${family}.gguf`);
  const meta: Meta[] = [
    ["general.architecture", "str", arch], ["general.alignment", "u32", ALIGN], [`${arch}.context_length`, "u32", 4096],
    [`${arch}.embedding_length`, "u32", 64], [`${arch}.block_count`, "u32", 1], [`${arch}.feed_forward_length`, "u32", 128],
    [`${arch}.attention.head_count`, "u32", 4], [`${arch}.attention.layer_norm_rms_epsilon`, "f32", 1e-5],
    ...tokenizerMeta(tokenizerPackageDir(family), vocabSize, arch), ...extra,
  ];
  writeGguf(file, meta, []);
  return file;
}

const CASES: [TokenizerFamily, string, number, string][] = [
  ["qwen3", "qwen3", 151936, "gpt2 / qwen2"],
  ["llama3_1", "llama", 128256, "gpt2 / llama-bpe"],
  ["llama2", "llama", 32000, "llama (SentencePiece)"],
];

for (const [family, arch, vocabSize, kind] of CASES) {
  test(`tokenizer: ${family} (${kind}) from the GGUF gives llama.cpp's ids`, async () => {
    const file = vocabGguf(family, arch, vocabSize);
    const { tokenizer, config } = ggufTokenizerFiles(readGguf(file));
    const tok = new Tokenizer(tokenizer, config);
    const want = await llamaCppIds(file, TEXTS);
    const diffs = TEXTS.flatMap((t, i) => {
      const got = tok.encode(t, { add_special_tokens: false }).ids;
      return JSON.stringify(got) === JSON.stringify(want[i]) ? [] : [`${JSON.stringify(t)}: weft ${JSON.stringify(got)} llama.cpp ${JSON.stringify(want[i])}`];
    });
    assert.deepEqual(diffs, []);
    // Something real was compared: special tokens are single ids, text is many.
    assert.ok(want.reduce((n, ids) => n + ids.length, 0) > 200);
  });
}

test("tokenizer: BOS, EOS and the chat template come from the GGUF", () => {
  const llama2 = ggufTokenizerFiles(readGguf(vocabGguf("llama2", "llama", 32000,
    [["tokenizer.ggml.bos_token_id", "u32", 1], ["tokenizer.ggml.eos_token_id", "u32", 2]])));
  assert.deepEqual([llama2.config.bos_token, llama2.config.eos_token, llama2.config.add_bos_token], ["<s>", "</s>", true]);
  assert.deepEqual(new Tokenizer(llama2.tokenizer, llama2.config).encode("Hi", { add_special_tokens: true }).ids.slice(0, 1), [1]);
  const qwen = ggufTokenizerFiles(readGguf(vocabGguf("qwen3", "qwen3", 151936)));
  assert.equal(qwen.config.add_bos_token, false);
  assert.match(qwen.config.chat_template as string, /<\|im_start\|>/);
  const ids = new Tokenizer(qwen.tokenizer, qwen.config).encode("Hi", { add_special_tokens: true }).ids;
  assert.deepEqual(ids, new Tokenizer(qwen.tokenizer, qwen.config).encode("Hi", { add_special_tokens: false }).ids);
});
