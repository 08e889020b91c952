/**
 * Bearer-key authentication. The active keys are re-read from the database
 * every second, so a revocation or tier change applies within two seconds.
 * The presented key's hash is compared against every active hash with
 * timingSafeEqual and no early exit: the time taken does not depend on which
 * key, if any, matched.
 */
import { timingSafeEqual } from "node:crypto";
import { hashKey, type KeyStore, type Tier } from "../store/database.js";
import { Priority } from "../engine/request.js";
import { ApiError } from "./errors.js";

export interface Caller {
  /** Key name, or "anonymous" when auth is off; the prefix-cache salt. */
  tenant: string;
  tier: Tier;
  priority: Priority;
  /** Present when the caller used a database key (usage is recorded against it). */
  keyName: string | null;
}

const TIER_PRIORITY: Record<Tier, Priority> = { high: Priority.HIGH, normal: Priority.NORMAL, low: Priority.LOW };
const REFRESH_MS = 1000;

export class Authenticator {
  private keys: { name: string; tier: Tier; hash: Buffer }[] = [];
  /** Keys ever created, revoked ones included: once there is one, auth stays on. */
  private everCreated = 0;
  private timer: NodeJS.Timeout | null = null;
  private readonly staticHash: Buffer | null;

  constructor(
    private readonly store: KeyStore | null,
    staticKey: string | null = null,
  ) {
    this.staticHash = staticKey ? Buffer.from(hashKey(staticKey), "hex") : null;
    this.refresh();
    if (store) {
      this.timer = setInterval(() => this.refresh(), REFRESH_MS);
      this.timer.unref();
    }
  }

  /** Auth is on once any key exists, or a static key was given. */
  get required(): boolean {
    return this.staticHash !== null || this.everCreated > 0;
  }

  authenticate(header: string | undefined): Caller {
    if (!this.required) return { tenant: "anonymous", tier: "normal", priority: Priority.NORMAL, keyName: null };
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
    if (!match) throw new ApiError("invalid_api_key", "Missing API key: send it as 'Authorization: Bearer <key>'.");
    const presented = Buffer.from(hashKey(match[1]!), "hex");
    let found: { name: string; tier: Tier } | null = null;
    for (const k of this.keys) if (timingSafeEqual(k.hash, presented)) found = k;
    if (this.staticHash && timingSafeEqual(this.staticHash, presented)) found ??= { name: "static", tier: "normal" };
    if (!found) throw new ApiError("invalid_api_key", "Incorrect or revoked API key.");
    const fromDb = this.keys.some((k) => k.name === found.name);
    return { tenant: found.name, tier: found.tier, priority: TIER_PRIORITY[found.tier], keyName: fromDb ? found.name : null };
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
  }

  private refresh(): void {
    if (!this.store) return;
    this.keys = this.store.active().map((k) => ({ name: k.name, tier: k.tier, hash: Buffer.from(k.keyHash, "hex") }));
    this.everCreated = this.store.count();
  }
}
