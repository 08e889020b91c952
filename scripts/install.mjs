// `npm install` / `npm ci`: builds the native addon, and better-sqlite3 from source
// when it has no binary yet (npm does not run dependencies' install scripts here,
// and its prebuilt download needs a network we may not have).
import { execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(import.meta.url);
const gyp = require.resolve("node-gyp/bin/node-gyp.js");
const run = (args, cwd) => execFileSync(process.execPath, [gyp, ...args], { cwd, stdio: "inherit" });

run(["rebuild", "--release"], process.cwd());
const sqlite = path.dirname(require.resolve("better-sqlite3/package.json"));
if (!existsSync(path.join(sqlite, "build", "Release", "better_sqlite3.node"))) {
  console.log("building better-sqlite3 from source (about a minute)…");
  run(["rebuild", "--release"], sqlite);
}
