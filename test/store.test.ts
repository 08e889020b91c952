/**
 * The key store under contention and hostile input, on real SQLite files: another process holding
 * or breaking the database never stalls or crashes the server (usage lands later, exactly; auth keeps
 * the last good keys); key names are printable; the server's own tenants never collide with a key's.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import path from "node:path";
import { Writable } from "node:stream";
import Database from "better-sqlite3";
import { pino } from "pino";
import { ANONYMOUS_TENANT, Authenticator, STATIC_TENANT, tenantOf } from "../src/server/auth.js";
import { ApiError } from "../src/server/errors.js";
import { hashKey, KEY_NAME_MAX_LENGTH, keyNameProblem, KeyStore, type StoreLog } from "../src/store/database.js";
import { UsageRecorder } from "../src/store/usage-recorder.js";
import { ROOT, tempDir } from "./helpers.js";
import { startServer } from "./support/server.js";

const CLI = path.join(ROOT, "dist", "src", "cli.js");

/** A real pino logger whose lines are kept. */
function capturedLog(): { log: StoreLog; lines: { level: number; msg: string }[] } {
  const lines: { level: number; msg: string }[] = [];
  const sink = new Writable({ write(chunk: Buffer, _enc, cb) { for (const l of chunk.toString().trim().split("\n")) lines.push(JSON.parse(l) as { level: number; msg: string }); cb(); } });
  return { log: pino({ base: undefined }, sink), lines };
}

const count = (lines: { msg: string }[], msg: string): number => lines.filter((l) => l.msg === msg).length;
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function eventually(check: () => boolean, ms: number, what: string): Promise<void> {
  const start = Date.now();
  while (!check()) {
    assert.ok(Date.now() - start < ms, `${what} did not happen within ${ms} ms`);
    await sleep(20);
  }
}

/**
 * Another process holding the database in a write transaction (BEGIN EXCLUSIVE: writers get
 * SQLITE_BUSY; WAL readers still read). "break" first renames api_keys away, so every read of the
 * keys fails too. It lets go (restoring the table) when its stdin ends, or by itself after
 * `releaseAfterMs`.
 */
async function holdDatabase(file: string, how: "lock" | "break", releaseAfterMs = 0): Promise<{ release(): Promise<void> }> {
  const script = `
    const Database = require("better-sqlite3");
    const [file, how, after] = process.argv.slice(1);
    const db = new Database(file, { timeout: 5000 });
    if (how === "break") db.exec("ALTER TABLE api_keys RENAME TO api_keys_hidden");
    db.exec("BEGIN EXCLUSIVE");
    process.stdout.write("held\\n");
    const release = () => {
      if (how === "break") db.exec("ALTER TABLE api_keys_hidden RENAME TO api_keys");
      db.exec("COMMIT");
      db.close();
      process.exit(0);
    };
    if (Number(after) > 0) setTimeout(release, Number(after));
    process.stdin.on("data", () => {}).on("end", release);`;
  const child = spawn(process.execPath, ["-e", script, file, how, String(releaseAfterMs)], { cwd: ROOT, stdio: ["pipe", "pipe", "inherit"] });
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  await new Promise<void>((resolve, reject) => {
    child.stdout.once("data", () => resolve());
    void exited.then((code) => reject(new Error(`the lock holder exited (${code}) before holding the database`)));
  });
  return {
    async release() {
      child.stdin.end();
      assert.equal(await exited, 0, "the lock holder failed to let go");
    },
  };
}

/** Measures the longest gap between ticks of a 5 ms interval: how long the event loop was blocked. */
function probeEventLoop(): { stop(): { ticks: number; maxGapMs: number } } {
  let last = performance.now(), maxGapMs = 0, ticks = 0;
  const timer = setInterval(() => {
    const now = performance.now();
    maxGapMs = Math.max(maxGapMs, now - last);
    last = now;
    ticks++;
  }, 5);
  return {
    stop() {
      clearInterval(timer);
      // A block still going on when the probe stops has produced no tick yet: count it too.
      return { ticks, maxGapMs: Math.max(maxGapMs, performance.now() - last) };
    },
  };
}

function usageOf(file: string, name: string): { requests: number; prompt: number; completion: number } {
  const db = new Database(file, { readonly: true });
  try {
    const row = db.prepare(`SELECT u.requests, u.prompt_tokens AS prompt, u.completion_tokens AS completion
      FROM api_keys k JOIN key_usage u ON u.key_id = k.id WHERE k.name = ?`).get(name) as { requests: number; prompt: number; completion: number } | undefined;
    return row ?? { requests: 0, prompt: 0, completion: 0 };
  } finally {
    db.close();
  }
}

