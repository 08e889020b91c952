/** The forward pass against Hugging Face transformers' fp32 logits and greedy continuations. */
import { test } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { FIXTURES, readReference, readReferenceLogits } from "./helpers.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { ModelRunner } from "../src/runtime/model-runner.js";
import { defaultSamplingParams } from "../src/engine/sampling-params.js";

const BLOCK = 16;

function blocksFor(n: number, offset = 0): number[] {
  return Array.from({ length: Math.ceil(n / BLOCK) }, (_, i) => offset + i * 2 + 1); // scattered: odd ids
}

for (const model of ["tiny-llama", "tiny-qwen3"]) {
  test(`${model}: logits match transformers at every reference position`, async () => {
    const ckpt = loadCheckpoint(path.join(FIXTURES, model));
    const runner = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: BLOCK });
    const refs = readReference(model);
    const logits = readReferenceLogits(model);
    let maxAbs = 0, maxRel = 0;
    for (const [i, ref] of refs.entries()) {
      const expected = logits.get(`logits_${i}`)!;
      const positions = logits.get(`positions_${i}`)!.data as BigInt64Array;
      const out = await runner.execute([{ tokenIds: ref.input_ids, startPosition: 0, blockTable: blocksFor(ref.input_ids.length), sample: null, allLogits: true }]);
      const got = out.logits![0]!;
      const V = ckpt.config.vocab;
      positions.forEach((p, j) => {
        let scale = 0;
        for (let v = 0; v < V; v++) scale = Math.max(scale, Math.abs(expected.data[j * V + v] as number));
        for (let v = 0; v < V; v++) {
          const d = Math.abs(got[Number(p) * V + v]! - (expected.data[j * V + v] as number));
          maxAbs = Math.max(maxAbs, d);
          maxRel = Math.max(maxRel, d / scale);
        }
      });
    }
    console.log(`${model}: max |Δlogit| = ${maxAbs.toExponential(3)}, max relative to logit scale = ${maxRel.toExponential(3)}`);
    assert.ok(maxRel < 1e-4, `relative error ${maxRel} too large`);
  });

  test(`${model}: greedy continuations match transformers`, async () => {
    const ckpt = loadCheckpoint(path.join(FIXTURES, model));
    const runner = await ModelRunner.create(ckpt, { numBlocks: 64, blockSize: BLOCK });
    for (const ref of readReference(model)) {
      const ids = [...ref.input_ids];
      const table = blocksFor(ids.length + ref.greedy_continuation.length);
      const params = defaultSamplingParams({ temperature: 0 });
      let start = 0;
      const generated: number[] = [];
      while (generated.length < ref.greedy_continuation.length) {
        const out = await runner.execute([{
          tokenIds: ids.slice(start), startPosition: start, blockTable: table,
          sample: { params, counter: generated.length, promptIds: ref.input_ids, outputIds: generated },
        }]);
        start = ids.length;
        const next = out.samples[0]!.tokenId;
        generated.push(next);
        ids.push(next);
      }
      assert.deepEqual(generated, ref.greedy_continuation);
    }
  });
}
