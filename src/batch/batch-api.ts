/**
 * OpenAI's Files and Batches routes. Every file and batch belongs to the
 * caller's tenant: another tenant gets the same 404 as for an id that does not
 * exist. Uploads are streamed to disk, refused past the size limit. The batch
 * runner starts when the server is ready and is stopped before the engines on
 * shutdown (`stop`); its database connection closes with the server.
 */
import { randomBytes } from "node:crypto";
import fs from "node:fs";
import type { FastifyInstance, FastifyRequest } from "fastify";
import multipart from "@fastify/multipart";
import type { Logger } from "pino";
import type { EngineManager } from "../engine/engine-manager.js";
import type { Caller } from "../server/auth.js";
import { apiError, invalid } from "../server/errors.js";
import type { UsageSink } from "../server/generation.js";
import type { ChatSettings } from "../server/chat-settings.js";
import { BatchStore, now, type BatchRecord, type FileRecord } from "../store/batch-store.js";
import { BATCH_ENDPOINTS } from "./batch-input.js";
import { BatchRunner } from "./batch-runner.js";
import { FileStorage, FileTooLarge, newFileId } from "./file-storage.js";
import { batchObject, fileObject, listPage } from "./openai-objects.js";

export interface BatchOptions {
  /** The SQLite database (the key store's file). */
  dbFile: string;
  /** Where file contents are kept. */
  dataDir: string;
  /** Largest uploaded file, bytes. */
  maxFileBytes: number;
}

export interface BatchApiDeps extends BatchOptions {
  manager: EngineManager;
  usage: UsageSink | null;
  log: Logger;
  /** The chat template and parsers the HTTP routes use. */
  chat: ChatSettings;
}

export interface BatchApi {
  /** Feeds no more batch lines (call before the engines shut down). */
  stop(): void;
}

const COMPLETION_WINDOW_S = 24 * 3600;
const METADATA_MAX_KEYS = 16, METADATA_KEY_CHARS = 64, METADATA_VALUE_CHARS = 512;
type Query = Record<string, string | undefined>;

export function registerBatchApi(app: FastifyInstance, d: BatchApiDeps): BatchApi {
  const store = new BatchStore(d.dbFile);
  const files = new FileStorage(d.dataDir);
  const runner = new BatchRunner({ manager: d.manager, store, files, usage: d.usage, log: d.log, chat: d.chat });
  app.addHook("onReady", async () => runner.start());
  app.addHook("onClose", async () => {
    runner.stop();
    await runner.closed();
    store.close();
  });
  void app.register(async (scope) => {
    await scope.register(multipart, { limits: { fileSize: d.maxFileBytes, files: 1, fields: 8, parts: 16, fieldSize: 1024 } });
    fileRoutes(scope, store, files, d.maxFileBytes);
    batchRoutes(scope, store, runner);
  });
  return { stop: () => runner.stop() };
}

const key = { config: { access: "key" as const } };

function callerOf(req: FastifyRequest): Caller {
  if (!req.caller) throw new Error(`route ${req.routeOptions.url ?? "?"} reached without an authenticated caller`);
  return req.caller;
}

const idParam = (req: FastifyRequest): string => (req.params as Record<string, string>).id ?? "";

function limitParam(q: Query, def: number, max: number): number {
  if (q.limit === undefined) return def;
  const n = Number(q.limit);
  if (!Number.isInteger(n) || n < 1 || n > max) throw invalid("limit", `must be an integer between 1 and ${max}`);
  return n;
}

function fileRoutes(app: FastifyInstance, store: BatchStore, files: FileStorage, maxBytes: number): void {
  const owned = (req: FastifyRequest): FileRecord => {
    const f = store.file(idParam(req), callerOf(req).tenant);
    if (!f) throw apiError("file_not_found", { id: idParam(req) }, { param: "file_id" });
    return f;
  };
  app.post("/v1/files", key, async (req) => fileObject(await upload(req, store, files, maxBytes)));
  app.get("/v1/files", key, async (req) => {
    const q = req.query as Query, limit = limitParam(q, 10_000, 10_000);
    const rows = store.files(callerOf(req).tenant, { limit: limit + 1, ...(q.purpose ? { purpose: q.purpose } : {}), ...(q.after ? { after: q.after } : {}) });
    return listPage(rows, limit, fileObject);
  });
  app.get("/v1/files/:id", key, async (req) => fileObject(owned(req)));
  app.get("/v1/files/:id/content", key, async (req, reply) => reply.type("application/octet-stream").send(fs.createReadStream(files.pathOf(owned(req)))));
  app.delete("/v1/files/:id", key, async (req) => {
    const f = owned(req);
    if (store.fileInUse(f.id)) throw apiError("file_in_use", { id: f.id }, { param: "file_id" });
    store.deleteFile(f.id);
    files.remove(f);
    return { id: f.id, object: "file", deleted: true };
  });
}

