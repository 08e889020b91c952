/**
 * The HTTP edge of the real server, over raw sockets and fetch: CORS, the
 * Host check, timeouts, early answers, the connection cap, and parser-level
 * errors in OpenAI's shape.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import net from "node:net";
import { once } from "node:events";
import { setTimeout as delay } from "node:timers/promises";
import { startServer, type TestServer, type TestServerOptions } from "./support/server.js";

/** Short timers, so that cut-offs show within the test's time. */
const FAST = { headersTimeoutMs: 300, requestTimeoutMs: 600, earlyAnswerGraceMs: 300 };
const APP = "https://app.example";
const KEY = "sk-edge-test";
/** A generous bound for "promptly": far above the timers, far below a trickle's length. */
const PROMPTLY_MS = 3000;

async function withServer(o: TestServerOptions, body: (s: TestServer, port: number) => Promise<void>): Promise<void> {
  const s = await startServer(o);
  try {
    await body(s, Number(new URL(s.url).port));
  } finally {
    for (const c of Conn.all) c.destroy(); // a failed test must not leave a connection that keeps close() waiting
    await s.close();
  }
}

interface RawResponse {
  status: number;
  headers: Record<string, string>;
  body: string;
}

/** One raw connection: what it writes, every byte the server sends back, and when the server closes it. */
class Conn {
  static readonly all = new Set<Conn>();
  private text = "";
  private consumed = 0;
  private closedAt: number | null = null;
  private readonly start = performance.now();

  private constructor(private readonly socket: net.Socket) {
    socket.on("data", (d: Buffer) => (this.text += d.toString("latin1")));
    socket.on("error", () => {}); // a reset after the server's answer is part of being disconnected
    socket.on("close", () => (this.closedAt = performance.now() - this.start));
  }

  static async open(port: number): Promise<Conn> {
    const socket = net.connect(port, "127.0.0.1");
    await once(socket, "connect");
    const c = new Conn(socket);
    Conn.all.add(c);
    return c;
  }

  get isClosed(): boolean {
    return this.closedAt !== null;
  }

  write(data: string): void {
    if (!this.isClosed) this.socket.write(data, "latin1");
  }

  /** Writes `data` one byte every `gapMs` until it is all sent or the server closes. */
  async trickle(data: string, gapMs: number): Promise<void> {
    for (const ch of data) {
      if (this.isClosed) return;
      this.write(ch);
      await delay(gapMs);
    }
  }

  /** The next whole response, and the ms from opening until it was complete; throws if none comes within `ms`. */
  async response(ms = PROMPTLY_MS): Promise<RawResponse & { atMs: number }> {
    const deadline = performance.now() + ms;
    for (;;) {
      const r = parseResponse(this.text.slice(this.consumed));
      if (r) {
        this.consumed += r.length;
        return { ...r.response, atMs: performance.now() - this.start };
      }
      assert.ok(!this.isClosed, `closed without a (further) response; got ${JSON.stringify(this.text.slice(0, 300))}`);
      assert.ok(performance.now() < deadline, `no response within ${ms} ms; got ${JSON.stringify(this.text.slice(0, 300))}`);
      await delay(10);
    }
  }

  /** The ms from opening until the server closed the connection; throws if it is still open after `ms`. */
  async closed(ms = PROMPTLY_MS): Promise<number> {
    const deadline = performance.now() + ms;
    while (this.closedAt === null) {
      assert.ok(performance.now() < deadline, `the connection is still open after ${ms} ms`);
      await delay(10);
    }
    return this.closedAt;
  }

  destroy(): void {
    this.socket.destroy();
    Conn.all.delete(this);
  }
}

function parseResponse(text: string): { response: RawResponse; length: number } | null {
  const end = text.indexOf("\r\n\r\n");
  if (end < 0) return null;
  const [statusLine = "", ...lines] = text.slice(0, end).split("\r\n");
  const headers: Record<string, string> = {};
  for (const l of lines) headers[l.slice(0, l.indexOf(":")).toLowerCase()] = l.slice(l.indexOf(":") + 1).trim();
  const length = Number(headers["content-length"] ?? 0);
  if (text.length < end + 4 + length) return null;
  return { response: { status: Number(statusLine.split(" ")[1]), headers, body: text.slice(end + 4, end + 4 + length) }, length: end + 4 + length };
}

/** Sends `request` on a new connection; its first response, and whether the server then closed the connection. */
async function ask(port: number, request: string): Promise<RawResponse & { closed: boolean }> {
  const c = await Conn.open(port);
  c.write(request);
  try {
    const r = await c.response();
    await delay(20);
    return { ...r, closed: c.isClosed };
  } finally {
    c.destroy();
  }
}

