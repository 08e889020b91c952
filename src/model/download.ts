/**
 * Downloads a model repo from the Hugging Face hub (HF_ENDPOINT, HF_TOKEN
 * honoured) into the hub cache layout — blobs/, snapshots/<commit>/, refs/ —
 * so transformers, huggingface-cli and Weft share one cache.
 */
import fs from "node:fs";
import path from "node:path";
import { downloadFile, listFiles, pathsInfo } from "@huggingface/hub";
import { hubCacheDir, repoCacheDir } from "./hub-cache.js";

/** The files a checkpoint needs; everything else in the repo is skipped. */
const WANTED = /^(config\.json|generation_config\.json|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|model\.safetensors\.index\.json|[^/]*\.safetensors)$/;

export interface DownloadOptions {
  revision?: string;
  cacheDir?: string;
  hubUrl?: string;
  token?: string;
  /** Progress lines go here (a bar on a terminal). */
  progress?: NodeJS.WritableStream & { isTTY?: boolean };
  log?: (msg: string) => void;
}

class ProgressBar {
  private lastPct = -1;
  constructor(
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean },
    private readonly label: string,
    private readonly total: number,
  ) {}

  update(done: number): void {
    const pct = this.total > 0 ? Math.floor((done / this.total) * 100) : 100;
    if (pct === this.lastPct || (!this.out.isTTY && pct % 10 !== 0)) return;
    this.lastPct = pct;
    const width = 30, filled = Math.round((pct / 100) * width);
    const mb = (n: number): string => (n / 1e6).toFixed(1);
    const line = `[${"#".repeat(filled)}${"-".repeat(width - filled)}] ${String(pct).padStart(3)}% ${this.label} ${mb(done)}/${mb(this.total)} MB`;
    this.out.write(this.out.isTTY ? `\r${line}${pct === 100 ? "\n" : ""}` : `${line}\n`);
  }
}

/** The hub address, token and credentials `@huggingface/hub` calls take. */
function hubCreds(repo: string, o: DownloadOptions): { repo: string; hubUrl: string; accessToken?: string } {
  const hubUrl = o.hubUrl ?? process.env.HF_ENDPOINT ?? "https://huggingface.co";
  const accessToken = o.token ?? process.env.HF_TOKEN;
  return { repo, hubUrl, ...(accessToken ? { accessToken } : {}) };
}

/** Every file path in the repo at `o.revision` (default main). */
export async function listRepoFiles(repo: string, o: DownloadOptions = {}): Promise<string[]> {
  const files: string[] = [];
  for await (const entry of listFiles({ ...hubCreds(repo, o), revision: o.revision ?? "main", recursive: true })) {
    if (entry.type === "file") files.push(entry.path);
  }
  return files;
}

export async function downloadModel(repo: string, o: DownloadOptions = {}): Promise<string> {
  const files = (await listRepoFiles(repo, o)).filter((f) => WANTED.test(f));
  if (!files.includes("config.json")) throw new Error(`${repo}@${o.revision ?? "main"} has no config.json`);
  return downloadFiles(repo, files, o);
}

/** Downloads `files` of the repo (those not cached yet) into its snapshot, with progress; returns the snapshot directory. */
export async function downloadFiles(repo: string, files: string[], o: DownloadOptions = {}): Promise<string> {
  const revision = o.revision ?? "main";
  const creds = hubCreds(repo, o);
  const progress = o.progress ?? process.stderr;
  const storage = repoCacheDir(repo, o.cacheDir ?? hubCacheDir());
  const infos = await pathsInfo({ ...creds, revision, paths: files, expand: true });
  const commit = infos.find((i) => i.lastCommit)?.lastCommit?.id ?? revision;
  const snapshot = path.join(storage, "snapshots", commit);
  o.log?.(`downloading ${repo}@${revision} (${files.length} files) into ${snapshot}`);
  for (const info of infos) {
    const etag = info.lfs?.oid ?? info.oid;
    if (!etag) throw new Error(`${repo}: the hub gave no hash for ${info.path}`);
    const blob = path.join(storage, "blobs", etag);
    const link = path.join(snapshot, info.path);
    fs.mkdirSync(path.dirname(blob), { recursive: true });
    fs.mkdirSync(path.dirname(link), { recursive: true });
    if (!fs.existsSync(blob)) await fetchBlob(repo, info.path, commit, creds, blob, new ProgressBar(progress, info.path, info.size));
    if (!fs.existsSync(link)) fs.symlinkSync(path.relative(path.dirname(link), blob), link);
  }
  fs.mkdirSync(path.join(storage, "refs"), { recursive: true });
  if (commit !== revision) fs.writeFileSync(path.join(storage, "refs", revision), commit);
  return snapshot;
}

async function fetchBlob(repo: string, file: string, revision: string, creds: { repo: string; hubUrl: string; accessToken?: string },
  dest: string, bar: ProgressBar): Promise<void> {
  const blob = await downloadFile({ ...creds, path: file, revision, xet: false });
  if (!blob) throw new Error(`${repo}: ${file} not found`);
  const tmp = `${dest}.incomplete`;
  const out = fs.createWriteStream(tmp);
  let done = 0;
  bar.update(0);
  const reader = blob.stream().getReader();
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    done += value.byteLength;
    if (!out.write(value)) await new Promise<void>((r) => out.once("drain", () => r()));
    bar.update(done);
  }
  await new Promise<void>((resolve, reject) => out.end((e?: Error | null) => (e ? reject(e) : resolve())));
  fs.renameSync(tmp, dest);
}
