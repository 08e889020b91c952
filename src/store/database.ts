/**
 * API keys with tiers, and per-key token usage, in SQLite. Keys are stored
 * only as SHA-256 hashes: they are 256-bit random strings, so a fast hash is
 * as safe as a slow one and keeps each request's check cheap.
 *
 * Another process (`weft keys`, a backup, a SQLite shell) may hold the
 * database. The CLI waits for it (5 s); the server's background work (the key
 * refresh, usage writes) waits 20 ms at most and retries on its next tick, so
 * a lock never stalls the event loop.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createHash, randomBytes } from "node:crypto";
import Database from "better-sqlite3";

export const TIERS = ["high", "normal", "low"] as const;
export type Tier = (typeof TIERS)[number];

export interface KeyRecord {
  name: string;
  tier: Tier;
  keyHash: string;
  createdAt: string;
  revokedAt: string | null;
  promptTokens: number;
  completionTokens: number;
  requests: number;
}

export interface ActiveKey {
  name: string;
  tier: Tier;
  keyHash: string;
}

/** The keys that may be used now, and how many were ever created (revoked included), read together. */
export interface KeySnapshot {
  active: ActiveKey[];
  everCreated: number;
}

export interface UsageTotals {
  requests: number;
  promptTokens: number;
  completionTokens: number;
}

/** How long a statement waits for another process's lock: brief for the server's background work, patient otherwise. */
export type LockWait = "brief" | "patient";
const BUSY_TIMEOUT_MS: Record<LockWait, number> = { brief: 20, patient: 5000 };

/** Where the store's background problems are reported; a pino logger fits. */
export interface StoreLog {
  warn(fields: Record<string, unknown>, msg: string): void;
  info(fields: Record<string, unknown>, msg: string): void;
}

export const STDERR_LOG: StoreLog = {
  warn: (fields, msg) => process.stderr.write(`weft: ${msg} ${JSON.stringify(fields)}\n`),
  info: (fields, msg) => process.stderr.write(`weft: ${msg} ${JSON.stringify(fields)}\n`),
};

export const DEFAULT_DB_PATH = path.join(os.homedir(), ".weft", "weft.db");
export const KEY_NAME_MAX_LENGTH = 64;
/** Starts the server's own tenant names (the --api-key key's, the keyless caller's); no key name may. */
export const RESERVED_NAME_PREFIX = "@";
/** Control, format (bidi overrides and isolates, zero-width), surrogate, private-use, unassigned, line and paragraph separators. */
const UNPRINTABLE = /[\p{C}\p{Zl}\p{Zp}]/u;

export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

/** Why `name` cannot name a new key, or null when it can. */
export function keyNameProblem(name: string): string | null {
  const chars = [...name];
  if (chars.length === 0) return "it is empty";
  if (chars.length > KEY_NAME_MAX_LENGTH) return `it is longer than ${KEY_NAME_MAX_LENGTH} characters`;
  const bad = chars.find((c) => UNPRINTABLE.test(c));
  if (bad !== undefined) return `it contains ${escapeName(bad)}, a control, format, private-use, unassigned or line-separator character`;
  if (name.trim() !== name) return "it starts or ends with whitespace";
  if (name.startsWith(RESERVED_NAME_PREFIX)) return `names starting with "${RESERVED_NAME_PREFIX}" are reserved for the server`;
  return null;
}

/** `name` with backslashes and unprintable characters escaped as \u{hex}: safe to print, and distinct names stay distinct. */
export function escapeName(name: string): string {
  return name.replace(/\\|[\p{C}\p{Zl}\p{Zp}]/gu, (c) => (c === "\\" ? "\\\\" : `\\u{${c.codePointAt(0)!.toString(16)}}`));
}

export class KeyStore {
  private readonly db: Database.Database;

  constructor(file: string = DEFAULT_DB_PATH) {
    if (file !== ":memory:") fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    this.db = new Database(file, { timeout: BUSY_TIMEOUT_MS.patient });
    this.db.pragma("journal_mode = WAL");
    this.db.exec(`
      CREATE TABLE IF NOT EXISTS api_keys (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        key_hash TEXT NOT NULL UNIQUE,
        tier TEXT NOT NULL CHECK (tier IN ('high', 'normal', 'low')),
        created_at TEXT NOT NULL DEFAULT (datetime('now')),
        revoked_at TEXT
      );
      CREATE TABLE IF NOT EXISTS key_usage (
        key_id INTEGER PRIMARY KEY REFERENCES api_keys(id),
        requests INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0
      );`);
  }

