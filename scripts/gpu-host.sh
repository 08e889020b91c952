#!/bin/sh
# Runs on the GPU host, from the folder scripts/gpu-bundle.mjs wrote: unpacks Node and Weft into
# $WEFT_HOME (default /tmp/weft), builds the addon with nvcc (CUDA 12/13 toolkit with cuBLAS), then
# runs the given command in the unpacked tree, with `node` on PATH and WEFT_FIXTURES set where the
# bundle carries fixtures. Example: sh gpu-host.sh node dist/src/cli.js bench profile --model m --device cuda
set -eu
here=$(cd "$(dirname "$0")" && pwd)
home=${WEFT_HOME:-/tmp/weft}
mkdir -p "$home/node"
if [ ! -x "$home/node/bin/node" ]; then xz -dc "$here/node.tar.xz" | tar -xf - -C "$home/node"; fi
if [ ! -d "$home/weft" ]; then xz -dc "$here/weft.tar.xz" | tar -xf - -C "$home"; fi
# llama.cpp (gpu-bundle.mjs --llama-cpp or --llama-cpp-cpu): node-llama-cpp; for the CUDA build, libggml-cuda.so put back
# together from its parts, found here or in $WEFT_PARTS (where earlier calls left them).
lib="$home/weft/node_modules/@node-llama-cpp/linux-x64-cuda/bins/linux-x64-cuda/libggml-cuda.so"
if [ -f "$here/llama-cpp.tar.xz" ] && [ ! -d "$home/weft/node_modules/node-llama-cpp" ]; then xz -dc "$here/llama-cpp.tar.xz" | tar -xf - -C "$home"; fi
if [ -d "$home/weft/node_modules/node-llama-cpp" ] && [ ! -f "$lib" ]; then
  parts=$(ls "${WEFT_PARTS:-$here}"/ggml-cuda.xz.* 2>/dev/null || true)
  if [ -n "$parts" ]; then cat $parts | xz -dc >"$lib.tmp" && mv "$lib.tmp" "$lib"; fi
fi
export PATH="$home/node/bin:${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"
if [ -d "$here/fixtures" ]; then export WEFT_FIXTURES="$here/fixtures"; fi
cd "$home/weft"
if [ ! -f build/Release/weft_native.node ]; then
  # The GPU's own SM version (e.g. 90 on an H100) unless WEFT_CUDA_ARCH names others; WEFT_CUDA=0
  # builds the CPU addon alone (for the host's CPU, without nvcc's minute).
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
  WEFT_CUDA=${WEFT_CUDA:-1} WEFT_CUDA_ARCH=${WEFT_CUDA_ARCH:-${arch:-90}} node --input-type=module \
    -e 'import { nodeGyp } from "./scripts/node-gyp.mjs"; nodeGyp(["rebuild", "--release"], process.cwd());' >"$home/build.log" 2>&1 ||
    { tail -50 "$home/build.log"; exit 1; }
fi
if [ "$#" -gt 0 ]; then exec "$@"; fi
