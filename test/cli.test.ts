/** The CLI as checks outside the suite use it: make-model, generate --json, and their errors. */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { ROOT, tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";

const CLI = path.join(ROOT, "dist", "src", "cli.js");
const weft = (...args: string[]): string => execFileSync(process.execPath, [CLI, ...args], { stdio: ["ignore", "pipe", "pipe"] }).toString();

test("make-model writes a loadable checkpoint with the family's real tokenizer, in the dtype asked", () => {
  for (const [preset, dtype] of [["tiny", "bf16"], ["tiny-llama", "f16"]] as const) {
    const dir = path.join(tempDir(), preset);
    assert.match(weft("make-model", "--preset", preset, "--out", dir, "--dtype", dtype), /random weights/);
    for (const f of ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]) assert.ok(fs.existsSync(path.join(dir, f)), f);
    const header = fs.readFileSync(path.join(dir, "model.safetensors"));
    const meta = JSON.parse(header.subarray(8, 8 + Number(header.readBigUInt64LE(0))).toString()) as Record<string, { dtype: string }>;
    assert.equal(meta["model.embed_tokens.weight"]!.dtype, dtype.toUpperCase());
    const out = JSON.parse(weft("generate", "--model", dir, "--prompt", "Hello", "--max-tokens", "3", "--json")) as { token_ids: number[] };
    assert.equal(out.token_ids.length, 3);
  }
  const bad = spawnSync(process.execPath, [CLI, "make-model", "--preset", "nope", "--out", tempDir()]);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr.toString(), /unknown preset "nope"/);
});

test("generate --json prints exactly one object of the documented shape", () => {
  const stdout = weft("generate", "--model", fixtureModelDir(), "--prompt-ids", "9707,1052", "--max-tokens", "4", "--temperature", "0.7",
    "--seed", "3", "--logprobs", "2", "--ignore-eos", "--json");
  const lines = stdout.trim().split("\n");
  assert.equal(lines.length, 1, "nothing else on stdout");
  const r = JSON.parse(lines[0]!) as Record<string, unknown>;
  assert.deepEqual(Object.keys(r).sort(), ["finish_reason", "logprobs", "prompt_token_ids", "text", "token_ids"]);
  assert.deepEqual(r.prompt_token_ids, [9707, 1052]);
  assert.equal((r.token_ids as number[]).length, 4);
  assert.equal(r.finish_reason, "length");
  const lps = r.logprobs as { token_id: number; logprob: number; top_logprobs: { token_id: number; logprob: number }[] }[];
  assert.equal(lps.length, 4);
  lps.forEach((lp, i) => {
    assert.equal(lp.token_id, (r.token_ids as number[])[i]);
    assert.equal(lp.top_logprobs.length, 2);
  });
  const again = JSON.parse(weft("generate", "--model", fixtureModelDir(), "--prompt-ids", "9707,1052", "--max-tokens", "4", "--temperature", "0.7", "--seed", "3", "--ignore-eos", "--json")) as Record<string, unknown>;
  assert.deepEqual(again.token_ids, r.token_ids, "the same seed gives the same tokens");
  assert.ok(!("logprobs" in again), "logprobs only with --logprobs");
  const chat = JSON.parse(weft("generate", "--model", fixtureModelDir(), "--prompt", "Hi", "--chat", "--max-tokens", "2", "--json")) as { prompt_token_ids: number[] };
  assert.deepEqual(chat.prompt_token_ids.slice(0, 3), [151644, 872, 198], "the chat template was applied");
});

test("bench peer --quant refuses a type llama.cpp's quantizer is not asked for, naming those it takes", () => {
  const bad = spawnSync(process.execPath, [CLI, "bench", "peer", "--quant", "q8_0,q3_k", "--dir", tempDir()]);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr.toString(), /unknown type "q3_k" \(have: q8_0, q4_0, q4_1, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k\)/);
});

test("--num-scheduler-steps takes 1 to 64 on serve and bench, refusing others with the range", () => {
  for (const [cmd, v] of [[["serve"], "0"], [["serve"], "65"], [["bench", "--model", "m"], "2.5"]] as const) {
    const bad = spawnSync(process.execPath, [CLI, ...cmd, "--num-scheduler-steps", v]);
    assert.notEqual(bad.status, 0);
    assert.match(bad.stderr.toString(), /--num-scheduler-steps must be an integer from 1 to 64/);
  }
});
