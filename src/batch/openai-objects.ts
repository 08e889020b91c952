/** Batch and file records as OpenAI's File and Batch objects, and its list shape. */
import type { BatchRecord, FileRecord } from "../store/batch-store.js";

type Json = Record<string, unknown>;

export function fileObject(f: FileRecord): Json {
  return { id: f.id, object: "file", bytes: f.bytes, created_at: f.createdAt, filename: f.filename, purpose: f.purpose, status: "processed", expires_at: null, status_details: null };
}

export function batchObject(b: BatchRecord): Json {
  return {
    id: b.id, object: "batch", endpoint: b.endpoint, errors: b.errors ? { object: "list", data: b.errors } : null,
    input_file_id: b.inputFileId, completion_window: b.completionWindow, status: b.status,
    output_file_id: b.outputFileId, error_file_id: b.errorFileId, created_at: b.createdAt, in_progress_at: b.inProgressAt,
    expires_at: b.expiresAt, finalizing_at: b.finalizingAt, completed_at: b.completedAt, failed_at: b.failedAt,
    expired_at: b.expiredAt, cancelling_at: b.cancellingAt, cancelled_at: b.cancelledAt,
    request_counts: { total: b.total, completed: b.completed, failed: b.failed }, metadata: b.metadata,
  };
}

/** A page of a list; `rows` holds up to limit + 1 items, the extra one only telling that there are more. */
export function listPage<T extends { id: string }>(rows: T[], limit: number, toObject: (r: T) => Json): Json {
  const page = rows.slice(0, limit);
  return { object: "list", data: page.map(toObject), first_id: page[0]?.id ?? null, last_id: page.at(-1)?.id ?? null, has_more: rows.length > limit };
}
