/**
 * OpenAI's Files and Batches API on the real server and the tiny fixture model:
 * the official SDK end to end, whole-file and per-line errors, tenant
 * isolation, cancel mid-way, and (on a child process) SIGKILL and resume with
 * every custom_id exactly once, expiry on restart, and the `weft batches` CLI.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import path from "node:path";
import Database from "better-sqlite3";
import OpenAI, { toFile } from "openai";
import { startServer, fixtureModelDir, type TestServer } from "./support/server.js";
import { ROOT, tempDir } from "./helpers.js";

type Json = Record<string, unknown>;
interface OutLine {
  id: string;
  custom_id: string;
  response: { status_code: number; request_id: string; body: Json } | null;
  error: { code: string; message: string } | null;
}

const MAX_FILE_BYTES = 64 * 1024;
const CLI = path.join(ROOT, "dist", "src", "cli.js");

let s: TestServer;
let alice: string, bob: string;

before(async () => {
  s = await startServer({ batch: { maxFileBytes: MAX_FILE_BYTES } });
  alice = s.store.create("alice", "normal");
  bob = s.store.create("bob", "normal");
  for (const start = Date.now(); (await fetch(`${s.url}/v1/models`)).status !== 401; await sleep(50)) {
    assert.ok(Date.now() - start < 5000, "auth did not turn on");
  }
});
after(async () => s.close());

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function client(url: string, apiKey: string): OpenAI {
  return new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });
}

function chatLine(customId: string, o: { maxTokens?: number; extra?: Json } = {}): Json {
  return {
    custom_id: customId, method: "POST", url: "/v1/chat/completions",
    body: { model: "tiny", messages: [{ role: "user", content: `Say something about ${customId}.` }], max_tokens: o.maxTokens ?? 4, ...o.extra },
  };
}

const jsonl = (lines: unknown[]): string => lines.map((l) => (typeof l === "string" ? l : JSON.stringify(l))).join("\n") + "\n";

async function upload(c: OpenAI, text: string): Promise<string> {
  return (await c.files.create({ file: await toFile(Buffer.from(text), "input.jsonl"), purpose: "batch" })).id;
}

async function waitFor(c: OpenAI, id: string, done: (b: OpenAI.Batches.Batch) => boolean, timeoutMs = 60_000): Promise<OpenAI.Batches.Batch> {
  for (const start = Date.now(); ; await sleep(25)) {
    const b = await c.batches.retrieve(id);
    if (done(b)) return b;
    assert.ok(Date.now() - start < timeoutMs, `batch ${id} still ${b.status} (${JSON.stringify(b.request_counts)})`);
  }
}

const ended = (b: OpenAI.Batches.Batch): boolean => ["completed", "failed", "cancelled", "expired"].includes(b.status);

async function lines(c: OpenAI, fileId: string | null | undefined): Promise<OutLine[]> {
  if (!fileId) return [];
  const text = await (await c.files.content(fileId)).text();
  return text.split("\n").filter((l) => l).map((l) => JSON.parse(l) as OutLine);
}

/** Every custom_id of `ids` exactly once across the output and error lines. */
function assertExactlyOnce(ids: string[], out: OutLine[], err: OutLine[]): void {
  const seen = [...out, ...err].map((l) => l.custom_id).sort();
  assert.deepEqual(seen, [...ids].sort());
}

