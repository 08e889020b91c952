/**
 * Batch and file records in the key store's SQLite file (own connection, WAL).
 * A finished batch line is one row of `batch_results`, written in the same
 * transaction as the batch's counters, so after a crash the rows say exactly
 * which lines are done; output and error files are written from these rows at
 * finalization only. `INSERT OR IGNORE` on (batch, line) keeps a line's first
 * result: a line can never be counted twice.
 */
import fs from "node:fs";
import path from "node:path";
import Database from "better-sqlite3";

export const BATCH_STATUSES = ["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"] as const;
export type BatchStatus = (typeof BATCH_STATUSES)[number];
/** Statuses a batch can leave: the runner resumes these at start. */
export const ACTIVE_STATUSES: readonly BatchStatus[] = ["validating", "in_progress", "finalizing", "cancelling"];

export interface FileRecord {
  id: string;
  tenant: string;
  filename: string;
  purpose: string;
  bytes: number;
  createdAt: number;
  path: string;
}

export interface BatchProblem {
  code: string;
  message: string;
  param: string | null;
  line: number | null;
}

export interface BatchRecord {
  id: string;
  tenant: string;
  /** The API key that created it (usage is recorded against it); null without database keys. */
  keyName: string | null;
  endpoint: string;
  inputFileId: string;
  completionWindow: string;
  status: BatchStatus;
  outputFileId: string | null;
  errorFileId: string | null;
  errors: BatchProblem[] | null;
  metadata: Record<string, string> | null;
  createdAt: number;
  inProgressAt: number | null;
  expiresAt: number;
  finalizingAt: number | null;
  completedAt: number | null;
  failedAt: number | null;
  expiredAt: number | null;
  cancellingAt: number | null;
  cancelledAt: number | null;
  total: number;
  completed: number;
  failed: number;
}

/** One finished line: its output (ok) or error-file JSONL line. */
export interface LineResult {
  line: number;
  ok: boolean;
  data: string;
}

const TIMESTAMPS = ["in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at", "cancelled_at"] as const;
/** Each status's timestamp column. */
const STATUS_TIME: Partial<Record<BatchStatus, (typeof TIMESTAMPS)[number]>> = {
  in_progress: "in_progress_at", finalizing: "finalizing_at", completed: "completed_at", failed: "failed_at",
  expired: "expired_at", cancelling: "cancelling_at", cancelled: "cancelled_at",
};

export const now = (): number => Math.floor(Date.now() / 1000);

export class BatchStore {
  private readonly db: Database.Database;

