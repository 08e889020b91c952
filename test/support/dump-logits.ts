/** Child process for the ISA test: writes tiny-qwen3's logits for a fixed prompt to argv[2]. */
import fs from "node:fs";
import path from "node:path";
import { FIXTURES, readReference } from "../helpers.js";
import { loadCheckpoint } from "../../src/model/checkpoint.js";
import { ModelRunner } from "../../src/runtime/model-runner.js";

const runner = await ModelRunner.create(loadCheckpoint(path.join(FIXTURES, "tiny-qwen3")), { numBlocks: 8, blockSize: 32 });
const ids = readReference("tiny-qwen3")[1]!.input_ids;
const out = await runner.execute([{ tokenIds: ids, startPosition: 0, blockTable: [3, 1], sample: null, allLogits: true }]);
fs.writeFileSync(process.argv[2]!, out.logits![0]!);
process.stdout.write(runner.info().isa);
