#!/bin/sh
# On the GPU host, from the folder scripts/gpu-bundle.mjs wrote: builds the addon (gpu-host.sh),
# runs the CUDA tests, then the benchmarks of docs/GPU.md on a random-weight qwen3-0.6b:
# `weft bench profile` (decode steps at 1/32/128/512 sequences, a 512-token prefill), transformers on
# the same checkpoint and workloads (scripts/gpu-baseline.py: its forward loop, static `generate` and
# continuous batching `generate_batch`), and `weft bench` through the engine at 1/32/128/512 concurrent.
# Everything lands in the folder given (default /tmp/weft-out).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/weft-out}
mkdir -p "$out"
export WEFT_HOME=${WEFT_HOME:-/tmp/weft}
sh "$here/gpu-host.sh" true || { cp "$WEFT_HOME/build.log" "$out/build.log" 2>/dev/null; exit 1; }
cp "$WEFT_HOME/build.log" "$out/build.log"
run() { name=$1; shift; echo "== $name: $*"; timeout "${LIMIT:-300}" sh "$here/gpu-host.sh" "$@" >"$out/$name.txt" 2>&1; echo "   exit $?"; tail -n "${TAIL:-25}" "$out/$name.txt"; }
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
TAIL=6 run test-cuda node --test --test-concurrency=1 dist/test/cuda.test.js
grep -E "max \|Δ|leaves|NOTICE|^not ok|CUDA:" "$out/test-cuda.txt"
model=/tmp/weft-qwen3-0.6b
[ -d "$model" ] || run make-model node dist/src/cli.js make-model --preset qwen3-0.6b --out "$model"
batches=1,32,128,512
run profile node dist/src/cli.js bench profile --model "$model" --device cuda --batch $batches --context 128 --prefill 512 --steps 16
run transformers python3 scripts/gpu-baseline.py --model "$model" --batch $batches --context 128 --prefill 512 --steps 16 --json "$out/transformers.json"
for c in ${LEVELS:-1 32 128 512}; do
  run "bench-c$c" node dist/src/cli.js bench --model "$model" --device cuda --concurrency "$c" --num-prompts "$c" \
    --prompt-len 128 --output-len 128 --max-num-batched-tokens 4096 --kv-cache-memory 25769803776 --json "$out/bench-c$c.json"
done
# Where the GPU time goes: kernels timed between CUDA events (graphs off while timing).
WEFT_CUDA_PROFILE=1 TAIL=8 run profile-events node dist/src/cli.js bench profile --model "$model" --device cuda --batch $batches --context 128 --prefill 512 --steps 16
# The same profile with decode graphs off: what the CUDA graphs buy.
WEFT_CUDA_GRAPHS=0 TAIL=8 run profile-nographs node dist/src/cli.js bench profile --model "$model" --device cuda --batch $batches --context 128 --prefill 0 --steps 16
# Inside the decode graphs: every kernel's GPU time over 500 one-sequence steps (CUPTI), and the host's split.
run step-split node scripts/step-split.mjs --model "$model" --batch 1 --context 128
TAIL=20 run cuda-trace sh scripts/cuda-trace.sh "$out/cuda-trace.tsv" node scripts/step-split.mjs --model "$model" --batch 1 --context 128
# Over HTTP: `weft serve` on the GPU (KV pool sized by --gpu-memory-utilization), 128 concurrent streams.
sh "$here/gpu-host.sh" node dist/src/cli.js serve --model "q06=$model" --port 8123 --device cuda --gpu-memory-utilization 0.6 \
  --max-num-seqs 256 --max-num-batched-tokens 4096 >"$out/serve.log" 2>&1 &
server=$!
i=0; until curl -sf http://127.0.0.1:8123/health >/dev/null 2>&1 || [ $i -ge 60 ]; do sleep 1; i=$((i + 1)); done
curl -s http://127.0.0.1:8123/v1/models >"$out/models.json"; cat "$out/models.json"; echo
run bench-serve-c128 node dist/src/cli.js bench serve --base-url http://127.0.0.1:8123 --model q06 --concurrency 128 --num-prompts 256 \
  --prompt-len 128 --output-len 128 --json "$out/bench-serve-c128.json"
kill "$server" 2>/dev/null; grep -E "device|KV cache" "$out/serve.log" | head -5
# transformers on the same serving workload: static generate and continuous batching (paged attention).
LIMIT=540 run transformers-serving python3 scripts/gpu-baseline.py --model "$model" --mode serving --concurrency $batches \
  --prompt-len 128 --output-len 128 --json "$out/transformers-serving.json"
