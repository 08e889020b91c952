/**
 * Model ids → directories and files. A `--model` spec is `ID=PATH`, a path, a
 * Hugging Face repo id (`org/name`), or a repo of GGUF files with a
 * quantization tag (`org/name:Q8_0`): a local directory or .gguf file is used
 * as it is; a repo is found in the hub cache, or downloaded into it.
 */
import fs from "node:fs";
import path from "node:path";
import { cachedSnapshot } from "./hub-cache.js";
import { downloadModel, type DownloadOptions } from "./download.js";
import { parseQuantSpec, resolveQuantFile } from "./hub-gguf.js";

export interface ModelSpec {
  id: string;
  /** A local directory or a repo id. */
  source: string;
}

export function parseModelSpec(spec: string): ModelSpec {
  const eq = spec.indexOf("=");
  if (eq > 0) return { id: spec.slice(0, eq), source: spec.slice(eq + 1) };
  if (fs.existsSync(spec)) return { id: path.basename(path.resolve(spec)), source: spec };
  return { id: spec, source: spec };
}

function isRepoId(s: string): boolean {
  return /^[\w.-]+\/[\w.-]+$/.test(s) && !fs.existsSync(s);
}

/** The model directory (or GGUF file) for `source`: local, cached, or freshly downloaded. */
export async function resolveModelSource(source: string, o: DownloadOptions = {}): Promise<string> {
  if (source.endsWith(".gguf") && fs.statSync(source, { throwIfNoEntry: false })?.isFile()) return path.resolve(source);
  const quant = fs.existsSync(source) ? null : parseQuantSpec(source);
  if (quant) return resolveQuantFile(quant.repo, quant.tag, o);
  let dir = source;
  if (isRepoId(source)) dir = cachedSnapshot(source, o.revision, o.cacheDir) ?? (await downloadModel(source, o));
  if (!fs.existsSync(path.join(dir, "config.json"))) throw new Error(`no config.json in ${dir}`);
  return path.resolve(dir);
}
