"""Per-step summary of a scripts/cuda-trace.sh trace of Weft decode steps.

A step begins at its embedding kernel; the last --steps steps are averaged: the GPU span from the
step's first kernel to its last, the idle gaps between consecutive kernels, how long kernels overlapped
(programmatic dependent launch lets a kernel start before the one before it ends), the time from a
step's last kernel to the next step's first (the host's side), and each kernel's mean duration.
  python3 scripts/cuda-trace-summary.py TRACE.tsv [--steps 100]
"""
import argparse
import collections
import re
import shutil
import subprocess

ap = argparse.ArgumentParser()
ap.add_argument("trace")
ap.add_argument("--steps", type=int, default=100)
args = ap.parse_args()

rows = []
with open(args.trace) as f:
    for line in f:
        p = line.rstrip("\n").split("\t")
        rows.append((int(p[0]), int(p[1]), p[7], p[3:6]))
rows.sort()
names = sorted({r[2] for r in rows})
if shutil.which("c++filt"):
    plain = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.split("\n")
    names = dict(zip(names, plain))
else:
    names = {n: n for n in names}


def label(r):
    n = re.sub(r"weft::cuda::\(anonymous namespace\)::|^void |\(.*\)$", "", names[r[2]])
    return n if n.startswith("memcpy") else f"{n} grid {'x'.join(r[3])}"


kernels = [r for r in rows if not r[2].startswith("memcpy")]
starts = [i for i, r in enumerate(kernels) if "embedKernel" in r[2]]
steps = [kernels[a:b] for a, b in zip(starts, starts[1:])][-args.steps:]
if not steps:
    raise SystemExit("no complete decode steps in the trace")
span = gap = overlap = 0.0
total = collections.defaultdict(float)
count = collections.Counter()
for s in steps:
    span += s[-1][1] - s[0][0]
    for a, b in zip(s, s[1:]):
        d = b[0] - a[1]
        gap += max(d, 0)
        overlap += max(-d, 0)
    for r in s:
        total[label(r)] += r[1] - r[0]
        count[label(r)] += 1
host = sum(b[0][0] - a[-1][1] for a, b in zip(steps, steps[1:])) / max(len(steps) - 1, 1)
n = len(steps)
print(f"{n} steps, us a step: GPU span {span / n / 1e3:.1f}, idle gaps between kernels {gap / n / 1e3:.1f}, "
      f"kernels overlapping {overlap / n / 1e3:.1f}, last kernel to the next step's first {host / 1e3:.1f}")
print(f"{'us a step':>10} {'count':>6} {'us each':>8}  kernel")
for k, v in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"{v / n / 1e3:10.1f} {count[k] / n:6.0f} {v / count[k] / 1e3:8.2f}  {k}")
