#!/usr/bin/env bash
# Data-parallel training throughput, side by side: `troupe run` (local agents, UCX data plane)
# and PyTorch DDP over gloo, on the MLP 784-1024-1024-10 with a global batch of 512, at 1 and 2
# workers x 1 thread, RUNS rounds alternating; medians of samples/s (wall clock between the
# first and last timed committed steps). Needs python3-torch (scripts/install-deps.sh --peers).
# Usage: bench/compare_dp.sh [RUNS] [STEPS]      (OVERLAP=true: parallel.overlap_reduce)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
STEPS=${2:-40}
TROUPE=${TROUPE:-build/bin/troupe}
source bench/peer_blas.sh
out=$(mktemp)
tmp=$(mktemp -d)
for ((r = 0; r < RUNS; r++)); do
  for w in 1 2; do
    dir=$tmp/run-$r-$w
    "$TROUPE" run configs/mlp_synthetic.toml --set "job.run_dir=\"$dir\"" --set job.steps=$STEPS \
      --set model.hidden=[1024,1024] --set batch.global=512 --set batch.micro=512 --set cluster.agents=$w \
      --set optimizer.lr=0.01 --set parallel.overlap_reduce=${OVERLAP:-false} >/dev/null
    /usr/bin/python3 - "$dir/events.jsonl" "$w" >>"$out" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
ts = [e["ts"] for e in ev if e["event"] == "step_committed"][5:]  # 5 warm-up steps
print(json.dumps({"bench": "dp", "impl": "troupe", "workers": int(sys.argv[2]), "global_batch": 512,
                  "samples_per_s": round(512 * (len(ts) - 1) / (ts[-1] - ts[0]), 1)}))
PY
    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/peers/torch_ddp.py --world $w --steps $((STEPS - 5)) >>"$out" 2>/dev/null
  done
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(f"{'workers':>7} {'troupe samples/s':>17} {'pytorch ddp':>12} {'ratio':>6}")
for w in (1, 2):
    t = statistics.median(r["samples_per_s"] for r in rows if r["impl"] == "troupe" and r["workers"] == w)
    p = statistics.median(r["samples_per_s"] for r in rows if r["impl"] == "pytorch_ddp" and r["workers"] == w)
    print(f"{w:>7} {t:>17.0f} {p:>12.0f} {t/p:>5.2f}x")
PY
rm -rf "$out" "$tmp"