  /** Creates a key; returns the secret, which is never stored. Throws when the name breaks the naming rule. */
  create(name: string, tier: Tier): string {
    const problem = keyNameProblem(name);
    if (problem) throw new Error(`invalid key name "${escapeName(name)}": ${problem}`);
    const key = `weft-${randomBytes(32).toString("base64url")}`;
    try {
      this.db.prepare("INSERT INTO api_keys (name, key_hash, tier) VALUES (?, ?, ?)").run(name, hashKey(key), tier);
    } catch (e) {
      if (String(e).includes("UNIQUE")) throw new Error(`a key named "${escapeName(name)}" already exists`);
      throw e;
    }
    return key;
  }

  list(): KeyRecord[] {
    return this.db.prepare(`
      SELECT k.name, k.tier, k.key_hash AS keyHash, k.created_at AS createdAt, k.revoked_at AS revokedAt,
             COALESCE(u.prompt_tokens, 0) AS promptTokens, COALESCE(u.completion_tokens, 0) AS completionTokens,
             COALESCE(u.requests, 0) AS requests
      FROM api_keys k LEFT JOIN key_usage u ON u.key_id = k.id ORDER BY k.id`).all() as KeyRecord[];
  }

  /**
   * The active keys and the count of keys ever created, in one read. Rows a
   * hand-edited database may hold that no key can match (a name that is not
   * text, a hash that is not 64 hex digits) are left out of `active`.
   */
  snapshot(wait: LockWait = "brief"): KeySnapshot {
    return this.waiting(wait, () => this.db.transaction(() => ({
      active: (this.db.prepare("SELECT name, tier, key_hash AS keyHash FROM api_keys WHERE revoked_at IS NULL").all() as Record<string, unknown>[])
        .filter(isUsableKey),
      everCreated: (this.db.prepare("SELECT COUNT(*) AS n FROM api_keys").get() as { n: number }).n,
    }))());
  }

  revoke(name: string): void {
    const r = this.db.prepare("UPDATE api_keys SET revoked_at = datetime('now') WHERE name = ? AND revoked_at IS NULL").run(name);
    if (r.changes === 0) throw new Error(`no active key named "${escapeName(name)}"`);
  }

  setTier(name: string, tier: Tier): void {
    const r = this.db.prepare("UPDATE api_keys SET tier = ? WHERE name = ?").run(tier, name);
    if (r.changes === 0) throw new Error(`no key named "${escapeName(name)}"`);
  }

  /** Adds per-key totals in one transaction; throws (adding nothing) when the database is busy or failing. Keys that no longer exist are skipped. */
  addUsage(totals: ReadonlyMap<string, UsageTotals>, wait: LockWait = "brief"): void {
    this.waiting(wait, () => {
      const add = this.db.prepare(`
        INSERT INTO key_usage (key_id, requests, prompt_tokens, completion_tokens)
        SELECT id, ?, ?, ? FROM api_keys WHERE name = ?
        ON CONFLICT (key_id) DO UPDATE SET requests = requests + excluded.requests,
          prompt_tokens = prompt_tokens + excluded.prompt_tokens, completion_tokens = completion_tokens + excluded.completion_tokens`);
      // IMMEDIATE takes the write lock up front, so a busy database fails here, within the brief wait.
      this.db.transaction(() => {
        for (const [name, t] of totals) add.run(t.requests, t.promptTokens, t.completionTokens, name);
      }).immediate();
    });
  }

  /** Runs `fn` with the busy timeout of `wait`; the connection's own is the patient one. */
  private waiting<T>(wait: LockWait, fn: () => T): T {
    if (wait === "patient") return fn();
    this.db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS[wait]}`);
    try {
      return fn();
    } finally {
      this.db.pragma(`busy_timeout = ${BUSY_TIMEOUT_MS.patient}`);
    }
  }

  close(): void {
    this.db.close();
  }
}

function isUsableKey(row: Record<string, unknown>): row is Record<string, unknown> & ActiveKey {
  return typeof row.name === "string" && typeof row.keyHash === "string" && /^[0-9a-f]{64}$/.test(row.keyHash);
}
