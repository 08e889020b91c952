// `npm install` / `npm ci`: builds the native addon, and gives better-sqlite3 a binary for this Node.
// The addon uses Node-API only (NAPI_VERSION 8 in binding.gyp): one build loads on every Node major
// weft supports, whichever Node's headers built it. better-sqlite3 needs one per major (better-sqlite3.mjs).
import { ensureBetterSqlite } from "./better-sqlite3.mjs";
import { nodeGyp } from "./node-gyp.mjs";

nodeGyp(["rebuild", "--release"], process.cwd());
ensureBetterSqlite();
