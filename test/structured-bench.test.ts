/** `weft bench structured` on the tiny fixture: both sides decode the same token counts, and the report is consistent. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { structuredBench } from "../src/bench/structured-bench.js";
import { tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";

test("structured bench: JSON-schema and unconstrained requests generate the same tokens; ratio and JSON written", async () => {
  const json = path.join(tempDir(), "structured.json");
  const r = await structuredBench({ model: fixtureModelDir(), concurrency: 3, outputLen: 12, rounds: 1, temperature: 0, json, quiet: true });
  const [constrained, free] = r.results;
  assert.equal(constrained!.side, "json_schema");
  assert.equal(free!.side, "unconstrained");
  assert.equal(constrained!.requests, 3);
  assert.equal(constrained!.completion_tokens, free!.completion_tokens);
  assert.ok(constrained!.completion_tokens > 0 && constrained!.completion_tokens <= 36);
  assert.ok(Math.abs(r.ratio - constrained!.output_tokens_per_second / free!.output_tokens_per_second) < 0.01);
  assert.deepEqual(JSON.parse(fs.readFileSync(json, "utf8")).ratio, r.ratio);
  assert.ok(r.machine.cpu.length > 0);
});
