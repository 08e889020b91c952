/** Model download from a loopback imitation of the hub's file endpoints, into the HF cache layout. */
import { test } from "node:test";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Writable } from "node:stream";
import { resolveModelSource } from "../src/model/registry.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { tempDir } from "./helpers.js";
import { fixtureModelDir } from "./support/server.js";
import { fakeHub as serveHub, type FakeHub } from "./support/fake-hub.js";

const REPO = "weft-test/tiny-qwen3";
const COMMIT = "0123456789abcdef0123456789abcdef01234567";

/** Serves a model directory the way the hub does. */
function fakeHub(dir: string): Promise<FakeHub> {
  return serveHub(REPO, COMMIT, new Map(fs.readdirSync(dir).map((name) => [name, fs.readFileSync(path.join(dir, name))])));
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