/** Asks on new connections until `done` holds for the response (a change the server applies asynchronously). */
async function askUntil(port: number, request: string, done: (r: RawResponse) => boolean): Promise<void> {
  const deadline = Date.now() + PROMPTLY_MS;
  for (let r = await ask(port, request); !done(r); r = await ask(port, request)) {
    assert.ok(Date.now() < deadline, `still ${r.status} after ${PROMPTLY_MS} ms: ${r.body}`);
    await delay(20);
  }
}

function assertApiError(r: RawResponse, status: number, code: string): void {
  assert.equal(r.status, status, `status; body: ${r.body}`);
  assert.match(r.headers["content-type"] ?? "", /^application\/json/);
  const body = JSON.parse(r.body) as { error: Record<string, unknown> };
  assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
  assert.equal(body.error.code, code);
  assert.equal(body.error.param, null);
  assert.equal(typeof body.error.message, "string");
  assert.equal(typeof body.error.type, "string");
}

const get = (path: string, host = "localhost", extra = ""): string => `GET ${path} HTTP/1.1\r\nHost: ${host}\r\n${extra}\r\n`;
const post = (path: string, headers: string, body = ""): string => `POST ${path} HTTP/1.1\r\nHost: localhost\r\n${headers}\r\n${body}`;
const json = (body: string): string => `Content-Type: application/json\r\nContent-Length: ${body.length}\r\n`;
const CHAT = JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 2 });

function preflight(url: string, origin: string, path = "/v1/chat/completions"): Promise<Response> {
  return fetch(`${url}${path}`, {
    method: "OPTIONS",
    headers: { origin, "access-control-request-method": "POST", "access-control-request-headers": "authorization, content-type, x-stainless-os" },
  });
}

test("preflight: an allowed origin gets 204 with the grant before auth, on any path; another origin gets 403 and no grant", async () => {
  await withServer({ apiKey: KEY, http: { allowedOrigins: [APP] } }, async (s) => {
    for (const path of ["/v1/chat/completions", "/no/such/route"]) {
      const r = await preflight(s.url, APP, path);
      assert.equal(r.status, 204, path);
      assert.equal(r.headers.get("access-control-allow-origin"), APP);
      assert.match(r.headers.get("access-control-allow-methods") ?? "", /\bPOST\b/);
      const allowed = (r.headers.get("access-control-allow-headers") ?? "").split(/,\s*/);
      for (const h of ["authorization", "content-type", "x-stainless-os"]) assert.ok(allowed.includes(h), `${h} allowed: ${allowed.join(",")}`);
      assert.ok(Number(r.headers.get("access-control-max-age")) > 0);
      assert.match(r.headers.get("vary") ?? "", /\bOrigin\b/);
      assert.equal(r.headers.get("access-control-allow-credentials"), null);
    }
    const refused = await preflight(s.url, "https://evil.example");
    const body = await refused.text();
    assertApiError({ status: refused.status, headers: { "content-type": refused.headers.get("content-type") ?? "" }, body }, 403, "origin_not_allowed");
    assert.equal(refused.headers.get("access-control-allow-origin"), null);
    assert.equal(refused.headers.get("access-control-allow-methods"), null);
  });
  await withServer({ http: {} }, async (s) => {
    assert.equal((await preflight(s.url, APP)).status, 403, "no origin is allowed by default");
  });
  await withServer({ http: { allowedOrigins: ["*"] } }, async (s) => {
    const r = await preflight(s.url, "https://anything.example");
    assert.equal(r.status, 204);
    assert.equal(r.headers.get("access-control-allow-origin"), "https://anything.example");
  });
});

test("CORS: JSON, error and streamed responses to an allowed origin carry the grant; others get only Vary", async () => {
  await withServer({ apiKey: KEY, http: { allowedOrigins: [APP] } }, async (s) => {
    const auth = { authorization: `Bearer ${KEY}` };
    const assertGrant = (r: Response, what: string): void => {
      assert.equal(r.headers.get("access-control-allow-origin"), APP, what);
      assert.match(r.headers.get("vary") ?? "", /\bOrigin\b/, what);
      assert.match(r.headers.get("access-control-expose-headers") ?? "", /retry-after/, what);
    };
    const models = await fetch(`${s.url}/v1/models`, { headers: { origin: APP, ...auth } });
    assert.equal(models.status, 200);
    assertGrant(models, "JSON");
    await models.text();

    const noKey = await fetch(`${s.url}/v1/models`, { headers: { origin: APP } });
    assert.equal(noKey.status, 401);
    assertGrant(noKey, "401");
    await noKey.text();

    const stream = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST", headers: { origin: APP, "content-type": "application/json", ...auth },
      body: JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }], max_tokens: 3, stream: true }),
    });
    assert.equal(stream.status, 200);
    assert.match(stream.headers.get("content-type") ?? "", /^text\/event-stream/);
    assertGrant(stream, "SSE");
    assert.match(await stream.text(), /data: \[DONE\]/);

    const other = await fetch(`${s.url}/v1/models`, { headers: { origin: "https://evil.example", ...auth } });
    assert.equal(other.status, 200, "a request from another origin is served; the browser hides the answer");
    assert.equal(other.headers.get("access-control-allow-origin"), null);
    assert.match(other.headers.get("vary") ?? "", /\bOrigin\b/, "caches keep answers per origin");
    await other.text();
  });
});

