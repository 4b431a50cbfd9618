#!/usr/bin/env bash
# Side by side in one session: troupe's UCX allreduce, OpenMPI's MPI_Allreduce and PyTorch's gloo
# all_reduce, at 2, 3 and 4 processes (PROCS="2 4" for fewer), 4 KiB ... 256 MiB; RUNS rounds alternating the three; medians
# of times, the ratio of troupe to the best peer, and the memory-bandwidth limit of each size
# (derived from the memcpy rate measured in the same run) with the goal that applies. Troupe runs
# twice, each with its goal: on the caller's buffers and on registered buffers (comm/shared_arena.h:
# read in place by the others, "reg"; a training job's gradients live there:
# workers/registered_gradients.h). Needs the peers
# (scripts/install-deps.sh --peers): openmpi-bin, libopenmpi-dev, python3-torch.
# Usage: bench/compare_allreduce.sh [RUNS] [SIZES in bytes, comma separated]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
SIZES=${2:-8,4096,65536,1048576,16777216,67108864,268435456}
TROUPE=${TROUPE:-build/bin/troupe}
PROCS=${PROCS:-2 3 4}
out=$(mktemp)
mpicc -O2 -o /tmp/troupe_mpi_allreduce bench/peers/mpi_allreduce.c
for ((r = 0; r < RUNS; r++)); do
  for w in $PROCS; do
    "$TROUPE" bench allreduce --workers "$w" --sizes "$SIZES" --json >>"$out"
    "$TROUPE" bench allreduce --workers "$w" --sizes "$SIZES" --buffers registered --json >>"$out"
    mpirun --allow-run-as-root --oversubscribe -np "$w" /tmp/troupe_mpi_allreduce ${SIZES//,/ } >>"$out" 2>/dev/null
    /usr/bin/python3 bench/peers/torch_allreduce.py --world "$w" --sizes "$SIZES" >>"$out" 2>/dev/null
  done
done
/usr/bin/python3 - "$out" "$(nproc)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cores = int(sys.argv[2])
mem = statistics.median(r["busbw_gbps"] for r in rows if r["impl"] == "memcpy")
print(f"host: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}, {cores} cores")
lines = {r.get("peer_lines") for r in rows if r["impl"] == "memcpy"}
print(f"single-core memcpy (reads+writes): {mem:.2f} GB/s; shared lines: the {'/'.join(sorted(map(str, lines)))} choice (comm::peer_lines)")
# The memory-bandwidth limit: every rank must at least read its input and write its output
# (2 x bytes of traffic, one memcpy of the buffer), all ranks at once at the single-core memcpy
# rate, ranks beyond the cores sharing them. No algorithm between processes moves less.
print("limit us: 2 x bytes at the memcpy rate (x procs / cores when oversubscribed); "
      "% limit: limit / time; goal: >= 1.5x the best peer where it is below 60% of the limit, else >= 1.0x")
print(f"{'procs':>5} {'bytes':>10} | {'troupe us':>10} {'mpi us':>10} {'gloo us':>10} | {'limit us':>9} "
      f"{'troupe %':>8} {'peer %':>7} | {'vs best':>7} {'goal':>5} {'met':>4} | {'reg us':>9} {'reg vs':>7} {'met':>4}")
for w in sorted({r["workers"] for r in rows if "workers" in r}):
    for b in sorted({r["bytes"] for r in rows if r.get("workers") == w}):
        med = {}
        for impl in ("troupe_ucx", "troupe_ucx_registered", "openmpi", "pytorch_gloo"):
            v = [r for r in rows if r["impl"] == impl and r.get("workers") == w and r["bytes"] == b]
            med[impl] = statistics.median(x["time_us"] for x in v) if v else float("nan")
        best = min(med["openmpi"], med["pytorch_gloo"])  # same bytes: time ratio = bandwidth ratio
        limit = 2 * b / (mem * 1e3) * w / min(w, cores)
        ratio = best / med["troupe_ucx"]
        # "reg" rows read the others' buffers in place from a size chosen by CPU vendor
        # (comm::peer_lines: 256 KiB on Intel, 2 MiB on AMD); rows that staged are marked.
        reg = [r for r in rows if r["impl"] == "troupe_ucx_registered" and r.get("workers") == w and r["bytes"] == b]
        staged_reg = any(r.get("registered", 0) < 1 for r in reg)
        reg_ratio = best / med["troupe_ucx_registered"]
        if b <= 8:
            goal, met, reg_met = "1/3", ratio >= 1 / 3, reg_ratio >= 1 / 3  # within 3x of the latency
        else:
            goal = 1.5 if limit / best < 0.6 else 1.0
            met, reg_met = ratio >= goal, reg_ratio >= goal
        print(f"{w:>5} {b:>10} | {med['troupe_ucx']:>10.1f} {med['openmpi']:>10.1f} {med['pytorch_gloo']:>10.1f} | "
              f"{limit:>9.1f} {100 * limit / med['troupe_ucx']:>7.0f}% {100 * limit / best:>6.0f}% | "
              f"{ratio:>6.2f}x {goal:>5} {'yes' if met else 'NO':>4} | "
              f"{med['troupe_ucx_registered']:>9.1f} {reg_ratio:>6.2f}x {'yes' if reg_met else 'NO':>4}"
              f"{'  (staged)' if staged_reg else ''}")
PY
rm -f "$out"
