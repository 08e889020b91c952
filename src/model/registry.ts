/**
 * Model ids → directories. A `--model` spec is `ID=PATH`, a path, or a
 * Hugging Face repo id (`org/name`), found in the local Hugging Face cache
 * (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub) or
 * downloaded into it.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export interface ModelSpec {
  id: string;
  /** A local directory, or a repo id still to resolve. */
  source: string;
}

export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  const home = env.HF_HOME ?? path.join(os.homedir(), ".cache", "huggingface");
  return path.join(home, "hub");
}

export function parseModelSpec(spec: string): ModelSpec {
  const eq = spec.indexOf("=");
  if (eq > 0) return { id: spec.slice(0, eq), source: spec.slice(eq + 1) };
  if (fs.existsSync(spec)) return { id: path.basename(path.resolve(spec)), source: spec };
  return { id: spec, source: spec };
}

export function isRepoId(s: string): boolean {
  return /^[\w.-]+\/[\w.-]+$/.test(s) && !fs.existsSync(s);
}

/** The snapshot directory of `repo` in the hub cache, if it holds a config.json. */
export function cachedSnapshot(repo: string, revision = "main", cache = hubCacheDir()): string | null {
  const base = path.join(cache, `models--${repo.replace("/", "--")}`);
  const refFile = path.join(base, "refs", revision);
  const commit = fs.existsSync(refFile) ? fs.readFileSync(refFile, "utf8").trim() : revision;
  const dir = path.join(base, "snapshots", commit);
  return fs.existsSync(path.join(dir, "config.json")) ? dir : null;
}
