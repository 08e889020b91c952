/** The Hugging Face hub cache layout: models--org--name/{blobs,snapshots/<commit>,refs/<revision>}. */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

/** HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub. */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  const home = env.HF_HOME ?? path.join(os.homedir(), ".cache", "huggingface");
  return path.join(home, "hub");
}

export function repoCacheDir(repo: string, cache = hubCacheDir()): string {
  return path.join(cache, `models--${repo.replace("/", "--")}`);
}

/** The snapshot directory of `repo` at `revision` (a ref such as main, or a commit) in the hub cache, if there is one. */
export function snapshotDir(repo: string, revision = "main", cache = hubCacheDir()): string | null {
  const base = repoCacheDir(repo, cache);
  const refFile = path.join(base, "refs", revision);
  const commit = fs.existsSync(refFile) ? fs.readFileSync(refFile, "utf8").trim() : revision;
  const dir = path.join(base, "snapshots", commit);
  return fs.existsSync(dir) ? dir : null;
}

/** The snapshot directory of `repo` in the hub cache, if it holds a config.json. */
export function cachedSnapshot(repo: string, revision = "main", cache = hubCacheDir()): string | null {
  const dir = snapshotDir(repo, revision, cache);
  return dir && fs.existsSync(path.join(dir, "config.json")) ? dir : null;
}
