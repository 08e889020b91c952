/**
 * `--model org/repo:QUANT`: the GGUF file tagged QUANT, from a hub cache laid
 * out as huggingface_hub lays it out (HF_HUB_CACHE, HF_HOME), or from a
 * loopback imitation of the hub with progress; clear errors otherwise.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { Writable } from "node:stream";
import { fileURLToPath } from "node:url";
import { exportGguf } from "../src/model/gguf-export.js";
import { quantizeModel } from "../src/model/gguf-quantize.js";
import { fileHasTag, pickQuantFile } from "../src/model/hub-gguf.js";
import { resolveModelSource } from "../src/model/registry.js";
import { loadCheckpoint } from "../src/model/checkpoint.js";
import { completeFixtureModel, tempDir } from "./helpers.js";
import { fakeHub as serveHub, type FakeHub } from "./support/fake-hub.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const REPO = "weft-test/Tiny-GGUF";
const COMMIT = "89abcdef0123456789abcdef0123456789abcdef";

let ggufs: Map<string, Buffer> | undefined;
/** Two real files of the tiny-qwen3 fixture, named as GGUF repos name them. */
function repoFiles(): Map<string, Buffer> {
  if (!ggufs) {
    const dir = tempDir("weft-hub-gguf-src-");
    exportGguf(completeFixtureModel("tiny-qwen3"), path.join(dir, "Tiny-BF16.gguf"), "bf16");
    quantizeModel(path.join(dir, "Tiny-BF16.gguf"), path.join(dir, "Tiny-Q8_0.gguf"), "q8_0");
    ggufs = new Map(["Tiny-BF16.gguf", "Tiny-Q8_0.gguf"].map((f) => [f, fs.readFileSync(path.join(dir, f))]));
  }
  return ggufs;
}

/** A hub cache holding `names` of the repo as huggingface_hub stores them: blobs, snapshot links, refs/main. */
function fakeCache(names: string[]): string {
  const cache = tempDir("weft-hub-cache-");
  const base = path.join(cache, `models--${REPO.replace("/", "--")}`);
  fs.mkdirSync(path.join(base, "blobs"), { recursive: true });
  fs.mkdirSync(path.join(base, "snapshots", COMMIT), { recursive: true });
  fs.mkdirSync(path.join(base, "refs"));
  fs.writeFileSync(path.join(base, "refs", "main"), COMMIT);
  for (const name of names) {
    const data = repoFiles().get(name) ?? Buffer.from(name);
    const blob = path.join(base, "blobs", createHash("sha256").update(data).digest("hex"));
    fs.writeFileSync(blob, data);
    fs.symlinkSync(path.relative(path.join(base, "snapshots", COMMIT), blob), path.join(base, "snapshots", COMMIT, name));
  }
  return cache;
}

test("tags: whole, case-insensitive tags in file names; none and several are clear errors", () => {
  assert.ok(fileHasTag("Qwen3-0.6B-Q8_0.gguf", "q8_0"));
  assert.ok(fileHasTag("sub/qwen2.5-0.5b-instruct-q4_k_m.gguf", "Q4_K_M"));
  assert.ok(!fileHasTag("Qwen3-0.6B-Q4_K_M.gguf", "Q4_K"), "Q4_K does not pick Q4_K_M");
  assert.ok(!fileHasTag("Qwen3-0.6B-Q8_0.gguf", "Q8"));
  const files = ["README.md", "Qwen3-0.6B-Q8_0.gguf", "Qwen3-0.6B-Q4_K_M.gguf", "Qwen3-0.6B-BF16.gguf"];
  assert.equal(pickQuantFile(REPO, "q4_k_m", files), "Qwen3-0.6B-Q4_K_M.gguf");
  assert.throws(() => pickQuantFile(REPO, "Q5_K_M", files), new RegExp(`^Error: ${REPO} has no GGUF file tagged Q5_K_M \\(tags there: BF16, Q4_K_M, Q8_0;`));
  assert.throws(() => pickQuantFile(REPO, "Q8_0", [...files, "q8_0/Qwen3-0.6B-Instruct-Q8_0.gguf"]),
    /2 GGUF files match Q8_0 \(Qwen3-0\.6B-Q8_0\.gguf, q8_0\/Qwen3-0\.6B-Instruct-Q8_0\.gguf\); serve one of them by its path/);
  assert.throws(() => pickQuantFile(REPO, "Q8_0", ["config.json"]), /has no GGUF files/);
});

