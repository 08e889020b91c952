// Whether to build the addon's CUDA backend, and where the toolkit is: binding.gyp asks this script.
// WEFT_CUDA=1 forces the CUDA build (and fails where the toolkit is incomplete), WEFT_CUDA=0 turns it
// off; otherwise it is built when `nvcc` is on PATH and cuBLAS's headers sit beside it. A machine
// without them builds the CPU addon exactly as before.
//   node scripts/cuda.mjs         1 or 0
//   node scripts/cuda.mjs home    the toolkit's folder (bin/nvcc, include, lib64)
//   node scripts/cuda.mjs arch    nvcc's -gencode flags (WEFT_CUDA_ARCH=90,80 picks the SM versions)
import { existsSync, realpathSync } from "node:fs";
import path from "node:path";

/** The toolkit folder: WEFT_CUDA_HOME, CUDA_HOME, or the one holding the nvcc on PATH; null when none. */
export function cudaHome() {
  const given = process.env.WEFT_CUDA_HOME ?? process.env.CUDA_HOME;
  if (given) return given;
  for (const dir of (process.env.PATH ?? "").split(path.delimiter)) {
    const nvcc = path.join(dir, "nvcc");
    if (dir && existsSync(nvcc)) return path.dirname(path.dirname(realpathSync(nvcc)));
  }
  return null;
}

/** Whether the CUDA backend is built, and why not when it is not. */
export function cudaBuild() {
  const forced = process.env.WEFT_CUDA;
  if (forced === "0") return { build: false, why: "WEFT_CUDA=0" };
  const home = cudaHome();
  const complete = home !== null && existsSync(path.join(home, "bin", "nvcc")) && existsSync(path.join(home, "include", "cublas_v2.h"));
  if (forced === "1") {
    if (!complete) throw new Error(`WEFT_CUDA=1 but no CUDA toolkit with nvcc and cuBLAS was found (${home ?? "no nvcc on PATH"}); set WEFT_CUDA_HOME`);
    return { build: true, why: "WEFT_CUDA=1" };
  }
  if (home === null) return { build: false, why: "no nvcc on PATH" };
  if (!complete) return { build: false, why: `${home} has nvcc but no cuBLAS headers` };
  return { build: true, why: `nvcc in ${home}` };
}

function gencode() {
  const archs = (process.env.WEFT_CUDA_ARCH ?? "90,80").split(",").map((a) => a.trim()).filter(Boolean);
  const flags = archs.map((a) => `-gencode=arch=compute_${a},code=sm_${a}`);
  const last = archs.at(-1);
  if (last) flags.push(`-gencode=arch=compute_${last},code=compute_${last}`);  // PTX for newer GPUs
  return flags.join(" ");
}

const what = process.argv[2];
if (what === "home") console.log(cudaHome() ?? "/usr/local/cuda");
else if (what === "arch") console.log(gencode());
else if (import.meta.url === `file://${process.argv[1]}`) {
  const { build, why } = cudaBuild();
  if (!build && process.env.WEFT_CUDA !== "0") console.error(`weft: building the CPU addon only (${why})`);
  console.log(build ? 1 : 0);
}
