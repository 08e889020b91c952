/**
 * File contents under the data directory, one file per File object, named by
 * its id. A file is written under a temporary name, fsync'd and renamed, so a
 * file's record never points at a partial file.
 */
import fs from "node:fs";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { randomBytes } from "node:crypto";
import type { Readable } from "node:stream";
import { now, type BatchRecord, type FileRecord } from "../store/batch-store.js";

/** The data directory when --data-dir is not given: a files/ folder next to the database. */
export function defaultDataDir(dbFile: string): string {
  return path.join(path.dirname(path.resolve(dbFile)), "files");
}

export const newFileId = (): string => `file-${randomBytes(12).toString("hex")}`;

export class FileStorage {
  constructor(readonly dir: string) {
    fs.mkdirSync(dir, { recursive: true });
  }

  pathOf(f: FileRecord): string {
    return path.join(this.dir, f.path);
  }

  /** Streams `source` to a new file; `tooLarge` is checked after the copy (the source stops at the size limit). */
  async write(id: string, source: Readable, tooLarge: () => boolean): Promise<{ path: string; bytes: number }> {
    const name = `${id}.jsonl`, tmp = path.join(this.dir, `${name}.part`);
    try {
      await pipeline(source, fs.createWriteStream(tmp));
      if (tooLarge()) throw new FileTooLarge();
      fsyncFile(tmp);
      fs.renameSync(tmp, path.join(this.dir, name));
    } finally {
      fs.rmSync(tmp, { force: true });
    }
    return { path: name, bytes: fs.statSync(path.join(this.dir, name)).size };
  }

  /** Writes `lines` as a JSONL file of the batch's tenant, durably; null when there are none. */
  writeLines(b: BatchRecord, purpose: string, lines: Iterable<{ data: string }>): FileRecord | null {
    const id = newFileId(), name = `${id}.jsonl`, tmp = path.join(this.dir, `${name}.part`);
    const fd = fs.openSync(tmp, "w");
    let bytes = 0, chunk: string[] = [], chunkBytes = 0;
    const flush = (): void => {
      bytes += fs.writeSync(fd, chunk.join(""));
      chunk = [];
      chunkBytes = 0;
    };
    try {
      for (const { data } of lines) {
        chunk.push(data + "\n");
        chunkBytes += data.length;
        if (chunkBytes > 1 << 20) flush();
      }
      flush();
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    if (bytes === 0) {
      fs.rmSync(tmp);
      return null;
    }
    fs.renameSync(tmp, path.join(this.dir, name));
    return { id, tenant: b.tenant, filename: `${b.id}_${purpose === "batch_output" ? "output" : "error"}.jsonl`, purpose, bytes, createdAt: now(), path: name };
  }

  remove(f: FileRecord): void {
    fs.rmSync(this.pathOf(f), { force: true });
  }
}

export class FileTooLarge extends Error {}

function fsyncFile(file: string): void {
  const fd = fs.openSync(file, "r");
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}
