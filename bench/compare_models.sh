#!/usr/bin/env bash
# Side by side: `troupe bench model` and the same models in PyTorch (bench/peers/torch_models.py),
# alternating in the same run, RUNS times each, at 1 and 2 threads; prints medians and ratios.
# Needs python3-torch (scripts/install-deps.sh --peers). PyTorch must use OpenBLAS (checked), and
# it runs the same OpenBLAS kernels Troupe chose from the CPU's features (OPENBLAS_CORETYPE: on a
# CPU newer than OpenBLAS's tables both would otherwise fall back to SSE3 kernels; checked).
# Usage: bench/compare_models.sh [RUNS] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
STEPS=${2:-40}
TROUPE=${TROUPE:-build/bin/troupe}
PY=/usr/bin/python3
out=$(mktemp)
source bench/peer_blas.sh
for threads in 1 2; do
  for model in mlp gpt; do
    for ((r = 0; r < RUNS; r++)); do
      "$TROUPE" bench model --model "$model" --threads "$threads" --steps "$STEPS" --json >>"$out"
      # OPENBLAS_NUM_THREADS: Debian's OpenBLAS (pthread) ignores torch.set_num_threads.
      OPENBLAS_NUM_THREADS=$threads $PY bench/peers/torch_models.py --model "$model" --threads "$threads" \
        --steps "$STEPS" >>"$out"
    done
  done
done
$PY - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
blas = {r.get("blas") for r in rows if r["impl"] == "pytorch"}
if blas != {"openblas"}:
    print(f"WARNING: PyTorch BLAS is {blas}, not OpenBLAS: the comparison is not fair")
cores = {r.get("blas_core") for r in rows}
if len(cores) != 1:
    print(f"WARNING: the two ran different OpenBLAS kernels {cores}: the comparison is not fair")
print(f"{'model':5} {'thr':>3} {'unit':>10} {'troupe':>10} {'pytorch':>10} {'ratio':>6}")
for model, unit in (("mlp", "samples_per_s"), ("gpt", "tokens_per_s")):
    for t in (1, 2):
        med = {}
        for impl in ("troupe", "pytorch"):
            v = [r[unit] for r in rows if r["impl"] == impl and r["model"] == model and r["threads"] == t]
            med[impl] = statistics.median(v)
        print(f"{model:5} {t:>3} {unit:>10} {med['troupe']:>10.0f} {med['pytorch']:>10.0f} {med['troupe']/med['pytorch']:>5.2f}x")
PY
rm -f "$out"