test("Host check with auth off: only localhost, IP literals and --allowed-hosts are answered; it follows auth turning on", async () => {
  await withServer({ http: { allowedHosts: ["api.example"] } }, async (s, port) => {
    for (const host of [`localhost:${port}`, "localhost", `127.0.0.1:${port}`, `[::1]:${port}`, "10.1.2.3:8000", "API.example:443", "api.example."]) {
      assert.equal((await ask(port, get("/health", host))).status, 200, host);
    }
    for (const host of ["evil.example", `evil.example:${port}`, "localhost.evil.example", "127.0.0.1.nip.io"]) {
      assertApiError(await ask(port, get("/health", host)), 403, "host_not_allowed");
    }
    const refused = await ask(port, get("/v1/models", "evil.example"));
    assertApiError(refused, 403, "host_not_allowed");
    assert.match(refused.body, /evil\.example/);

    s.store.create("first", "normal");
    await askUntil(port, get("/v1/models"), (r) => r.status === 401); // auth is on
    assertApiError(await ask(port, get("/health", "evil.example")), 403, "host_not_allowed"); // --allowed-hosts: checked with auth on too
  });
  await withServer({ http: {} }, async (s, port) => {
    assertApiError(await ask(port, get("/health", "evil.example")), 403, "host_not_allowed");
    // The first key turns auth on; a page on a rebound name has no key, so its Host no longer matters.
    s.store.create("first", "normal");
    await askUntil(port, get("/health", "evil.example"), (r) => r.status === 200);
  });
});

test("Host check with auth on: unrestricted without --allowed-hosts, enforced with it", async () => {
  await withServer({ apiKey: KEY, http: {} }, async (_s, port) => {
    assert.equal((await ask(port, get("/health", "evil.example"))).status, 200);
    assertApiError(await ask(port, get("/v1/models", "evil.example")), 401, "invalid_api_key");
  });
  await withServer({ apiKey: KEY, http: { allowedHosts: ["api.example"] } }, async (_s, port) => {
    assert.equal((await ask(port, get("/health", "api.example:443"))).status, 200);
    assert.equal((await ask(port, get("/health", "localhost"))).status, 200);
    assertApiError(await ask(port, get("/health", "evil.example")), 403, "host_not_allowed");
  });
});

test("a body that trickles is cut with a 408 within the request timeout", async () => {
  await withServer({ http: { limits: FAST } }, async (_s, port) => {
    const c = await Conn.open(port);
    c.write(post("/v1/chat/completions", "Content-Type: application/json\r\nContent-Length: 100\r\n"));
    void c.trickle("x".repeat(100), 100); // 10 s if never cut
    const r = await c.response();
    assertApiError(r, 408, "request_timeout");
    assert.ok(r.atMs >= FAST.requestTimeoutMs - 50 && r.atMs < FAST.requestTimeoutMs + PROMPTLY_MS, `answered at ${r.atMs} ms`);
    await c.closed();
  });
});

test("headers that trickle are cut with a 408; a kept-alive connection may idle past the header and request timeouts", async () => {
  await withServer({ http: { limits: FAST } }, async (_s, port) => {
    const c = await Conn.open(port);
    c.write("GET /health HTTP/1.1\r\nHost: localhost\r\n");
    void c.trickle("X-Slow: " + "x".repeat(100), 100);
    const r = await c.response();
    assertApiError(r, 408, "request_timeout");
    assert.ok(r.atMs < FAST.headersTimeoutMs + PROMPTLY_MS, `answered at ${r.atMs} ms`);
    await c.closed();

    const idle = await Conn.open(port);
    idle.write(get("/health"));
    assert.equal((await idle.response()).status, 200);
    await delay(FAST.requestTimeoutMs * 2);
    idle.write(get("/health"));
    assert.equal((await idle.response()).status, 200);
    idle.destroy();
  });
});

