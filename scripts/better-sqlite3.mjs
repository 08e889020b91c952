// Gives better-sqlite3 a binary for the running Node, built from source (npm runs no dependency
// install scripts here, and its prebuilt download needs a network we may not have).
// better-sqlite3 12 uses V8's C++ API, not Node-API, so a binary fits one Node ABI (NODE_MODULE_VERSION).
// Each ABI's binary goes to lib/binding/node-v<ABI>-<platform>-<arch>/, a folder its loader (`bindings`)
// searches, so one tree runs on several Node majors (CI runs the suite on two). build/Release, which
// the loader searches first, is left without a binary.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, renameSync, rmSync } from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { headerFile, headersDir, nodeGyp } from "./node-gyp.mjs";

const require = createRequire(import.meta.url);

// Its classes derive from node::ObjectWrap, whose header-only code from Node 24.19 on aborts the process
// when V8 collects a wrapped object outside a JS context (nodejs/node#65446). The ABI did not change,
// so on Node 24 it is built against the last headers before that, from the npm registry.
const NODE24_HEADERS = "24.18.1";

export function ensureBetterSqlite() {
  const root = path.dirname(require.resolve("better-sqlite3/package.json"));
  const abi = `node-v${process.versions.modules}-${process.platform}-${process.arch}`;
  const slot = path.join(root, "lib", "binding", abi, "better_sqlite3.node");
  const build = path.join(root, "build");
  const built = path.join(build, "Release", "better_sqlite3.node");
  const dir = headersDir();
  const safe = !process.versions.node.startsWith("24.") || (dir !== null && !objectWrapHooks(dir));
  // A binary left in build/Release (by better-sqlite3's own install script, where npm runs it) is kept
  // if it fits this Node, unless it may have been built against Node 24 headers with that abort.
  if (existsSync(built) && safe && loads(built)) moveTo(built, slot);
  rmSync(build, { recursive: true, force: true });
  if (existsSync(slot)) return;
  const headers = safe ? { dir, tmp: null } : node24Headers();
  console.log(`building better-sqlite3 for Node ${process.versions.node} (${abi}) against ${headers.dir ?? "downloaded headers"}: about a minute…`);
  try {
    nodeGyp(["rebuild", "--release"], root, headers.dir);
    moveTo(built, slot);
  } finally {
    rmSync(build, { recursive: true, force: true });
    if (headers.tmp) rmSync(headers.tmp, { recursive: true, force: true });
  }
}

/** Node 24.18.1's headers, unpacked into a temporary folder from the registry's node-<platform>-<arch> package. */
function node24Headers() {
  const tmp = mkdtempSync(path.join(os.tmpdir(), "weft-node-headers-"));
  const pkg = `node-${process.platform}-${process.arch}`;
  execFileSync("npm", ["pack", "--silent", "--pack-destination", tmp, `${pkg}@${NODE24_HEADERS}`], { stdio: ["ignore", "ignore", "inherit"] });
  execFileSync("tar", ["-xzf", path.join(tmp, `${pkg}-${NODE24_HEADERS}.tgz`), "-C", tmp, "package/include"]);
  return { dir: path.join(tmp, "package"), tmp };
}

function objectWrapHooks(dir) {
  return /RemoveEnvironmentCleanupHook/.test(headerFile(dir, "node_object_wrap.h") ?? "");
}

function loads(binary) {
  try {
    require(binary);
    return true;
  } catch {
    return false;
  }
}

function moveTo(from, to) {
  mkdirSync(path.dirname(to), { recursive: true });
  renameSync(from, to);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) ensureBetterSqlite();
