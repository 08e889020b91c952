/**
 * `--model org/repo:QUANT`: one GGUF file of a Hugging Face repo of GGUF files,
 * picked by the quantization tag in its name (`Qwen/Qwen3-0.6B-GGUF:Q8_0` →
 * `Qwen3-0.6B-Q8_0.gguf`), from the hub cache or downloaded into it with progress.
 */
import fs from "node:fs";
import path from "node:path";
import { hubCacheDir, snapshotDir } from "./hub-cache.js";
import { downloadFiles, listRepoFiles, type DownloadOptions } from "./download.js";

/** `org/repo:TAG` → its parts, or null when `spec` is not of that form. */
export function parseQuantSpec(spec: string): { repo: string; tag: string } | null {
  const m = /^([\w.-]+\/[\w.-]+):([\w.-]+)$/.exec(spec);
  return m ? { repo: m[1]!, tag: m[2]! } : null;
}

/** The file's name without folders and `.gguf`, lower case. */
function stem(file: string): string {
  return path.basename(file).replace(/\.gguf$/i, "").toLowerCase();
}

/**
 * Whether the file's name carries `tag` (case-insensitive) as a whole tag: after the start or a
 * `-`, `_` or `.`, and before the end or a `-` or `.` (not `_`, so that Q4_K does not pick Q4_K_M).
 */
export function fileHasTag(file: string, tag: string): boolean {
  const t = tag.toLowerCase().replace(/[.]/g, "\\.");
  return new RegExp(`(^|[-_.])${t}($|[-.])`).test(stem(file));
}

/** The quantization tags in GGUF file names (Q8_0, Q4_K_M, IQ4_XS, BF16, ...), for error messages. */
export function quantTags(files: string[]): string[] {
  const tags = new Set<string>();
  for (const f of files) {
    const m = /(?:^|[-_.])(i?q\d+(?:_[a-z0-9]+)*|bf16|fp?16|fp?32)(?=$|[-.])/i.exec(path.basename(f).replace(/\.gguf$/i, ""));
    if (m) tags.add(m[1]!.toUpperCase());
  }
  return [...tags].sort();
}

/** The one GGUF file among `files` tagged `tag`; throws naming the tags there are, or the files that tie. */
export function pickQuantFile(repo: string, tag: string, files: string[]): string {
  const ggufs = files.filter((f) => f.toLowerCase().endsWith(".gguf"));
  const hits = ggufs.filter((f) => fileHasTag(f, tag));
  if (hits.length === 1) return hits[0]!;
  if (hits.length > 1) throw new Error(`${repo}: ${hits.length} GGUF files match ${tag} (${hits.join(", ")}); serve one of them by its path`);
  if (ggufs.length === 0) throw new Error(`${repo} has no GGUF files`);
  throw new Error(`${repo} has no GGUF file tagged ${tag} (tags there: ${quantTags(ggufs).join(", ") || "none"}; files: ${ggufs.join(", ")})`);
}

/** The GGUF files under a snapshot directory, relative to it. */
function cachedGgufs(dir: string): string[] {
  return (fs.readdirSync(dir, { recursive: true }) as string[]).filter((f) => f.toLowerCase().endsWith(".gguf"));
}

/**
 * The path of `repo`'s GGUF file tagged `tag`: from the hub cache when the cached snapshot holds one
 * (no network), else picked from the repo's file list and downloaded into the cache.
 */
export async function resolveQuantFile(repo: string, tag: string, o: DownloadOptions = {}): Promise<string> {
  const cached = snapshotDir(repo, o.revision, o.cacheDir ?? hubCacheDir());
  if (cached) {
    const local = cachedGgufs(cached);
    const hits = local.filter((f) => fileHasTag(f, tag));
    if (hits.length > 0) return path.join(cached, pickQuantFile(repo, tag, local));
  }
  const file = pickQuantFile(repo, tag, await listRepoFiles(repo, o));
  return path.join(await downloadFiles(repo, [file], o), file);
}