test("openai SDK: files.create → batches.create → retrieve until completed → files.content, one chat completion per line", async () => {
  const c = client(s.url, alice);
  const ids = ["a", "b", "c", "d", "e", "f"];
  const fileId = await upload(c, jsonl(ids.map((id) => chatLine(id))));
  const file = await c.files.retrieve(fileId);
  assert.equal(file.object, "file");
  assert.equal(file.purpose, "batch");
  assert.equal(file.filename, "input.jsonl");
  const created = await c.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { job: "e2e" } });
  assert.equal(created.object, "batch");
  assert.ok(["validating", "in_progress"].includes(created.status));
  assert.deepEqual(created.metadata, { job: "e2e" });
  const b = await waitFor(c, created.id, ended);
  assert.equal(b.status, "completed", JSON.stringify(b.errors));
  assert.deepEqual(b.request_counts, { total: 6, completed: 6, failed: 0 });
  for (const t of [b.in_progress_at, b.finalizing_at, b.completed_at]) assert.ok(typeof t === "number" && t >= b.created_at);
  assert.equal(b.error_file_id, null);
  const out = await lines(c, b.output_file_id);
  assert.deepEqual(out.map((l) => l.custom_id), ids, "one output line per input line, in input order");
  for (const l of out) {
    assert.equal(l.error, null);
    assert.equal(l.response?.status_code, 200);
    const body = l.response!.body as { object: string; model: string; choices: { message: { role: string; content: string }; finish_reason: string }[]; usage: { completion_tokens: number } };
    assert.equal(body.object, "chat.completion");
    assert.equal(body.model, "tiny");
    assert.equal(body.choices[0]?.message.role, "assistant");
    assert.equal(typeof body.choices[0]?.message.content, "string");
    assert.ok(body.usage.completion_tokens >= 1 && body.usage.completion_tokens <= 4);
  }
  assert.equal(new Set(out.map((l) => l.id)).size, out.length);
  const output = await c.files.retrieve(b.output_file_id!);
  assert.equal(output.purpose, "batch_output");
  const listed = await c.batches.list();
  assert.ok(listed.data.some((x) => x.id === b.id));
  const files = await c.files.list();
  assert.ok(files.data.some((f) => f.id === fileId) && files.data.some((f) => f.id === b.output_file_id));
  const usage = await waitForUsage("alice", 6);
  assert.ok(usage >= 6, "batch lines are recorded against the key's usage");
});

async function waitForUsage(name: string, requests: number): Promise<number> {
  for (const start = Date.now(); Date.now() - start < 5000; await sleep(50)) {
    const n = s.store.list().find((k) => k.name === name)?.requests ?? 0;
    if (n >= requests) return n;
  }
  return 0;
}

test("completions endpoint, and a bad request body goes to the error file with the route's 400", async () => {
  const c = client(s.url, alice);
  const line = (id: string, body: Json): Json => ({ custom_id: id, method: "POST", url: "/v1/completions", body: { model: "tiny", prompt: "Hello", max_tokens: 3, ...body } });
  const fileId = await upload(c, jsonl([line("ok-1", {}), line("bad-temp", { temperature: -1 }), line("ok-2", { n: 2 }), line("streamed", { stream: true })]));
  const b = await waitFor(c, (await c.batches.create({ input_file_id: fileId, endpoint: "/v1/completions", completion_window: "24h" })).id, ended);
  assert.equal(b.status, "completed");
  assert.deepEqual(b.request_counts, { total: 4, completed: 2, failed: 2 });
  const out = await lines(c, b.output_file_id), err = await lines(c, b.error_file_id);
  assert.deepEqual(out.map((l) => l.custom_id), ["ok-1", "ok-2"]);
  assert.equal((out[1]!.response!.body as { choices: unknown[] }).choices.length, 2);
  assert.equal((out[0]!.response!.body as { object: string }).object, "text_completion");
  assert.deepEqual(err.map((l) => l.custom_id), ["bad-temp", "streamed"]);
  for (const l of err) {
    assert.equal(l.response?.status_code, 400);
    const e = (l.response!.body as { error: { type: string; param: string } }).error;
    assert.equal(e.type, "invalid_request_error");
  }
  assert.equal((err[0]!.response!.body as { error: { param: string } }).error.param, "temperature");
  assert.equal((err[1]!.response!.body as { error: { param: string } }).error.param, "stream");
});

