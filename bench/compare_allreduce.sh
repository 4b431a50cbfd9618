#!/usr/bin/env bash
# Side by side in one session: troupe's UCX allreduce, OpenMPI's MPI_Allreduce and PyTorch's gloo
# all_reduce, at 2 and 4 processes, 4 KiB ... 256 MiB; RUNS rounds alternating the three; medians
# of bus bandwidth and the ratio of troupe to the best peer. Needs the peers
# (scripts/install-deps.sh --peers): openmpi-bin, libopenmpi-dev, python3-torch.
# Usage: bench/compare_allreduce.sh [RUNS] [SIZES in bytes, comma separated]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
SIZES=${2:-8,4096,65536,1048576,16777216,67108864,268435456}
TROUPE=${TROUPE:-build/bin/troupe}
out=$(mktemp)
mpicc -O2 -o /tmp/troupe_mpi_allreduce bench/peers/mpi_allreduce.c
for ((r = 0; r < RUNS; r++)); do
  for w in 2 4; do
    "$TROUPE" bench allreduce --workers "$w" --sizes "$SIZES" --json >>"$out"
    mpirun --allow-run-as-root --oversubscribe -np "$w" /tmp/troupe_mpi_allreduce ${SIZES//,/ } >>"$out" 2>/dev/null
    /usr/bin/python3 bench/peers/torch_allreduce.py --world "$w" --sizes "$SIZES" >>"$out" 2>/dev/null
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
mem = [r["busbw_gbps"] for r in rows if r["impl"] == "memcpy"]
print(f"single-core memcpy (reads+writes): {statistics.median(mem):.2f} GB/s")
print(f"{'procs':>5} {'bytes':>10} | {'troupe us':>10} {'mpi us':>10} {'gloo us':>10} | {'troupe GB/s':>11} {'mpi GB/s':>9} {'gloo GB/s':>9} | {'vs best':>7}")
for w in (2, 4):
    for b in sorted({r["bytes"] for r in rows if r.get("workers") == w}):
        med = {}
        for impl in ("troupe_ucx", "openmpi", "pytorch_gloo"):
            v = [r for r in rows if r["impl"] == impl and r.get("workers") == w and r["bytes"] == b]
            med[impl] = (statistics.median(x["time_us"] for x in v), statistics.median(x["busbw_gbps"] for x in v)) if v else (float("nan"), float("nan"))
        best_time = min(med["openmpi"][0], med["pytorch_gloo"][0])  # same bytes: time ratio = bandwidth ratio
        print(f"{w:>5} {b:>10} | {med['troupe_ucx'][0]:>10.1f} {med['openmpi'][0]:>10.1f} {med['pytorch_gloo'][0]:>10.1f} | "
              f"{med['troupe_ucx'][1]:>11.3f} {med['openmpi'][1]:>9.3f} {med['pytorch_gloo'][1]:>9.3f} | {best_time/med['troupe_ucx'][0]:>6.2f}x")
PY
rm -f "$out"
