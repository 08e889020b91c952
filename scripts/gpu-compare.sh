#!/bin/sh
# On the GPU host, from the folder scripts/gpu-bundle.mjs wrote: two builds of the bundle's tree, one
# with its native folder replaced by folder A and one by folder B (say a commit's and a variant's, each
# a whole native/ as `git archive COMMIT native` has it, the addon's C++ and its cuda/ kernels alike),
# built side by side, then scripts/step-split.mjs on each in turn, A and B alternating, ROUNDS times
# (default 2), with the arguments given. One line a run: the backend's µs a step and the greedy tokens'
# hash (the same hash: the same bits). The model (a random qwen3-0.6b unless WEFT_MODEL names one) is
# made once; the builds stay in /tmp/weft-compare-A and -B for further runs.
#   sh gpu-compare.sh A B --batch 1 --context 128 --steps 300
set -eu
[ "$#" -ge 2 ] || { echo "usage: sh gpu-compare.sh A_DIR B_DIR [step-split.mjs arguments]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
a=$(cd "$1" && pwd)
b=$(cd "$2" && pwd)
shift 2
model=${WEFT_MODEL:-/tmp/weft-qwen3-0.6b}
[ -d "$a/cuda" ] && [ -d "$b/cuda" ] || { echo "gpu-compare: A and B must each be a whole native/ folder (with cuda/)" >&2; exit 2; }
build() {  # build NAME DIR: the bundle's tree in /tmp/weft-compare-NAME with DIR as its native/
  home=/tmp/weft-compare-$1
  rm -rf "$home"
  mkdir -p "$home"
  xz -dc "$here/weft.tar.xz" | tar -xf - -C "$home"
  rm -rf "$home/weft/native"
  cp -R "$2" "$home/weft/native"
  WEFT_HOME=$home sh "$here/gpu-host.sh" true >/dev/null 2>&1 || { echo "build $1 failed:" >&2; tail -20 "$home/build.log" >&2; exit 1; }
}
build A "$a" &
first=$!
build B "$b" &
second=$!
wait $first
wait $second
[ -d "$model" ] || WEFT_HOME=/tmp/weft-compare-A sh "$here/gpu-host.sh" node dist/src/cli.js make-model --preset qwen3-0.6b --out "$model" >/dev/null
i=0
while [ $i -lt "${ROUNDS:-2}" ]; do
  for w in A B; do
    echo "$w: $(WEFT_HOME=/tmp/weft-compare-$w sh "$here/gpu-host.sh" node scripts/step-split.mjs --model "$model" "$@" 2>&1 | tail -1)"
  done
  i=$((i + 1))
done
