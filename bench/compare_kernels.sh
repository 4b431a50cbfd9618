#!/usr/bin/env bash
# Side by side: `troupe bench kernels` and the same operations in PyTorch
# (bench/peers/torch_kernels.py) at the same shapes, on the CPU (1 thread, both on the OpenBLAS
# kernels Troupe chose from the CPU's features, as bench/compare_models.sh) or a CUDA device;
# alternating, RUNS times each; prints the medians and the ratio (PyTorch's time / Troupe's: above
# 1, Troupe is faster). On a GPU machine scripts/gpu-check.sh does the same with its bundle.
# Needs python3-torch (scripts/install-deps.sh --peers).
# Usage: bench/compare_kernels.sh [RUNS] [--device cpu|cuda] [shape options of both: --context T ...]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
shift || true
TROUPE=${TROUPE:-build/bin/troupe}
PY=/usr/bin/python3
out=$(mktemp -d)
source bench/peer_blas.sh
echo "OpenBLAS kernels for both: $OPENBLAS_CORETYPE; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for ((r = 0; r < RUNS; r++)); do
  "$TROUPE" bench kernels --json "$@" >"$out/troupe-$r.json"
  OPENBLAS_NUM_THREADS=1 $PY bench/peers/torch_kernels.py --json "$@" >"$out/torch-$r.json"
done
$PY - "$out" "$RUNS" <<'PY'
import json, statistics, sys
d, runs = sys.argv[1], int(sys.argv[2])
def medians(side):
    rows = {}
    for r in range(runs):
        for row in json.load(open(f"{d}/{side}-{r}.json")):
            rows.setdefault(row["kernel"], []).append(row)
    return {k: (statistics.median(x["us"] for x in v), v[0]) for k, v in rows.items()}
ours, peer = medians("troupe"), medians("torch")
print("| kernel | Troupe us | GB/s or GFLOP/s | PyTorch us | ratio |")
print("|---|---|---|---|---|")
for k in list(ours) + [k for k in peer if k not in ours]:
    t, p = ours.get(k), peer.get(k)
    rate = "-"
    if t:
        row = t[1]
        rate = ("%.1f GB/s" % (row["bytes"] / (t[0] * 1e-6) / 1e9) if row["bytes"]
                else "%.1f GFLOP/s" % (row["flops"] / (t[0] * 1e-6) / 1e9))
    ratio = "%.2fx" % (p[0] / t[0]) if t and p else "-"
    print("| %s | %s | %s | %s | %s |" % (k, "%.1f" % t[0] if t else "-", rate,
                                          "%.1f" % p[0] if p else "-", ratio))
PY
rm -rf "$out"