/** Reads the multipart form (`purpose`, `file`, in any order), the file streamed to disk. */
async function upload(req: FastifyRequest, store: BatchStore, files: FileStorage, maxBytes: number): Promise<FileRecord> {
  if (!req.isMultipart()) throw invalid("file", "send multipart/form-data with the fields 'purpose' and 'file'");
  let purpose: string | null = null, saved: FileRecord | null = null;
  for await (const part of req.parts()) {
    if (part.type === "field") {
      if (part.fieldname === "purpose") purpose = String(part.value);
      continue;
    }
    if (part.fieldname !== "file") {
      part.file.resume();
      continue;
    }
    const id = newFileId();
    try {
      const { path, bytes } = await files.write(id, part.file, () => part.file.truncated);
      saved = { id, tenant: callerOf(req).tenant, filename: part.filename || "upload.jsonl", purpose: "", bytes, createdAt: now(), path };
    } catch (e) {
      if (e instanceof FileTooLarge || (e as { code?: string }).code === "FST_REQ_FILE_TOO_LARGE") throw apiError("file_too_large", { limit: maxBytes }, { param: "file" });
      throw e;
    }
  }
  const discard = (): void => { if (saved) files.remove(saved); };
  if (purpose !== "batch") {
    discard();
    throw invalid("purpose", purpose === null ? "is required" : "must be 'batch' (the only purpose served)");
  }
  if (!saved) throw invalid("file", "is required");
  saved.purpose = purpose;
  store.addFile(saved);
  return saved;
}

function batchRoutes(app: FastifyInstance, store: BatchStore, runner: BatchRunner): void {
  const owned = (req: FastifyRequest): BatchRecord => {
    const b = store.batch(idParam(req), callerOf(req).tenant);
    if (!b) throw apiError("batch_not_found", { id: idParam(req) }, { param: "batch_id" });
    return b;
  };
  app.post("/v1/batches", key, async (req) => {
    const id = createBatch(store, callerOf(req), req.body);
    runner.run(id);
    return batchObject(store.batch(id, null)!);
  });
  app.get("/v1/batches", key, async (req) => {
    const q = req.query as Query, limit = limitParam(q, 20, 100);
    return listPage(store.batches(callerOf(req).tenant, { limit: limit + 1, ...(q.after ? { after: q.after } : {}) }), limit, batchObject);
  });
  app.get("/v1/batches/:id", key, async (req) => batchObject(owned(req)));
  app.post("/v1/batches/:id/cancel", key, async (req) => {
    const b = owned(req);
    if (b.status !== "cancelling" && !store.transition(b.id, ["validating", "in_progress"], "cancelling")) {
      throw apiError("batch_not_cancellable", { status: b.status });
    }
    runner.cancelled(b.id);
    return batchObject(store.batch(b.id, null)!);
  });
}

/** Checks a create-batch body and records the batch (status validating); returns its id. */
function createBatch(store: BatchStore, caller: Caller, raw: unknown): string {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) throw invalid("body", "must be a JSON object");
  const body = raw as Record<string, unknown>;
  if (typeof body.input_file_id !== "string") throw invalid("input_file_id", "is required");
  const input = store.file(body.input_file_id, caller.tenant);
  if (!input) throw apiError("file_not_found", { id: body.input_file_id }, { param: "input_file_id" });
  if (input.purpose !== "batch") throw invalid("input_file_id", "the file's purpose must be 'batch'");
  if (typeof body.endpoint !== "string" || !(body.endpoint in BATCH_ENDPOINTS)) throw invalid("endpoint", `must be one of ${Object.keys(BATCH_ENDPOINTS).join(", ")}`);
  if (body.completion_window !== "24h") throw invalid("completion_window", "must be '24h'");
  const created = now(), id = `batch_${randomBytes(12).toString("hex")}`;
  store.addBatch({
    id, tenant: caller.tenant, keyName: caller.keyName, endpoint: body.endpoint, inputFileId: input.id, completionWindow: "24h",
    metadata: metadata(body.metadata), createdAt: created, expiresAt: created + COMPLETION_WINDOW_S,
  });
  return id;
}

function metadata(m: unknown): Record<string, string> | null {
  if (m === undefined || m === null) return null;
  if (typeof m !== "object" || Array.isArray(m)) throw invalid("metadata", "must be an object of strings");
  const entries = Object.entries(m as Record<string, unknown>);
  if (entries.length > METADATA_MAX_KEYS) throw invalid("metadata", `may have at most ${METADATA_MAX_KEYS} keys`);
  for (const [k, v] of entries) {
    if (k.length > METADATA_KEY_CHARS) throw invalid("metadata", `keys may have at most ${METADATA_KEY_CHARS} characters`);
    if (typeof v !== "string" || v.length > METADATA_VALUE_CHARS) throw invalid("metadata", `values must be strings of at most ${METADATA_VALUE_CHARS} characters`);
  }
  return Object.fromEntries(entries) as Record<string, string>;
}