function newStore(): { store: KeyStore; file: string } {
  const file = path.join(tempDir(), "weft.db");
  return { store: new KeyStore(file), file };
}

// A lock held by a writer blocks the event loop for the whole busy timeout on each write with the
// old 5 s wait; the bound below is far under that and well over scheduling noise on a loaded host.
const MAX_LOOP_GAP_MS = 400;

test("usage recorded while another process holds the write lock: record() returns at once, the loop keeps ticking, and the totals land exactly once it lets go", async () => {
  const { store, file } = newStore();
  const { log, lines } = capturedLog();
  const alice = store.create("alice", "normal");
  store.create("bob", "low");
  const usage = new UsageRecorder(store, { flushMs: 50, log });
  const auth = new Authenticator(store, null, log);
  const holder = await holdDatabase(file, "lock");
  const probe = probeEventLoop();
  let n = 0, slowestRecordMs = 0;
  const until = Date.now() + 1200;
  while (Date.now() < until) {
    const t = performance.now();
    usage.record("alice", 3, 5);
    usage.record("bob", 7, 11);
    slowestRecordMs = Math.max(slowestRecordMs, performance.now() - t);
    n++;
    assert.equal(auth.authenticate(`Bearer ${alice}`).tenant, "alice");
    await sleep(10);
  }
  const loop = probe.stop();
  assert.ok(slowestRecordMs < 10, `a record() call took ${slowestRecordMs.toFixed(1)} ms`);
  assert.ok(loop.maxGapMs < MAX_LOOP_GAP_MS, `the event loop was blocked for ${loop.maxGapMs.toFixed(0)} ms`);
  assert.ok(usage.failedWrites >= 5, `only ${usage.failedWrites} writes were tried under the lock`);
  assert.equal(usage.pendingKeys, 2, "the queue holds one entry per key");
  assert.equal(count(lines, "usage write failed; retrying every tick"), 1, "a run of failures is logged once");
  assert.deepEqual(usageOf(file, "alice"), { requests: 0, prompt: 0, completion: 0 }, "nothing written under the lock");
  assert.equal(auth.refreshFailures, 0, "a writer does not block WAL readers: the key refresh kept working");

  await holder.release();
  await eventually(() => usage.pendingKeys === 0, 3000, "the queued usage being written");
  assert.deepEqual(usageOf(file, "alice"), { requests: n, prompt: 3 * n, completion: 5 * n });
  assert.deepEqual(usageOf(file, "bob"), { requests: n, prompt: 7 * n, completion: 11 * n });
  assert.equal(count(lines, "usage written again"), 1);
  usage.close();
  auth.close();
  store.close();
});