test("whole-file problems fail the batch with OpenAI's errors list", async () => {
  const c = client(s.url, alice);
  const fileId = await upload(c, jsonl([
    chatLine("x"),
    "{not json",
    chatLine("x"),
    { ...chatLine("y"), url: "/v1/completions" },
    { ...chatLine("z"), method: "GET" },
    chatLine("m", { extra: { model: "no-such-model" } }),
    { method: "POST", url: "/v1/chat/completions", body: {} },
  ]));
  const b = await waitFor(c, (await c.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" })).id, ended);
  assert.equal(b.status, "failed");
  assert.ok(b.failed_at);
  assert.equal(b.output_file_id, null);
  const found = b.errors!.data!.map((e) => [e.code, e.line]);
  assert.deepEqual(found, [["invalid_json_line", 2], ["duplicate_custom_id", 3], ["invalid_url", 4], ["invalid_method", 5], ["model_not_found", 6], ["missing_custom_id", 7]]);
  const empty = await upload(c, "\n\n");
  const e = await waitFor(c, (await c.batches.create({ input_file_id: empty, endpoint: "/v1/chat/completions", completion_window: "24h" })).id, ended);
  assert.equal(e.status, "failed");
  assert.equal(e.errors?.data?.[0]?.code, "empty_file");
});

async function post(url: string, apiKey: string, body: Json): Promise<Response> {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${apiKey}` }, body: JSON.stringify(body) });
}

async function assertError(res: Response, status: number, code: string, param?: string): Promise<void> {
  assert.equal(res.status, status);
  const body = await res.json() as { error: { message: string; type: string; param: string | null; code: string } };
  assert.equal(body.error.code, code);
  assert.equal(typeof body.error.message, "string");
  assert.equal(typeof body.error.type, "string");
  if (param !== undefined) assert.equal(body.error.param, param);
}

test("malformed requests get OpenAI-shaped errors: upload, size limit, create", async () => {
  const form = (fields: Record<string, string | Blob>): FormData => {
    const f = new FormData();
    for (const [k, v] of Object.entries(fields)) f.append(k, v, ...(typeof v === "string" ? [] : ["in.jsonl"]) as []);
    return f;
  };
  const send = (f: FormData): Promise<Response> => fetch(`${s.url}/v1/files`, { method: "POST", headers: { authorization: `Bearer ${alice}` }, body: f });
  const small = new Blob([jsonl([chatLine("a")])]);
  await assertError(await send(form({ file: small })), 400, "invalid_request", "purpose");
  await assertError(await send(form({ purpose: "fine-tune", file: small })), 400, "invalid_request", "purpose");
  await assertError(await send(form({ purpose: "batch" })), 400, "invalid_request", "file");
  await assertError(await send(form({ purpose: "batch", file: new Blob(["x".repeat(MAX_FILE_BYTES + 1)]) })), 413, "file_too_large", "file");
  const ok = await send(form({ file: small, purpose: "batch" }));
  assert.equal(ok.status, 200, "fields in any order");
  const fileId = (await ok.json() as { id: string }).id;
  await assertError(await post(`${s.url}/v1/files`, alice, { purpose: "batch" }), 400, "invalid_request", "file");
  await assertError(await post(`${s.url}/v1/batches`, alice, { input_file_id: "file-nope", endpoint: "/v1/chat/completions", completion_window: "24h" }), 404, "file_not_found", "input_file_id");
  await assertError(await post(`${s.url}/v1/batches`, alice, { input_file_id: fileId, endpoint: "/v1/embeddings", completion_window: "24h" }), 400, "invalid_request", "endpoint");
  await assertError(await post(`${s.url}/v1/batches`, alice, { input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "1h" }), 400, "invalid_request", "completion_window");
  await assertError(await post(`${s.url}/v1/batches`, alice, { input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h", metadata: { a: 1 } }), 400, "invalid_request", "metadata");
  await assertError(await fetch(`${s.url}/v1/batches/batch_nope`, { headers: { authorization: `Bearer ${alice}` } }), 404, "batch_not_found");
  await assertError(await fetch(`${s.url}/v1/batches`), 401, "invalid_api_key");
});

test("isolation: another key gets 404 on a tenant's files and batches and does not list them", async () => {
  const a = client(s.url, alice);
  const fileId = await upload(a, jsonl([chatLine("secret")]));
  const batch = await waitFor(a, (await a.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" })).id, ended);
  const auth = { authorization: `Bearer ${bob}` };
  for (const [method, p] of [["GET", `/v1/files/${fileId}`], ["GET", `/v1/files/${fileId}/content`], ["DELETE", `/v1/files/${fileId}`],
    ["GET", `/v1/files/${batch.output_file_id}/content`], ["GET", `/v1/batches/${batch.id}`], ["POST", `/v1/batches/${batch.id}/cancel`]] as const) {
    const res = await fetch(`${s.url}${p}`, { method, headers: auth });
    assert.equal(res.status, 404, `${method} ${p}`);
  }
  await assertError(await post(`${s.url}/v1/batches`, bob, { input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" }), 404, "file_not_found");
  const b = client(s.url, bob);
  assert.ok(!(await b.batches.list()).data.some((x) => x.id === batch.id));
  assert.ok(!(await b.files.list()).data.some((f) => f.id === fileId));
  assert.equal((await a.files.retrieve(fileId)).id, fileId, "the owner still sees it");
  assert.equal((await a.files.delete(fileId)).deleted, true);
  await assertError(await fetch(`${s.url}/v1/files/${fileId}`, { headers: { authorization: `Bearer ${alice}` } }), 404, "file_not_found");
});

test("cancel mid-way: status cancelling → cancelled, partial output, the rest batch_cancelled in the error file", async () => {
  const c = client(s.url, alice);
  const ids = Array.from({ length: 48 }, (_, i) => `c${i}`);
  const fileId = await upload(c, jsonl(ids.map((id) => chatLine(id, { maxTokens: 48, extra: { ignore_eos: true } }))));
  const created = await c.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" });
  await waitFor(c, created.id, (b) => b.request_counts!.completed > 0);
  await assertError(await fetch(`${s.url}/v1/files/${fileId}`, { method: "DELETE", headers: { authorization: `Bearer ${alice}` } }), 409, "file_in_use");
  const cancelling = await c.batches.cancel(created.id);
  assert.ok(["cancelling", "cancelled"].includes(cancelling.status), cancelling.status);
  const b = await waitFor(c, created.id, ended);
  assert.equal(b.status, "cancelled");
  assert.ok(b.cancelling_at && b.cancelled_at);
  const out = await lines(c, b.output_file_id), err = await lines(c, b.error_file_id);
  assertExactlyOnce(ids, out, err);
  assert.ok(out.length > 0 && out.length < ids.length, `partial output (${out.length} of ${ids.length})`);
  assert.ok(err.every((l) => l.error?.code === "batch_cancelled" && l.response === null));
  assert.deepEqual(b.request_counts, { total: ids.length, completed: out.length, failed: err.length });
  await assertError(await post(`${s.url}/v1/batches/${b.id}/cancel`, alice, {}), 409, "batch_not_cancellable");
});

test("interactive traffic during a batch: a NORMAL request is served ahead of the batch's waiting LOW lines", async () => {
  const srv = await startServer({ batch: {}, engine: { maxNumSeqs: 4 } });
  try {
    const c = client(srv.url, "unused");
    const ids = Array.from({ length: 32 }, (_, i) => `p${i}`);
    const fileId = await upload(c, jsonl(ids.map((id) => chatLine(id, { maxTokens: 32, extra: { ignore_eos: true } }))));
    const batch = await c.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" });
    for (const start = Date.now(); (srv.manager.engines[0]?.engine.stats().waitingByPriority.low ?? 0) < 16; await sleep(10)) {
      assert.ok(Date.now() - start < 20_000, "batch lines did not queue");
    }
    const chat = await c.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
    assert.equal(chat.object, "chat.completion");
    const servedBefore = (await c.batches.retrieve(batch.id)).request_counts!.completed;
    // Four lines run at a time: the request waits for the running ones, not for the 16+ waiting behind them.
    assert.ok(servedBefore <= 8, `${servedBefore} batch lines finished before the interactive request`);
    assert.equal((await waitFor(c, batch.id, ended)).status, "completed");
  } finally {
    await srv.close();
  }
});

/** `weft serve` as a child process on a database and data dir. */
async function serveChild(db: string, dataDir: string): Promise<{ child: ChildProcess; url: string; exited: Promise<number | null> }> {
  const child = spawn(process.execPath, [CLI, "serve", "--model", `tiny=${fixtureModelDir()}`, "--port", "0", "--db", db, "--data-dir", dataDir,
    "--kv-cache-memory", "67108864", "--max-model-len", "1024"], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
  for (const start = Date.now(); !/listening on (http:\/\/127\.0\.0\.1:\d+)/.test(out); await sleep(50)) {
    assert.ok(Date.now() - start < 20_000, `server did not start: ${out}`);
  }
  return { child, url: /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(out)![1]!, exited };
}

test("SIGKILL mid-batch, restart: the batch resumes, every custom_id exactly once, recorded lines not redone; expiry on restart", async () => {
  const dir = tempDir(), db = path.join(dir, "weft.db"), dataDir = path.join(dir, "data");
  const first = await serveChild(db, dataDir);
  const c = client(first.url, "unused");
  const ids = Array.from({ length: 64 }, (_, i) => `r${i}`);
  const input = jsonl(ids.map((id) => chatLine(id, { maxTokens: 32, extra: { ignore_eos: true } })));
  const resumed = await c.batches.create({ input_file_id: await upload(c, input), endpoint: "/v1/chat/completions", completion_window: "24h" });
  const expiring = await c.batches.create({ input_file_id: await upload(c, input), endpoint: "/v1/chat/completions", completion_window: "24h" });
  await waitFor(c, resumed.id, (b) => b.request_counts!.completed >= 2);
  first.child.kill("SIGKILL");
  await first.exited;
  // What the database held at the kill: those lines must come back as they are, not run again.
  const sql = new Database(db);
  const before = sql.prepare("SELECT data FROM batch_results WHERE batch_id = ?").all(resumed.id) as { data: string }[];
  assert.ok(before.length > 0 && before.length < ids.length, `killed mid-batch (${before.length} of ${ids.length} recorded)`);
  sql.prepare("UPDATE batches SET expires_at = ? WHERE id = ?").run(Math.floor(Date.now() / 1000) - 1, expiring.id);
  sql.close();

  const second = await serveChild(db, dataDir);
  try {
    const c2 = client(second.url, "unused");
    const b = await waitFor(c2, resumed.id, ended);
    assert.equal(b.status, "completed");
    const out = await lines(c2, b.output_file_id), err = await lines(c2, b.error_file_id);
    assertExactlyOnce(ids, out, err);
    assert.equal(err.length, 0);
    assert.deepEqual(b.request_counts, { total: ids.length, completed: ids.length, failed: 0 });
    const outById = new Map(out.map((l) => [l.custom_id, JSON.stringify(l)]));
    for (const r of before) assert.equal(outById.get((JSON.parse(r.data) as OutLine).custom_id), r.data, "a recorded line is kept, not redone");

    const e = await waitFor(c2, expiring.id, ended);
    assert.equal(e.status, "expired");
    assert.ok(e.expired_at);
    const eOut = await lines(c2, e.output_file_id), eErr = await lines(c2, e.error_file_id);
    assertExactlyOnce(ids, eOut, eErr);
    assert.ok(eErr.length > 0 && eErr.every((l) => l.error?.code === "batch_expired"));

    const list = spawnSync(process.execPath, [CLI, "batches", "list", "--db", db], { encoding: "utf8" });
    assert.equal(list.status, 0, list.stderr);
    assert.match(list.stdout, new RegExp(`${resumed.id}\\t@anonymous\\tcompleted`));
    assert.match(list.stdout, new RegExp(`${expiring.id}\\t@anonymous\\texpired`));
    const show = spawnSync(process.execPath, [CLI, "batches", "show", resumed.id, "--db", db], { encoding: "utf8" });
    assert.equal((JSON.parse(show.stdout) as { status: string }).status, "completed");
    const cancel = spawnSync(process.execPath, [CLI, "batches", "cancel", resumed.id, "--db", db], { encoding: "utf8" });
    assert.notEqual(cancel.status, 0);
    assert.match(cancel.stderr, /completed: it cannot be cancelled/);
  } finally {
    second.child.kill("SIGTERM");
    await second.exited;
  }
});

test("weft batches cancel: a running server ends the batch as cancelled", async () => {
  const dir = tempDir(), db = path.join(dir, "weft.db");
  const srv = await serveChild(db, path.join(dir, "data"));
  try {
    const c = client(srv.url, "unused");
    const ids = Array.from({ length: 48 }, (_, i) => `k${i}`);
    const fileId = await upload(c, jsonl(ids.map((id) => chatLine(id, { maxTokens: 48, extra: { ignore_eos: true } }))));
    const created = await c.batches.create({ input_file_id: fileId, endpoint: "/v1/chat/completions", completion_window: "24h" });
    await waitFor(c, created.id, (b) => b.status === "in_progress");
    const cancel = spawnSync(process.execPath, [CLI, "batches", "cancel", created.id, "--db", db], { encoding: "utf8" });
    assert.equal(cancel.status, 0, cancel.stderr);
    const b = await waitFor(c, created.id, ended);
    assert.equal(b.status, "cancelled");
    assertExactlyOnce(ids, await lines(c, b.output_file_id), await lines(c, b.error_file_id));
  } finally {
    srv.child.kill("SIGTERM");
    await srv.exited;
  }
});