test("a client that keeps sending after its 401 is disconnected; one that finishes its body keeps its connection", async () => {
  await withServer({ apiKey: KEY, http: { limits: { earlyAnswerGraceMs: FAST.earlyAnswerGraceMs } } }, async (_s, port) => {
    const c = await Conn.open(port);
    c.write(post("/v1/chat/completions", "Content-Type: application/json\r\nContent-Length: 100000\r\n"));
    void c.trickle("x".repeat(1000), 20); // 20 s if never cut; the request timeout is the default 60 s
    const r = await c.response();
    assertApiError(r, 401, "invalid_api_key");
    const closedAt = await c.closed();
    assert.ok(closedAt - r.atMs < PROMPTLY_MS, `closed ${closedAt - r.atMs} ms after the 401`);

    const honest = await Conn.open(port);
    honest.write(post("/v1/chat/completions", json(CHAT), CHAT));
    assertApiError(await honest.response(), 401, "invalid_api_key");
    honest.write(get("/health"));
    assert.equal((await honest.response()).status, 200);
    honest.destroy();
  });
});

test("a request for no route is answered 404 at once, whatever its body: with or without Content-Length, chunked, incomplete", async () => {
  await withServer({ http: { limits: { ...FAST, requestTimeoutMs: 60_000 } } }, async (_s, port) => {
    const body = '{"a":1}';
    const cases = {
      "content-length": post("/nope", json(body), body),
      "chunked": post("/nope", "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", `7\r\n${body}\r\n0\r\n\r\n`),
      "no body": post("/nope", "Content-Type: application/json\r\n"),
      "incomplete": post("/nope", "Content-Type: application/json\r\nContent-Length: 1000\r\n", body),
      "incomplete chunked": post("/nope", "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n", `7\r\n${body}\r\n`),
      "GET": get("/nope"),
    };
    for (const [name, request] of Object.entries(cases)) {
      const c = await Conn.open(port);
      c.write(request);
      const r = await c.response();
      assertApiError(r, 404, "not_found");
      assert.match(r.body, /No route for (POST|GET) \/nope/, name);
      if (name.startsWith("incomplete")) {
        await c.closed(); // the body never comes: closed after the grace, long before the request timeout
      } else {
        c.write(get("/health"));
        assert.equal((await c.response()).status, 200, `${name}: the connection is kept`);
      }
      c.destroy();
    }
    // A body with neither length nor chunking is not a body: its bytes are a malformed next request.
    const unframed = await Conn.open(port);
    unframed.write(post("/nope", "Content-Type: application/json\r\n", "{\"a\":1}\r\n\r\n"));
    const first = await unframed.response();
    assertApiError(first, first.status, first.status === 404 ? "not_found" : "bad_request"); // 400 when both arrive in one read
    await unframed.closed();
  });
});

test("parser-level errors are answered in OpenAI's shape: 400, 431, 413, and the connection is closed", async () => {
  await withServer({ bodyLimit: 1024, http: { limits: FAST } }, async (_s, port) => {
    const cases: [string, string, number, string][] = [
      ["bad content-length", post("/v1/chat/completions", "Content-Type: application/json\r\nContent-Length: abc\r\n"), 400, "bad_request"],
      ["content-length and chunked", post("/v1/chat/completions", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n"), 400, "bad_request"],
      ["malformed request line", "GARBAGE\r\n\r\n", 400, "bad_request"],
      ["bad HTTP version", "GET /health HTTP/9.x\r\nHost: localhost\r\n\r\n", 400, "bad_request"],
      ["headers too large", get("/health", "localhost", `X-Big: ${"a".repeat(20_000)}\r\n`), 431, "headers_too_large"],
      ["body too large", post("/v1/chat/completions", "Content-Type: application/json\r\nContent-Length: 5000\r\n", "x".repeat(5000)), 413, "body_too_large"],
    ];
    for (const [name, request, status, code] of cases) {
      const r = await ask(port, request);
      assertApiError(r, status, code);
      assert.ok(r.closed, `${name}: closed`);
    }
    const noHost = await ask(port, "GET /health HTTP/1.1\r\n\r\n");
    assertApiError(noHost, 400, "bad_request");
    assert.match(noHost.body, /Host/);
    assert.equal((await ask(port, "GET /health HTTP/1.0\r\n\r\n")).status, 200, "HTTP/1.0 needs no Host");
  });
});

test("beyond --max-connections a new connection is answered 503 with Retry-After and closed; a freed slot is served", async () => {
  await withServer({ http: { limits: { maxConnections: 2 } } }, async (_s, port) => {
    const held = [await Conn.open(port), await Conn.open(port)];
    for (const c of held) {
      c.write(get("/health"));
      assert.equal((await c.response()).status, 200);
    }
    const refused = await ask(port, get("/health"));
    assertApiError(refused, 503, "too_many_connections");
    assert.ok(Number(refused.headers["retry-after"]) > 0);
    assert.ok(refused.closed);
    for (const c of held) {
      c.write(get("/health"));
      assert.equal((await c.response()).status, 200, "the connections within the cap are still served");
    }
    held[0]!.destroy();
    await askUntil(port, get("/health"), (r) => r.status === 200);
    held[1]!.destroy();
  });
});