test("through the server: with the database held by another process, requests still succeed and streams end with [DONE]; their usage lands once it lets go", async () => {
  const s = await startServer();
  try {
    const key = s.store.create("erin", "normal");
    const post = (body: Record<string, unknown>, bearer = key): Promise<Response> => fetch(`${s.url}/v1/chat/completions`, {
      method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${bearer}` },
      body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 4, ignore_eos: true, ...body }),
    });
    const start = Date.now();
    while ((await post({}, "weft-wrong")).status !== 401) {
      assert.ok(Date.now() - start < 10000, "auth did not turn on");
      await sleep(50);
    }
    assert.equal((await post({})).status, 200);
    await eventually(() => usageOf(s.dbFile, "erin").requests === 1, 2000, "the first request's usage");
    const base = usageOf(s.dbFile, "erin");
    const holder = await holdDatabase(s.dbFile, "lock");
    const probe = probeEventLoop();
    const streamed = await Promise.all([1, 2, 3].map(async () => {
      const res = await post({ stream: true, stream_options: { include_usage: true } });
      assert.equal(res.status, 200);
      const text = await res.text();
      assert.ok(text.trimEnd().endsWith("data: [DONE]"), `the stream did not end with [DONE]: ${text.slice(-200)}`);
      const events = text.split("\n\n").filter((e) => e.startsWith("data: {")).map((e) => JSON.parse(e.slice(6)) as { usage?: { prompt_tokens: number; completion_tokens: number } | null });
      return events.at(-1)!.usage!;
    }));
    const whole = await post({});
    assert.equal(whole.status, 200);
    const all = [...streamed, ((await whole.json()) as { usage: { prompt_tokens: number; completion_tokens: number } }).usage];
    await sleep(300); // several flush ticks under the lock
    const loop = probe.stop();
    assert.ok(loop.maxGapMs < MAX_LOOP_GAP_MS, `the event loop was blocked for ${loop.maxGapMs.toFixed(0)} ms`);
    assert.deepEqual(usageOf(s.dbFile, "erin"), base, "nothing written under the lock");
    assert.ok(s.logs.some((l) => l.includes("usage write failed; retrying every tick")), "the failed write was logged");
    await holder.release();
    const want = {
      requests: base.requests + 4,
      prompt: base.prompt + all.reduce((n, u) => n + u.prompt_tokens, 0),
      completion: base.completion + all.reduce((n, u) => n + u.completion_tokens, 0),
    };
    assert.equal(want.completion, base.completion + 16);
    await eventually(() => usageOf(s.dbFile, "erin").requests === want.requests, 3000, "the queued usage being written");
    assert.deepEqual(usageOf(s.dbFile, "erin"), want);
  } finally {
    await s.close();
  }
});

test("close() writes what is queued, waiting for a lock another process is about to release", async () => {
  const { store, file } = newStore();
  const { log, lines } = capturedLog();
  store.create("carol", "high");
  const usage = new UsageRecorder(store, { log });
  await holdDatabase(file, "lock", 300);
  usage.record("carol", 10, 20);
  usage.record("carol", 1, 2);
  assert.equal(usage.flush(), false, "the database is held: the write is refused at once");
  usage.close();
  assert.deepEqual(usageOf(file, "carol"), { requests: 2, prompt: 11, completion: 22 });
  usage.record("carol", 1, 1);
  assert.equal(count(lines, "usage recorded after close was not written"), 1);
  store.close();
});

test("the key refresh keeps the last good keys while another process breaks the database, and follows changes again once it is back", async () => {
  const { store, file } = newStore();
  const { log, lines } = capturedLog();
  const alice = store.create("alice", "high");
  const auth = new Authenticator(store, null, log);
  const holder = await holdDatabase(file, "break");
  assert.throws(() => new Authenticator(store, null, log), /no such table/, "with no key set to fall back on, the first read must fail loudly");
  const probe = probeEventLoop();
  const until = Date.now() + 2500;
  while (Date.now() < until) {
    const caller = auth.authenticate(`Bearer ${alice}`);
    assert.equal(caller.tenant, "alice");
    assert.equal(caller.tier, "high");
    await sleep(50);
  }
  const loop = probe.stop();
  assert.ok(loop.maxGapMs < MAX_LOOP_GAP_MS, `the event loop was blocked for ${loop.maxGapMs.toFixed(0)} ms`);
  assert.ok(auth.refreshFailures >= 2, `${auth.refreshFailures} failed refreshes`);
  assert.equal(count(lines, "API key refresh failed; keeping the last keys read"), 1, "a run of failures is logged once");
  assert.ok(auth.required, "auth stays on");
  assert.throws(() => auth.authenticate("Bearer weft-wrong"), ApiError);

  await holder.release();
  await eventually(() => count(lines, "API key refresh works again") === 1, 2500, "the refresh recovering");
  store.revoke("alice");
  await eventually(() => {
    try {
      auth.authenticate(`Bearer ${alice}`);
      return false;
    } catch (e) {
      return e instanceof ApiError && e.code === "invalid_api_key";
    }
  }, 2500, "the revocation being seen");
  auth.close();
  store.close();
});

test("key names: non-empty, printable, no control, format or unassigned characters, trimmed, at most 64 characters, not reserved", () => {
  const refused: [string, RegExp][] = [
    ["", /empty/],
    ["a\u0007b", /\\u\{7\}/],
    ["\u0000", /\\u\{0\}/],
    ["evil\u202Egpj.exe", /\\u\{202e\}/],
    ["\u2066isolate\u2069", /\\u\{2066\}/],
    ["zero\u200Bwidth", /\\u\{200b\}/],
    ["bom\uFEFF", /\\u\{feff\}/],
    ["line\u2028break", /\\u\{2028\}/],
    ["lone\uD800", /\\u\{d800\}/],
    ["unassigned\u0378", /\\u\{378\}/],
    ["private\uE000", /\\u\{e000\}/],
    ["x".repeat(KEY_NAME_MAX_LENGTH + 1), /longer than 64/],
    [" alice", /whitespace/],
    ["alice ", /whitespace/],
    ["alice\u00A0", /whitespace/],
    ["@static", /reserved/],
    ["@anything", /reserved/],
  ];
  const accepted = ["alice", "team-a_prod.2", "Zoë", "東京", "a b", "x".repeat(KEY_NAME_MAX_LENGTH), "🚀 rocket", "static", "anonymous", "a@b"];
  const { store } = newStore();
  for (const [name, why] of refused) {
    assert.match(keyNameProblem(name) ?? "", why, JSON.stringify(name));
    assert.throws(() => store.create(name, "normal"), (e: Error) => e.message.startsWith("invalid key name") && why.test(e.message), JSON.stringify(name));
  }
  for (const name of accepted) {
    assert.equal(keyNameProblem(name), null, name);
    assert.match(store.create(name, "normal"), /^weft-/);
  }
  assert.deepEqual(store.list().map((k) => k.name), accepted, "only the accepted names were stored");
  store.close();
});

test("weft keys create refuses a bad name with a clear error, printing no raw control or bidi character", () => {
  const db = path.join(tempDir(), "weft.db");
  const create = (name: string): { status: number | null; stdout: string; stderr: string } => {
    const r = spawnSync(process.execPath, [CLI, "keys", "create", "--name", name, "--tier", "normal", "--db", db]);
    return { status: r.status, stdout: r.stdout.toString(), stderr: r.stderr.toString() };
  };
  const bidi = create("evil\u202Eexe.txt");
  assert.notEqual(bidi.status, 0);
  assert.equal(bidi.stderr.trim(), 'weft: invalid key name "evil\\u{202e}exe.txt": it contains \\u{202e}, a control, format, private-use, unassigned or line-separator character');
  assert.equal(bidi.stdout, "", "no key printed");
  const empty = create("");
  assert.notEqual(empty.status, 0);
  assert.match(empty.stderr, /invalid key name "": it is empty/);
  assert.match(create("@static").stderr, /names starting with "@" are reserved/);
  const ok = create("dave");
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout.trim().split("\n").at(-1)!, /^weft-[\w-]{40,}$/);
});

test("the --api-key tenant and the keyless tenant never share a bucket or salt with a database key, even one from before the naming rule", () => {
  const { store, file } = newStore();
  const staticKey = "weft-static-secret";
  const dbStatic = store.create("static", "high");
  // Rows an older Weft (or a hand edit) could have written: names the rule now refuses, a name that
  // is not text, a hash no key can match. They must load without breaking the others.
  const legacy = { "@static": "weft-legacy-1", "bad\u202Ename": "weft-legacy-2", "\u0007": "weft-legacy-3", "@key:@static": "weft-legacy-4" };
  const raw = new Database(file);
  for (const [name, key] of Object.entries(legacy)) raw.prepare("INSERT INTO api_keys (name, key_hash, tier) VALUES (?, ?, 'low')").run(name, hashKey(key));
  raw.prepare("INSERT INTO api_keys (name, key_hash, tier) VALUES (?, ?, 'low')").run(Buffer.from("blob"), hashKey("weft-legacy-5"));
  raw.prepare("INSERT INTO api_keys (name, key_hash, tier) VALUES ('short-hash', 'abcd', 'low')").run();
  raw.close();
  const { log } = capturedLog();
  const auth = new Authenticator(store, staticKey, log);
  const who = (key: string): { tenant: string; keyName: string | null } => {
    const c = auth.authenticate(`Bearer ${key}`);
    return { tenant: c.tenant, keyName: c.keyName };
  };
  assert.deepEqual(who(staticKey), { tenant: STATIC_TENANT, keyName: null }, "the --api-key key's usage is not charged to the key named static");
  assert.deepEqual(who(dbStatic), { tenant: "static", keyName: "static" });
  assert.deepEqual(who(legacy["@static"]), { tenant: "@key:@static", keyName: "@static" });
  assert.deepEqual(who(legacy["bad\u202Ename"]), { tenant: "@key:bad\\u{202e}name", keyName: "bad\u202Ename" });
  assert.deepEqual(who(legacy["\u0007"]), { tenant: "@key:\\u{7}", keyName: "\u0007" });
  assert.deepEqual(who(legacy["@key:@static"]), { tenant: "@key:@key:@static", keyName: "@key:@static" });
  assert.throws(() => who("weft-legacy-5"), ApiError, "a key whose name is not text is never accepted");
  const tenants = [staticKey, dbStatic, ...Object.values(legacy)].map((k) => who(k).tenant);
  assert.equal(new Set(tenants).size, tenants.length, "every key has its own tenant");
  for (const reserved of [STATIC_TENANT, ANONYMOUS_TENANT]) assert.notEqual(keyNameProblem(reserved), null, `${reserved} must be unusable as a key name`);
  assert.notEqual(tenantOf("@x\\u{7}"), tenantOf("@x\u0007"), "escaping keeps distinct names distinct");
  auth.close();
  store.close();

  const empty = new KeyStore(path.join(tempDir(), "weft.db"));
  const keyless = new Authenticator(empty, null, log);
  assert.equal(keyless.authenticate(undefined).tenant, ANONYMOUS_TENANT, "no keys: auth is off, under a reserved tenant");
  keyless.close();
  empty.close();
});
