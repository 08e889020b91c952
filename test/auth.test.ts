/** API keys: the CLI, hashes only in the database, 401s, tiers → priority, batch → LOW, live revocation. */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import Database from "better-sqlite3";
import OpenAI from "openai";
import { ROOT } from "./helpers.js";
import { startServer, type TestServer } from "./support/server.js";
import { Priority, type Request } from "../src/engine/request.js";

let s: TestServer;
before(async () => (s = await startServer({ engine: { maxNumSeqs: 1 } })));
after(async () => s.close());

const CLI = path.join(ROOT, "dist", "src", "cli.js");
const keys = (...args: string[]): string => execFileSync(process.execPath, [CLI, "keys", ...args, "--db", s.dbFile]).toString();
const lastLine = (out: string): string => out.trim().split("\n").at(-1)!;

async function complete(key: string | null, pathName = "/v1/completions"): Promise<Response> {
  return fetch(`${s.url}${pathName}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({ model: "tiny", prompt: "hi", max_tokens: 1 }),
  });
}

function lastRequestLog(): Record<string, unknown> {
  return s.logs.map((l) => JSON.parse(l) as Record<string, unknown>).filter((l) => l.msg === "request").at(-1)!;
}

/**
 * The priority a request has inside the engine: a blocker holds the only running slot
 * (--max-num-seqs 1), so the request waits in the queue, where its priority is read.
 */
async function priorityInEngine(key: string, tenant: string, blockerKey: string, pathName = "/v1/completions"): Promise<Priority> {
  const engine = (await s.manager.acquire("tiny", "test")).engine;
  const stop = new AbortController();
  const blocker = fetch(`${s.url}/v1/completions`, {
    method: "POST", signal: stop.signal, headers: { "content-type": "application/json", authorization: `Bearer ${blockerKey}` },
    body: JSON.stringify({ model: "tiny", prompt: "block", max_tokens: 500, ignore_eos: true, stream: true }),
  }).then((r) => r.arrayBuffer(), () => undefined).catch(() => undefined);
  await eventually(async () => engine.scheduler.running.length === 1, 5000, "the blocker running");
  const res = complete(key, pathName);
  let waiting: Request | undefined;
  await eventually(async () => (waiting = [...engine.scheduler.waiting].find((r) => r.tenant === tenant)) !== undefined, 5000, "the request waiting");
  stop.abort();
  await blocker;
  assert.equal((await res).status, 200);
  return waiting!.priority;
}

async function eventually(check: () => Promise<boolean>, ms: number, what: string): Promise<number> {
  const start = Date.now();
  while (!(await check())) {
    assert.ok(Date.now() - start < ms, `${what} did not happen within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return Date.now() - start;
}

test("keys: created by the CLI, stored only as hashes; every tier gets its priority; batch routes get LOW", async () => {
  assert.equal((await complete(null)).status, 200, "no keys yet: auth is off");
  const high = lastLine(keys("create", "--name", "alice", "--tier", "high"));
  const normal = lastLine(keys("create", "--name", "bob", "--tier", "normal"));
  const low = lastLine(keys("create", "--name", "carol", "--tier", "low"));
  assert.match(high, /^weft-[\w-]{40,}$/);
  // The database holds hashes, never the keys.
  const raw = fs.readFileSync(s.dbFile);
  const db = new Database(s.dbFile, { readonly: true });
  const rows = db.prepare("SELECT * FROM api_keys").all() as Record<string, unknown>[];
  db.close();
  for (const k of [high, normal, low]) {
    assert.ok(!raw.includes(k), "key text in the database file");
    assert.ok(!JSON.stringify(rows).includes(k));
  }
  await eventually(async () => (await complete(null)).status === 401, 2000, "auth turning on");
  for (const [key, name, prio] of [[high, "alice", Priority.HIGH], [normal, "bob", Priority.NORMAL], [low, "carol", Priority.LOW]] as const) {
    // The blocker is HIGH, so no request it blocks may take its slot.
    assert.equal(await priorityInEngine(key, name, high), prio, `${name}'s requests wait in the engine at their tier's priority`);
    assert.equal(lastRequestLog().tenant, name);
    assert.equal(await priorityInEngine(key, name, high, "/v1/batch/completions"), Priority.LOW, "batch routes are always LOW");
  }
  const client = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: high, maxRetries: 0 });
  const r = await client.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "x" }], max_tokens: 2 });
  assert.equal(r.choices.length, 1);
  const listing = keys("list");
  assert.match(listing, /alice\thigh\tactive\t\d+\t\d+\t\d+/);
  assert.ok(!listing.includes(high));
});

test("no key, a wrong key and a revoked key get 401; revocation and tier changes apply within two seconds", async () => {
  const key = lastLine(keys("create", "--name", "dave", "--tier", "low"));
  await eventually(async () => (await complete(key)).status === 200, 2000, "new key accepted");
  for (const bad of [null, "weft-wrong", `${key}x`]) {
    const res = await complete(bad);
    assert.equal(res.status, 401);
    const body = await res.json() as { error: { type: string } };
    assert.equal(body.error.type, "authentication_error");
  }
  keys("set-tier", "--name", "dave", "--tier", "high");
  await eventually(async () => (await complete(key)).status === 200 && lastRequestLog().priority === "high", 2000, "tier change");
  keys("revoke", "--name", "dave");
  const took = await eventually(async () => (await complete(key)).status === 401, 2000, "revocation");
  assert.ok(took <= 2000);
  assert.match(keys("list"), /dave\thigh\trevoked/);
});

test("health stays open with auth on; /models needs a key", async () => {
  assert.equal((await fetch(`${s.url}/health`)).status, 200);
  assert.equal((await fetch(`${s.url}/v1/models`)).status, 401);
});
