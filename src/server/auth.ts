/**
 * Bearer-key authentication. The active keys are re-read from the database
 * every second, so a revocation or tier change applies within two seconds.
 * The presented key's hash is compared against every active hash with
 * timingSafeEqual and no early exit: the time taken does not depend on which
 * key, if any, matched.
 *
 * A refresh that fails (the database locked or broken) keeps the last keys
 * read, is logged and counted, and is retried on the next tick. Only the
 * first read, at construction, throws: without it there is no key set to
 * fall back on, and guessing "no keys" would turn auth off.
 */
import { timingSafeEqual } from "node:crypto";
import { escapeName, hashKey, keyNameProblem, STDERR_LOG, type KeySnapshot, type KeyStore, type StoreLog, type Tier } from "../store/database.js";
import { Priority } from "../engine/request.js";
import { apiError } from "./errors.js";

export interface Caller {
  /** The rate-limit bucket and prefix-cache salt: the key's name, or one of the reserved tenants below. */
  tenant: string;
  tier: Tier;
  priority: Priority;
  /** Present when the caller used a database key (usage is recorded against it). */
  keyName: string | null;
}

/** The --api-key key's tenant and the keyless caller's: key names cannot start with "@", so no key shares them. */
export const STATIC_TENANT = "@static";
export const ANONYMOUS_TENANT = "@anonymous";

/**
 * A database key's tenant: its name; a name from before the naming rule (it
 * may even start with "@") is escaped under "@key:", so it can equal neither
 * another key's tenant nor a reserved one.
 */
export function tenantOf(name: string): string {
  return keyNameProblem(name) === null ? name : `@key:${escapeName(name)}`;
}

interface KnownKey {
  /** Null for the --api-key key, which is not in the database. */
  name: string | null;
  tenant: string;
  tier: Tier;
}

const TIER_PRIORITY: Record<Tier, Priority> = { high: Priority.HIGH, normal: Priority.NORMAL, low: Priority.LOW };
const REFRESH_MS = 1000;

export class Authenticator {
  private keys: (KnownKey & { hash: Buffer })[] = [];
  /** Keys ever created, revoked ones included: once there is one, auth stays on. */
  private everCreated = 0;
  private timer: NodeJS.Timeout | null = null;
  private readonly staticHash: Buffer | null;
  /** Failed refreshes in the current run of failures. */
  private failing = 0;
  /** Refreshes that failed since the start. */
  refreshFailures = 0;

  constructor(
    private readonly store: KeyStore | null,
    staticKey: string | null = null,
    private readonly log: StoreLog = STDERR_LOG,
  ) {
    this.staticHash = staticKey ? Buffer.from(hashKey(staticKey), "hex") : null;
    if (store) {
      this.load(store.snapshot("patient"));
      this.timer = setInterval(() => this.refresh(), REFRESH_MS);
      this.timer.unref();
    }
  }

  /** Auth is on once any key exists, or a static key was given. */
  get required(): boolean {
    return this.staticHash !== null || this.everCreated > 0;
  }

  authenticate(header: string | undefined): Caller {
    if (!this.required) return { tenant: ANONYMOUS_TENANT, tier: "normal", priority: Priority.NORMAL, keyName: null };
    const match = /^Bearer\s+(\S+)\s*$/i.exec(header ?? "");
    if (!match) throw apiError("invalid_api_key", { detail: "Missing API key: send it as 'Authorization: Bearer <key>'." });
    const presented = Buffer.from(hashKey(match[1]!), "hex");
    let found: KnownKey | null = null;
    for (const k of this.keys) if (timingSafeEqual(k.hash, presented)) found = k;
    if (this.staticHash && timingSafeEqual(this.staticHash, presented)) found ??= { name: null, tenant: STATIC_TENANT, tier: "normal" };
    if (!found) throw apiError("invalid_api_key", { detail: "Incorrect or revoked API key." });
    return { tenant: found.tenant, tier: found.tier, priority: TIER_PRIORITY[found.tier], keyName: found.name };
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
  }

  /** Runs on a timer: must never throw, and never wait long for a lock (the snapshot's wait is brief). */
  private refresh(): void {
    try {
      this.load(this.store!.snapshot());
    } catch (e) {
      this.refreshFailures++;
      if (this.failing++ === 0) this.log.warn({ err: e instanceof Error ? e.message : String(e) }, "API key refresh failed; keeping the last keys read");
      return;
    }
    if (this.failing > 0) this.log.info({ failedAttempts: this.failing }, "API key refresh works again");
    this.failing = 0;
  }

  private load(s: KeySnapshot): void {
    this.keys = s.active.map((k) => ({ name: k.name, tenant: tenantOf(k.name), tier: k.tier, hash: Buffer.from(k.keyHash, "hex") }));
    this.everCreated = s.everCreated;
  }
}
