/** Model download from a loopback imitation of the hub's file endpoints, into the HF cache layout. */
import { test } from "node:test";
import assert from "node:assert/strict";
import http from "node:http";
import fs from "node:fs";
import path from "node:path";
import { createHash } from "node:crypto";
import { Writable } from "node:stream";
import { resolveModelSource } from "../src/model/registry.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";

const REPO = "weft-test/tiny-qwen3";
const COMMIT = "0123456789abcdef0123456789abcdef01234567";

/** Serves a model directory the way the hub does: tree listing, paths-info, and ranged resolve downloads. */
function fakeHub(dir: string): Promise<{ url: string; requests: string[]; close: () => void }> {
  const files = fs.readdirSync(dir).map((name) => {
    const data = fs.readFileSync(path.join(dir, name));
    return { name, data, oid: createHash("sha256").update(data).digest("hex") };
  });
  const requests: string[] = [];
  const server = http.createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    const url = new URL(req.url!, "http://x");
    if (url.pathname === `/api/models/${REPO}/tree/main`) {
      res.setHeader("content-type", "application/json");
      return res.end(JSON.stringify(files.map((f) => ({ type: "file", path: f.name, oid: f.oid, size: f.data.length }))));
    }
    if (url.pathname.startsWith(`/api/models/${REPO}/paths-info/`)) {
      let body = "";
      req.on("data", (d: Buffer) => (body += d.toString()));
      req.on("end", () => {
        const { paths } = JSON.parse(body) as { paths: string[] };
        res.setHeader("content-type", "application/json");
        res.end(JSON.stringify(files.filter((f) => paths.includes(f.name)).map((f) => ({
          type: "file", path: f.name, oid: f.oid, size: f.data.length, lfs: { oid: f.oid, size: f.data.length },
          lastCommit: { id: COMMIT, title: "init", date: "2026-01-01T00:00:00Z" },
        }))));
      });
      return;
    }
    const m = new RegExp(`^/${REPO}/resolve/[^/]+/(.+)$`).exec(url.pathname);
    const f = m && files.find((x) => x.name === decodeURIComponent(m[1]!));
    if (!f) {
      res.statusCode = 404;
      res.setHeader("x-error-code", "EntryNotFound");
      return res.end();
    }
    res.setHeader("etag", `"${f.oid}"`);
    const range = /bytes=(\d+)-(\d*)/.exec(req.headers.range ?? "");
    if (range) {
      const start = Number(range[1]), end = range[2] ? Number(range[2]) : f.data.length - 1;
      res.statusCode = 206;
      res.setHeader("content-range", `bytes ${start}-${end}/${f.data.length}`);
      return res.end(f.data.subarray(start, end + 1));
    }
    res.end(f.data);
  });
  return new Promise((resolve) => server.listen(0, "127.0.0.1", () => {
    const port = (server.address() as { port: number }).port;
    resolve({ url: `http://127.0.0.1:${port}`, requests, close: () => server.close() });
  }));
}

test("a repo id is downloaded into the hub cache with progress, loads, and is not downloaded twice", async () => {
  const hub = await fakeHub(fixtureModelDir());
  try {
    const cacheDir = tempDir();
    let progress = "";
    const sink = Object.assign(new Writable({ write(c: Buffer, _e, cb) { progress += c.toString(); cb(); } }), { isTTY: false });
    const dir = await resolveModelSource(REPO, { hubUrl: hub.url, cacheDir, progress: sink });
    assert.equal(dir, path.join(cacheDir, "models--weft-test--tiny-qwen3", "snapshots", COMMIT));
    assert.equal(fs.readFileSync(path.join(cacheDir, "models--weft-test--tiny-qwen3", "refs", "main"), "utf8"), COMMIT);
    assert.ok(fs.lstatSync(path.join(dir, "model.safetensors")).isSymbolicLink(), "snapshot files link to blobs");
    assert.match(progress, /100% model\.safetensors/);
    assert.equal(loadCheckpoint(dir).config.architecture, "Qwen3ForCausalLM");
    const before = hub.requests.length;
    const again = await resolveModelSource(REPO, { hubUrl: hub.url, cacheDir, progress: sink });
    assert.equal(again, dir);
    assert.equal(hub.requests.length, before, "a cached model makes no requests");
  } finally {
    hub.close();
  }
});
