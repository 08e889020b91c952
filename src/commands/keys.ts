/** `weft keys create | list | revoke | set-tier`: API keys in the database. */
import { Command, InvalidArgumentError } from "commander";
import { DEFAULT_DB_PATH, escapeName, KEY_NAME_MAX_LENGTH, KeyStore, RESERVED_NAME_PREFIX, TIERS, type Tier } from "../store/database.js";

function tierArg(v: string): Tier {
  if (!(TIERS as readonly string[]).includes(v)) throw new InvalidArgumentError(`--tier must be one of ${TIERS.join(", ")}`);
  return v as Tier;
}

function withStore<T>(db: string, fn: (s: KeyStore) => T): T {
  const store = new KeyStore(db);
  try {
    return fn(store);
  } finally {
    store.close();
  }
}

export function keysCommand(): Command {
  const keys = new Command("keys").description("manage API keys and their priority tiers");
  const db = ["--db <path>", "SQLite database", DEFAULT_DB_PATH] as const;
  keys.command("create").description("create a key; prints it once, as the last line")
    .requiredOption("--name <name>", `unique key name (the tenant): up to ${KEY_NAME_MAX_LENGTH} printable characters, not starting with "${RESERVED_NAME_PREFIX}"`)
    .requiredOption("--tier <tier>", "high | normal | low", tierArg)
    .option(...db)
    .action((o: { name: string; tier: Tier; db: string }) => {
      const key = withStore(o.db, (s) => s.create(o.name, o.tier));
      console.log(`created key "${escapeName(o.name)}" (tier ${o.tier}); it is shown only now:`);
      console.log(key);
    });
  keys.command("list").description("list keys, tiers and usage").option(...db)
    .action((o: { db: string }) => {
      const rows = withStore(o.db, (s) => s.list());
      if (rows.length === 0) return console.log("no keys");
      console.log("name\ttier\tstatus\trequests\tprompt_tokens\tcompletion_tokens\tcreated");
      for (const r of rows) {
        // Names made before the naming rule may hold control or bidi characters: print them escaped.
        console.log([escapeName(r.name), r.tier, r.revokedAt ? `revoked ${r.revokedAt}` : "active", r.requests, r.promptTokens, r.completionTokens, r.createdAt].join("\t"));
      }
    });
  keys.command("revoke").description("revoke a key (takes effect within two seconds)")
    .requiredOption("--name <name>", "key name").option(...db)
    .action((o: { name: string; db: string }) => {
      withStore(o.db, (s) => s.revoke(o.name));
      console.log(`revoked "${escapeName(o.name)}"`);
    });
  keys.command("set-tier").description("change a key's tier (takes effect within two seconds)")
    .requiredOption("--name <name>", "key name").requiredOption("--tier <tier>", "high | normal | low", tierArg).option(...db)
    .action((o: { name: string; tier: Tier; db: string }) => {
      withStore(o.db, (s) => s.setTier(o.name, o.tier));
      console.log(`"${escapeName(o.name)}" is now tier ${o.tier}`);
    });
  return keys;
}