  constructor(file: string) {
    if (file !== ":memory:") fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    this.db = new Database(file, { timeout: 5000 });
    this.db.pragma("journal_mode = WAL");
    // A commit survives the process being killed (it is in the OS's cache); a power loss may lose the last
    // commits, whose lines then run again: results and counters commit together, so none is counted twice.
    this.db.pragma("synchronous = NORMAL");
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS files (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, filename TEXT NOT NULL, purpose TEXT NOT NULL,
        bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL
      );
      CREATE TABLE IF NOT EXISTS batches (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE, tenant TEXT NOT NULL, key_name TEXT, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
        completion_window TEXT NOT NULL, status TEXT NOT NULL, output_file_id TEXT, error_file_id TEXT, errors TEXT, metadata TEXT,
        created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, ${TIMESTAMPS.map((t) => `${t} INTEGER`).join(", ")},
        total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0
      );
      CREATE TABLE IF NOT EXISTS batch_results (
        batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, data TEXT NOT NULL,
        PRIMARY KEY (batch_id, line)
      ) WITHOUT ROWID;`);
  }

  addFile(f: FileRecord): void {
    this.db.prepare("INSERT INTO files (id, tenant, filename, purpose, bytes, created_at, path) VALUES (?, ?, ?, ?, ?, ?, ?)")
      .run(f.id, f.tenant, f.filename, f.purpose, f.bytes, f.createdAt, f.path);
  }

  /** The file, if it exists and belongs to `tenant` (null tenant: any, for the runner and the CLI). */
  file(id: string, tenant: string | null): FileRecord | null {
    const row = this.db.prepare("SELECT id, tenant, filename, purpose, bytes, created_at AS createdAt, path FROM files WHERE id = ?").get(id) as FileRecord | undefined;
    return row && (tenant === null || row.tenant === tenant) ? row : null;
  }

  /** The tenant's files, newest first, after the cursor file `after`. */
  files(tenant: string, o: { purpose?: string; limit: number; after?: string }): FileRecord[] {
    return this.db.prepare(`SELECT id, tenant, filename, purpose, bytes, created_at AS createdAt, path FROM files
      WHERE tenant = @tenant AND (@purpose IS NULL OR purpose = @purpose)
        AND (@after IS NULL OR seq < (SELECT seq FROM files WHERE id = @after)) ORDER BY seq DESC LIMIT @limit`)
      .all({ tenant, purpose: o.purpose ?? null, after: o.after ?? null, limit: o.limit }) as FileRecord[];
  }

  deleteFile(id: string): void {
    this.db.prepare("DELETE FROM files WHERE id = ?").run(id);
  }

  addBatch(b: Pick<BatchRecord, "id" | "tenant" | "keyName" | "endpoint" | "inputFileId" | "completionWindow" | "metadata" | "createdAt" | "expiresAt">): void {
    this.db.prepare(`INSERT INTO batches (id, tenant, key_name, endpoint, input_file_id, completion_window, status, metadata, created_at, expires_at)
      VALUES (?, ?, ?, ?, ?, ?, 'validating', ?, ?, ?)`)
      .run(b.id, b.tenant, b.keyName, b.endpoint, b.inputFileId, b.completionWindow, b.metadata ? JSON.stringify(b.metadata) : null, b.createdAt, b.expiresAt);
  }

  batch(id: string, tenant: string | null): BatchRecord | null {
    const row = this.db.prepare("SELECT * FROM batches WHERE id = ?").get(id) as Record<string, unknown> | undefined;
    return row && (tenant === null || row.tenant === tenant) ? toBatch(row) : null;
  }

  /** Newest first; `tenant` null lists every tenant's (the CLI). */
  batches(tenant: string | null, o: { limit: number; after?: string }): BatchRecord[] {
    return (this.db.prepare(`SELECT * FROM batches WHERE (@tenant IS NULL OR tenant = @tenant)
        AND (@after IS NULL OR seq < (SELECT seq FROM batches WHERE id = @after)) ORDER BY seq DESC LIMIT @limit`)
      .all({ tenant, after: o.after ?? null, limit: o.limit }) as Record<string, unknown>[]).map(toBatch);
  }

  /** Whether an unfinished batch reads this file. */
  fileInUse(fileId: string): boolean {
    return this.db.prepare(`SELECT 1 FROM batches WHERE input_file_id = ? AND status IN (${ACTIVE_STATUSES.map(() => "?").join(", ")}) LIMIT 1`)
      .get(fileId, ...ACTIVE_STATUSES) !== undefined;
  }

  activeBatchIds(): string[] {
    return (this.db.prepare(`SELECT id FROM batches WHERE status IN (${ACTIVE_STATUSES.map(() => "?").join(", ")}) ORDER BY seq`)
      .all(...ACTIVE_STATUSES) as { id: string }[]).map((r) => r.id);
  }

  /** Moves a batch to `status` (stamping its time) only from one of `from`; false when it was elsewhere. */
  transition(id: string, from: readonly BatchStatus[], status: BatchStatus, extra: { total?: number; errors?: BatchProblem[] } = {}): boolean {
    const col = STATUS_TIME[status];
    const r = this.db.prepare(`UPDATE batches SET status = @status${col ? `, ${col} = COALESCE(${col}, @now)` : ""},
        total = COALESCE(@total, total), errors = COALESCE(@errors, errors)
      WHERE id = @id AND status IN (${from.map((s) => `'${s}'`).join(", ")})`)
      .run({ id, status, now: now(), total: extra.total ?? null, errors: extra.errors ? JSON.stringify(extra.errors) : null });
    return r.changes > 0;
  }

  /** Records finished lines and their counts, in one transaction; a line already recorded is left as it was. */
  recordResults(batchId: string, rs: readonly LineResult[]): void {
    const insert = this.db.prepare("INSERT OR IGNORE INTO batch_results (batch_id, line, ok, data) VALUES (?, ?, ?, ?)");
    this.db.transaction(() => {
      let completed = 0, failed = 0;
      for (const r of rs) {
        if (insert.run(batchId, r.line, r.ok ? 1 : 0, r.data).changes === 0) continue;
        if (r.ok) completed++;
        else failed++;
      }
      this.db.prepare("UPDATE batches SET completed = completed + ?, failed = failed + ? WHERE id = ?").run(completed, failed, batchId);
    })();
  }

  doneLines(batchId: string): Set<number> {
    return new Set((this.db.prepare("SELECT line FROM batch_results WHERE batch_id = ?").all(batchId) as { line: number }[]).map((r) => r.line));
  }

  /** The batch's results of one kind, in input order. */
  results(batchId: string, ok: boolean): IterableIterator<{ data: string }> {
    return this.db.prepare("SELECT data FROM batch_results WHERE batch_id = ? AND ok = ? ORDER BY line").iterate(batchId, ok ? 1 : 0) as IterableIterator<{ data: string }>;
  }

  /** Ends a batch: its output files are recorded and its final status set, together. */
  finish(id: string, status: BatchStatus, outputs: { output: FileRecord | null; error: FileRecord | null }): void {
    this.db.transaction(() => {
      for (const f of [outputs.output, outputs.error]) if (f) this.addFile(f);
      this.db.prepare("UPDATE batches SET output_file_id = ?, error_file_id = ? WHERE id = ?").run(outputs.output?.id ?? null, outputs.error?.id ?? null, id);
      this.transition(id, ["finalizing", "cancelling", "in_progress"], status);
    })();
  }

  close(): void {
    this.db.close();
  }
}

function toBatch(r: Record<string, unknown>): BatchRecord {
  const n = (k: string): number | null => (r[k] === null ? null : Number(r[k]));
  return {
    id: String(r.id), tenant: String(r.tenant), keyName: r.key_name === null ? null : String(r.key_name), endpoint: String(r.endpoint),
    inputFileId: String(r.input_file_id), completionWindow: String(r.completion_window), status: r.status as BatchStatus,
    outputFileId: r.output_file_id === null ? null : String(r.output_file_id), errorFileId: r.error_file_id === null ? null : String(r.error_file_id),
    errors: r.errors === null ? null : JSON.parse(String(r.errors)) as BatchProblem[],
    metadata: r.metadata === null ? null : JSON.parse(String(r.metadata)) as Record<string, string>,
    createdAt: Number(r.created_at), inProgressAt: n("in_progress_at"), expiresAt: Number(r.expires_at), finalizingAt: n("finalizing_at"),
    completedAt: n("completed_at"), failedAt: n("failed_at"), expiredAt: n("expired_at"), cancellingAt: n("cancelling_at"), cancelledAt: n("cancelled_at"),
    total: Number(r.total), completed: Number(r.completed), failed: Number(r.failed),
  };
}
