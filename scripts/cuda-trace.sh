#!/bin/sh
# Runs a command with every kernel and memcpy it puts on the GPU recorded (scripts/cuda-trace.cpp),
# then prints the per-step summary (scripts/cuda-trace-summary.py). On the GPU host, in the unpacked tree:
#   sh scripts/cuda-trace.sh OUT.tsv node scripts/step-split.mjs --model M --batch 1
set -eu
[ "$#" -ge 2 ] || { echo "usage: sh scripts/cuda-trace.sh OUT.tsv COMMAND..." >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
trace=$1
shift
cuda=${CUDA_HOME:-/usr/local/cuda}
header=$(find "$cuda/" -name cupti_activity.h 2>/dev/null | head -1)
library=$(find "$cuda/" -name 'libcupti.so*' 2>/dev/null | head -1)
[ -n "$header" ] && [ -n "$library" ] || { echo "cuda-trace: no CUPTI under $cuda (set CUDA_HOME)" >&2; exit 1; }
inc=$(dirname "$header")
lib=$(dirname "$library")
so=${TMPDIR:-/tmp}/weft-cuda-trace.so
if [ ! -f "$so" ]; then
  # The newest versioned records (CUpti_ActivityKernelN, CUpti_ActivityMemcpyN) these headers define.
  newest() { cat "$inc"/cupti_activity*.h | grep -o "CUpti_Activity$1[0-9][0-9]*;" | sort -V | tail -1 | tr -d ';'; }
  g++ -O2 -shared -fPIC -DKernelRecord="$(newest Kernel)" -DMemcpyRecord="$(newest Memcpy)" -I"$inc" -I"$cuda/include" \
    "$here/cuda-trace.cpp" -L"$lib" -lcupti -Wl,-rpath,"$lib" -o "$so"
fi
CUDA_INJECTION64_PATH=$so WEFT_TRACE_OUT=$trace "$@"
python3 "$here/cuda-trace-summary.py" "$trace"
