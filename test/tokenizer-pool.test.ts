/** The tokenizer pool: the inline tokenizer's ids, the event loop while a huge prompt is tokenized, dead workers, the prompt character cap. */
import { test, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { completeFixtureModel, ROOT } from "./helpers.js";
import { TextTokenizer, type ChatMessage } from "../src/model/tokenizer.js";
import { TokenizerPool, TokenizerWorkerError } from "../src/model/tokenizer-pool.js";
import { maxPromptChars, PromptTooLongError } from "../src/model/prompt-limits.js";

const dir = completeFixtureModel("tiny-qwen3");
const tok = TextTokenizer.fromDir(dir);
after(() => fs.rmSync(dir, { recursive: true, force: true }));
/** A pool that loses a call fails its test instead of hanging it. */
const TIMEOUT = 60_000;

const TEXTS = [
  "",
  "Hello, world!",
  " leading space, trailing space ",
  "<|im_start|>user\nspecial tokens in text<|im_end|>",
  "emoji 🚀👩‍👩‍👧 and CJK 你好世界, decomposed u\u0308\u0304",
  "  \n\n\t code:\n    return x + 1;  \n".repeat(40),
  "The quick brown fox jumps over the lazy dog. ".repeat(500),
  "a".repeat(5000),
];

const CHATS: ChatMessage[][] = [
  [{ role: "user", content: "Hi" }],
  [{ role: "system", content: "Be brief." }, { role: "user", content: "Why is the sky blue? ".repeat(300) }],
  [
    { role: "user", content: "q1" },
    { role: "assistant", content: "<think>\nlong reasoning\n</think>\n\nanswer one" },
    { role: "user", content: "q2 🚀" },
  ],
  Array.from({ length: 200 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: `turn ${i}` })),
];

/** The longest gap between ticks of a 10 ms interval while `fn` runs. */
async function maxEventLoopGap(fn: () => Promise<void>): Promise<number> {
  let last = performance.now();
  let gap = 0;
  const probe = setInterval(() => {
    const now = performance.now();
    gap = Math.max(gap, now - last);
    last = now;
  }, 10);
  try {
    await fn();
  } finally {
    clearInterval(probe);
  }
  return Math.max(gap, performance.now() - last);
}

const settledWithin = (p: Promise<unknown>, ms: number): Promise<boolean> =>
  Promise.race([p.then(() => true, () => true), new Promise<boolean>((r) => setTimeout(() => r(false), ms))]);

test("the pool's workers return the inline tokenizer's ids, text and chat, many calls at once", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool({ inlineMaxChars: 0 });
  try {
    const [texts, chats] = await Promise.all([
      Promise.all(TEXTS.map((t) => pool.encode(tok, t))),
      Promise.all(CHATS.map((m) => pool.encodeChat(tok, m))),
    ]);
    TEXTS.forEach((t, i) => assert.deepEqual(texts[i], tok.encode(t), t.slice(0, 40)));
    CHATS.forEach((m, i) => assert.deepEqual(chats[i], tok.encodeChat(m), m[0]!.content.slice(0, 40)));
  } finally {
    await pool.close();
  }
});

test("while 3 MiB without spaces is tokenized in a worker, the event loop never stalls over 100 ms", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool({ workers: 1 });
  try {
    await pool.encode(tok, TEXTS[6]!); // the worker loads its tokenizer
    const abort = new AbortController();
    let huge: Promise<number[]> | undefined;
    const gap = await maxEventLoopGap(async () => {
      huge = pool.encode(tok, "a".repeat(3 * 2 ** 20), { signal: abort.signal });
      assert.equal(await settledWithin(huge, 2000), false, "3 MiB takes the worker far longer than 2 s");
    });
    assert.ok(gap < 100, `event loop stalled ${gap.toFixed(0)} ms`);
    abort.abort();
    await assert.rejects(huge!, { name: "AbortError" });
    assert.deepEqual(await pool.encode(tok, TEXTS[6]!), tok.encode(TEXTS[6]!), "a new worker takes over");
  } finally {
    await pool.close();
  }
});

test("an aborted queued call is dropped without waiting for the worker", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool({ workers: 1 });
  try {
    const first = new AbortController();
    const second = new AbortController();
    const running = pool.encode(tok, "a".repeat(2 ** 20), { signal: first.signal });
    const queued = pool.encode(tok, TEXTS[6]!, { signal: second.signal });
    second.abort();
    await assert.rejects(queued, { name: "AbortError" });
    assert.equal(await settledWithin(running, 200), false, "the running call goes on");
    first.abort();
    await assert.rejects(running, { name: "AbortError" });
  } finally {
    await pool.close();
  }
});

