/**
 * API keys with tiers, and per-key token usage, in SQLite. Keys are stored
 * only as SHA-256 hashes: they are 256-bit random strings, so a fast hash is
 * as safe as a slow one and keeps each request's check cheap.
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

export const DEFAULT_DB_PATH = path.join(os.homedir(), ".weft", "weft.db");

export function hashKey(key: string): string {
  return createHash("sha256").update(key).digest("hex");
}

export class KeyStore {
  private readonly db: Database.Database;

  constructor(file: string = DEFAULT_DB_PATH) {
    if (file !== ":memory:") fs.mkdirSync(path.dirname(path.resolve(file)), { recursive: true });
    this.db = new Database(file);
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("busy_timeout = 5000");
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

  /** Creates a key; returns the secret, which is never stored. */
  create(name: string, tier: Tier): string {
    const key = `weft-${randomBytes(32).toString("base64url")}`;
    try {
      this.db.prepare("INSERT INTO api_keys (name, key_hash, tier) VALUES (?, ?, ?)").run(name, hashKey(key), tier);
    } catch (e) {
      if (String(e).includes("UNIQUE")) throw new Error(`a key named "${name}" already exists`);
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

  /** Keys ever created, revoked included. */
  count(): number {
    return (this.db.prepare("SELECT COUNT(*) AS n FROM api_keys").get() as { n: number }).n;
  }

  /** Keys that may be used now. */
  active(): { name: string; tier: Tier; keyHash: string }[] {
    return this.db.prepare("SELECT name, tier, key_hash AS keyHash FROM api_keys WHERE revoked_at IS NULL").all() as { name: string; tier: Tier; keyHash: string }[];
  }

  revoke(name: string): void {
    const r = this.db.prepare("UPDATE api_keys SET revoked_at = datetime('now') WHERE name = ? AND revoked_at IS NULL").run(name);
    if (r.changes === 0) throw new Error(`no active key named "${name}"`);
  }

  setTier(name: string, tier: Tier): void {
    const r = this.db.prepare("UPDATE api_keys SET tier = ? WHERE name = ?").run(tier, name);
    if (r.changes === 0) throw new Error(`no key named "${name}"`);
  }

  recordUsage(name: string, promptTokens: number, completionTokens: number): void {
    this.db.prepare(`
      INSERT INTO key_usage (key_id, requests, prompt_tokens, completion_tokens)
      SELECT id, 1, ?, ? FROM api_keys WHERE name = ?
      ON CONFLICT (key_id) DO UPDATE SET requests = requests + 1,
        prompt_tokens = prompt_tokens + excluded.prompt_tokens, completion_tokens = completion_tokens + excluded.completion_tokens`)
      .run(promptTokens, completionTokens, name);
  }

  close(): void {
    this.db.close();
  }
}
