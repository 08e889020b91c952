/**
 * Auth is decided on the matched route, not on the URL text: no spelling of a
 * protected path (percent-encoding of any character, case, duplicate and
 * trailing slashes, dot segments, query strings, fragments, `;` parameters)
 * is served without a key, and none yields a 5xx.
 */
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import { startServer, type TestServer } from "./support/server.js";

let s: TestServer;
let key: string;
before(async () => {
  s = await startServer({ protectMetrics: true, batch: {} });
  key = s.store.create("alice", "normal");
  await new Promise((r) => setTimeout(r, 1100)); // the key set is re-read every second
});
after(async () => s.close());

/** Every route that needs a key; `ok`: a plain request with a key is served (200), the rest refuse this test's body or ids with a 4xx. */
const PROTECTED: { method: "GET" | "POST" | "DELETE"; path: string; ok: boolean }[] = [
  { method: "GET", path: "/v1/models", ok: true },
  { method: "GET", path: "/v1/models/tiny", ok: true },
  { method: "POST", path: "/v1/completions", ok: true },
  { method: "POST", path: "/v1/chat/completions", ok: true },
  { method: "POST", path: "/v1/batch/completions", ok: true },
  { method: "POST", path: "/v1/batch/chat/completions", ok: true },
  { method: "GET", path: "/metrics", ok: true },
  { method: "GET", path: "/v1/files", ok: true },
  { method: "GET", path: "/v1/batches", ok: true },
  { method: "POST", path: "/tokenize", ok: true },
  { method: "POST", path: "/detokenize", ok: false },
  { method: "POST", path: "/v1/files", ok: false },
  { method: "GET", path: "/v1/files/file-x", ok: false },
  { method: "GET", path: "/v1/files/file-x/content", ok: false },
  { method: "DELETE", path: "/v1/files/file-x", ok: false },
  { method: "POST", path: "/v1/batches", ok: false },
  { method: "GET", path: "/v1/batches/batch-x", ok: false },
  { method: "POST", path: "/v1/batches/batch-x/cancel", ok: false },
];

const hex = (c: string): string => c.charCodeAt(0).toString(16).padStart(2, "0");

/** Every spelling of `p` we try: each character percent-encoded (both cases), and structural variants. */
export function spellings(p: string): string[] {
  const out = new Set<string>();
  for (let i = 0; i < p.length; i++) {
    for (const h of [hex(p[i]!).toUpperCase(), hex(p[i]!).toLowerCase()]) out.add(`${p.slice(0, i)}%${h}${p.slice(i + 1)}`);
  }
  const segs = p.split("/").slice(1);
  const first = segs[0]!, rest = segs.slice(1).join("/");
  const tail = rest ? `/${rest}` : "";
  for (const v of [
    p.toUpperCase(), p.replace(/\/(\w)/g, (_, c: string) => `/${c.toUpperCase()}`),
    `/${p}`, `//${p.slice(1)}`, p.replace(/\//g, "//"), `${p}/`, `${p}//`, `${p}/.`, `${p}/..`,
    `/./${p.slice(1)}`, `/${first}/.${tail}`, `/${first}/../${first}${tail}`, `/x/../${p.slice(1)}`, `/%2e/${p.slice(1)}`, `/${first}/%2e%2e/${first}${tail}`,
    `${p}?x=1`, `${p}?`, `${p}?a=/health`, `${p}#x`, `${p}#`, `${p};x`, `${p};`, `/${first};a=b${tail}`,
    `/${first}%2f${rest}`, `/${first}%2F${rest}`, `/${first}\\${rest}`, `${p}%00`, `${p}%20`, `${p}%23x`, `${p}%3fx`, `${p}%3Bx`,
    `${p}/%2e`, `/${first}/%c0%ae%c0%ae/${first}${tail}`, ` ${p}`.trim(),
  ]) out.add(v);
  out.delete(p);
  return [...out];
}

function send(method: string, path: string, withKey: boolean): Promise<number> {
  return new Promise((resolve, reject) => {
    const body = method === "POST" ? JSON.stringify({ model: "tiny", prompt: "hi", messages: [{ role: "user", content: "hi" }], max_tokens: 1 }) : undefined;
    const u = new URL(s.url);
    const req = http.request({
      host: u.hostname, port: u.port, method, path, agent: false,
      headers: { ...(body ? { "content-type": "application/json", "content-length": Buffer.byteLength(body) } : {}), ...(withKey ? { authorization: `Bearer ${key}` } : {}) },
    }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.on("error", reject);
    req.end(body);
  });
}

test("every protected route answers 401 without a key, and with one is served (or refuses the request itself, never with a 5xx)", async () => {
  for (const r of PROTECTED) {
    assert.equal(await send(r.method, r.path, false), 401, `${r.method} ${r.path} without a key`);
    const withKey = await send(r.method, r.path, true);
    if (r.ok) assert.equal(withKey, 200, `${r.method} ${r.path} with a key`);
    else assert.ok(withKey >= 400 && withKey < 500 && withKey !== 401, `${r.method} ${r.path} with a key: ${withKey}`);
  }
});

test("no spelling of a protected path is served without a key, and none is a 5xx", async () => {
  let tried = 0;
  const reached: string[] = [];
  for (const r of PROTECTED) {
    const variants = spellings(r.path);
    assert.ok(variants.length >= 20, `${variants.length} spellings of ${r.path}`);
    for (const v of variants) {
      const status = await send(r.method, v, false);
      tried++;
      assert.ok(status < 500, `${r.method} ${v} answered ${status}`);
      assert.ok(status < 200 || status >= 300, `${r.method} ${v} was served without a key (${status})`);
      // A spelling the router maps to the route is refused for the key, not for the spelling.
      const withKey = await send(r.method, v, true);
      assert.ok(withKey < 500, `${r.method} ${v} with a key answered ${withKey}`);
      if (r.ok && withKey === 200) {
        reached.push(v);
        assert.equal(status, 401, `${v} reaches the route, so without a key it must be 401`);
      }
    }
  }
  console.log(`${tried} spellings over ${PROTECTED.length} routes; ${reached.length} reach a protected route (all 401 without a key), e.g. ${reached.slice(0, 4).join(" ")}`);
  assert.ok(reached.some((v) => v.startsWith("/%76")), "percent-encoded spellings do reach routes");
});

test("the spellings from the report: /%761/models, POST /%761/chat/completions, /metrics?x=1, /%6detrics, /metrics#x", async () => {
  assert.equal(await send("GET", "/%761/models", false), 401);
  assert.equal(await send("POST", "/%761/chat/completions", false), 401);
  assert.equal(await send("POST", "/%761/chat/completions", true), 200);
  for (const p of ["/metrics?x=1", "/%6detrics", "/metrics#x"]) assert.equal(await send("GET", p, false), 401, p);
});

test("health is public on every spelling that reaches it", async () => {
  assert.equal(await send("GET", "/health", false), 200);
  assert.equal(await send("GET", "/health?probe=1", false), 200);
});