test("a worker that dies rejects its call; the pool starts another for the next", { timeout: TIMEOUT }, async () => {
  // 192 MiB holds the Qwen3 tokenizer (~50 MiB) but not BPE over 1 MiB of one word (~700 MiB).
  const pool = new TokenizerPool({ workers: 1, maxHeapMb: 192 });
  try {
    await pool.encode(tok, TEXTS[6]!);
    const crash = pool.encode(tok, "a".repeat(2 ** 20));
    const queued = pool.encode(tok, TEXTS[5]!);
    await assert.rejects(crash, (e: unknown) => e instanceof TokenizerWorkerError && /memory/.test(e.message));
    assert.deepEqual(await queued, tok.encode(TEXTS[5]!), "the call queued behind it runs in a new worker");
    assert.deepEqual(await pool.encodeChat(tok, CHATS[3]!), tok.encodeChat(CHATS[3]!));
  } finally {
    await pool.close();
  }
});

test("close rejects a running call and later large calls; small ones need no worker", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool();
  const running = assert.rejects(pool.encode(tok, "a".repeat(2 ** 20)), TokenizerWorkerError);
  await pool.close();
  await running;
  await assert.rejects(pool.encode(tok, TEXTS[6]!), TokenizerWorkerError);
  assert.deepEqual(await pool.encode(tok, TEXTS[4]!), tok.encode(TEXTS[4]!));
  assert.deepEqual(await pool.encodeChat(tok, CHATS[2]!), tok.encodeChat(CHATS[2]!));
});

test("idle workers do not keep the process alive", { timeout: TIMEOUT }, () => {
  const module = (f: string): string => JSON.stringify(pathToFileURL(path.join(ROOT, "dist", "src", "model", f)).href);
  const script = path.join(dir, "encode-once.mjs");
  fs.writeFileSync(script, `
    import { TextTokenizer } from ${module("tokenizer.js")};
    import { TokenizerPool } from ${module("tokenizer-pool.js")};
    const tok = TextTokenizer.fromDir(${JSON.stringify(dir)});
    const ids = await new TokenizerPool().encode(tok, "word ".repeat(1000));
    console.log(ids.length);`);
  const out = execFileSync(process.execPath, [script], { timeout: 60_000, encoding: "utf8" });
  assert.equal(Number(out.trim()), tok.encode("word ".repeat(1000)).length, "the call completed, then the process exited");
});

test("the character cap passes the longest tokens at maxModelLen tokens and refuses one character more than the bound", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool();
  const maxModelLen = 64;
  const maxChars = maxPromptChars(maxModelLen, tok);
  const vocab = (JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")) as { model: { vocab: Record<string, number> } }).model.vocab;
  const longest = Object.entries(vocab).reduce((a, b) => (b[0].length > a[0].length ? b : a));
  const text = tok.decode([longest[1]]).repeat(maxModelLen);
  try {
    const ids = await pool.encode(tok, text, { maxChars });
    assert.ok(ids.length <= maxModelLen, `${ids.length} tokens`);
    assert.equal(maxChars, maxModelLen * longest[0].length * 1.5, "Qwen3: 128-character tokens, NFC");
    await pool.encode(tok, " ".repeat(maxChars), { maxChars });
    await assert.rejects(pool.encode(tok, " ".repeat(maxChars + 1), { maxChars }), (e: unknown) =>
      e instanceof PromptTooLongError && e.chars === maxChars + 1 && e.maxChars === maxChars);
    const chat = (content: string): ChatMessage[] => [{ role: "user", content }];
    const overhead = tok.renderChat(chat("")).length;
    await pool.encodeChat(tok, chat("x".repeat(maxChars - overhead)), { maxChars });
    await assert.rejects(pool.encodeChat(tok, chat("x".repeat(maxChars - overhead + 1)), { maxChars }), PromptTooLongError);
  } finally {
    await pool.close();
  }
});

test("for chat the cap counts the rendered template, which may drop text", { timeout: TIMEOUT }, async () => {
  const pool = new TokenizerPool();
  const maxChars = maxPromptChars(64, tok);
  const messages: ChatMessage[] = [
    { role: "user", content: "q1" },
    { role: "assistant", content: `<think>${"x".repeat(maxChars)}</think>answer` },
    { role: "user", content: "q2" },
  ];
  try {
    assert.deepEqual(await pool.encodeChat(tok, messages, { maxChars }), tok.encodeChat(messages), "Qwen3 drops earlier turns' reasoning");
  } finally {
    await pool.close();
  }
});