test("cache: org/repo:QUANT picks the tagged file of the cached snapshot (HF_HUB_CACHE, HF_HOME) with no network, and it loads", async () => {
  const cache = fakeCache(["Tiny-BF16.gguf", "Tiny-Q8_0.gguf"]);
  const snapshot = path.join(cache, `models--${REPO.replace("/", "--")}`, "snapshots", COMMIT);
  // An unreachable hub: any request would fail the test.
  const offline = { hubUrl: "http://127.0.0.1:9" };
  assert.equal(await resolveModelSource(`${REPO}:q8_0`, { ...offline, cacheDir: cache }), path.join(snapshot, "Tiny-Q8_0.gguf"));
  const saved = { cache: process.env.HF_HUB_CACHE, home: process.env.HF_HOME };
  try {
    process.env.HF_HUB_CACHE = cache;
    assert.equal(await resolveModelSource(`${REPO}:BF16`, offline), path.join(snapshot, "Tiny-BF16.gguf"));
    delete process.env.HF_HUB_CACHE;
    const home = tempDir("weft-hf-home-");
    fs.renameSync(cache, path.join(home, "hub"));
    process.env.HF_HOME = home;
    const file = await resolveModelSource(`${REPO}:Q8_0`, offline);
    assert.equal(file, path.join(home, "hub", path.relative(cache, snapshot), "Tiny-Q8_0.gguf"));
    // hidden 48: rows of 48 are not whole 32-blocks, so those matrices fall back to F16; ffn_down's rows of 96 are Q8_0.
    const layer = loadCheckpoint(file).weights.layers[0]!;
    assert.deepEqual([layer.wq.dtype, layer.down.dtype], ["f16", "q8_0"]);
  } finally {
    for (const [k, v] of [["HF_HUB_CACHE", saved.cache], ["HF_HOME", saved.home]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
});

test("cli: weft generate --model org/repo:QUANT runs the cached file", () => {
  const cache = fakeCache(["Tiny-Q8_0.gguf"]);
  const out = execFileSync(process.execPath, [path.join(here, "..", "src", "cli.js"), "generate", "--model", `${REPO}:Q8_0`, "--prompt-ids", "1,2,3",
    "--max-tokens", "3", "--ignore-eos", "--json"], { encoding: "utf8", env: { ...process.env, HF_HUB_CACHE: cache, HF_ENDPOINT: "http://127.0.0.1:9" } });
  const r = JSON.parse(out) as { prompt_token_ids: number[]; token_ids: number[]; finish_reason: string };
  assert.deepEqual(r.prompt_token_ids, [1, 2, 3]);
  assert.equal(r.token_ids.length, 3);
  assert.equal(r.finish_reason, "length");
});

/** The hub's file endpoints for the repo's files. */
const fakeHub = (files: Map<string, Buffer>): Promise<FakeHub> => serveHub(REPO, COMMIT, files);

test("download: a tag not in the cache is fetched alone from the hub with progress; a missing tag lists the repo's tags", async () => {
  const hub = await fakeHub(new Map([...repoFiles(), ["README.md", Buffer.from("# tiny")]]));
  try {
    const cacheDir = fakeCache(["Tiny-BF16.gguf"]);
    let progress = "";
    const sink = Object.assign(new Writable({ write(c: Buffer, _e, cb) { progress += c.toString(); cb(); } }), { isTTY: false });
    const file = await resolveModelSource(`${REPO}:Q8_0`, { hubUrl: hub.url, cacheDir, progress: sink });
    assert.equal(file, path.join(cacheDir, `models--${REPO.replace("/", "--")}`, "snapshots", COMMIT, "Tiny-Q8_0.gguf"));
    assert.ok(fs.readFileSync(file).equals(repoFiles().get("Tiny-Q8_0.gguf")!));
    assert.match(progress, /100% Tiny-Q8_0\.gguf/);
    assert.ok(!hub.requests.some((r) => r.includes("Tiny-BF16")), "only the tagged file is fetched");
    const before = hub.requests.length;
    assert.equal(await resolveModelSource(`${REPO}:q8_0`, { hubUrl: hub.url, cacheDir, progress: sink }), file);
    assert.equal(hub.requests.length, before, "a cached file makes no requests");
    await assert.rejects(resolveModelSource(`${REPO}:Q4_K_M`, { hubUrl: hub.url, cacheDir, progress: sink }),
      new RegExp(`${REPO} has no GGUF file tagged Q4_K_M \\(tags there: BF16, Q8_0; files: Tiny-BF16\\.gguf, Tiny-Q8_0\\.gguf\\)`));
  } finally {
    hub.close();
  }
});
