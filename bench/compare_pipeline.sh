#!/usr/bin/env bash
# Pipeline parallelism on the quickstart GPT (4 layers, d_model 128, context 64, global batch 32;
# 6 blocks: embedding, 4 transformer blocks, head), measured by `troupe run` itself:
#   bubble:     2 workers as 2 stages, m = 1, 2, 4, 8 micro-batches per step; the measured idle
#               fraction of the workers (1 - compute time / step time, from metrics.jsonl) next to
#               the 1F1B theory (pp - 1) / (m + pp - 1).
#   throughput: the same 2 workers as dp 2 x pp 1 and as dp 1 x pp 2 (m = 8), and 1 worker.
#   rebalance:  4 workers as dp 2 x pp 2; `troupe scale --workers 3` (one pipeline and a standby),
#               then `--workers 4` (a new agent takes a stage): time from the request to the new
#               generation, the blocks and bytes that moved and how long that took, and the time to
#               the next committed step.
# Medians over the steps after the first 5. Usage: bench/compare_pipeline.sh [STEPS]
# (RECOMPUTE=true: parallel.recompute_activations, stages recompute forwards)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-40}
TROUPE=${TROUPE:-build/bin/troupe}
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
common=(--set job.steps=$STEPS --set logging.progress=false --set optimizer.lr=0.001)
recompute() {  # (a pipeline's key: refused for pp = 1)
  if [ "$1" -gt 1 ]; then echo "--set parallel.recompute_activations=${RECOMPUTE:-false}"; fi
}
stats() {  # run_dir -> "median_step_s median_idle samples_per_s"
  $PY - "$1/metrics.jsonl" <<'PY'
import json, statistics, sys
m = [json.loads(l) for l in open(sys.argv[1])][5:]
s = statistics.median(x["step_seconds"] for x in m)
i = statistics.median(x["idle_fraction"] for x in m)
print(f"{s:.4f} {i:.3f} {32 / s:.1f}")
PY
}
echo "## bubble: 2 stages"
printf "%4s %12s %14s %14s\n" m "step s" "idle measured" "bubble theory"
for micro in 32 16 8 4; do
  d=$tmp/bubble$micro
  "$TROUPE" run configs/quickstart.toml "${common[@]}" --set "job.run_dir=\"$d\"" --set cluster.agents=2 \
    --set parallel.pipeline_stages=2 --set batch.micro=$micro $(recompute 2) >/dev/null
  read -r s i _ <<<"$(stats "$d")"
  m=$((32 / micro))
  printf "%4d %12s %14s %14s\n" $m "$s" "$i" "$($PY -c "print(f'{1 / ($m + 1):.3f}')")"
done
echo "## throughput (m = 8 micro-batches of 4)"
printf "%-16s %12s %12s %14s\n" layout "step s" "samples/s" "idle measured"
for layout in "1 1" "2 1" "2 2"; do
  read -r w pp <<<"$layout"
  d=$tmp/tp$w$pp
  "$TROUPE" run configs/quickstart.toml "${common[@]}" --set "job.run_dir=\"$d\"" --set cluster.agents=$w \
    --set parallel.pipeline_stages=$pp --set batch.micro=4 $(recompute "$pp") >/dev/null
  read -r s i sps <<<"$(stats "$d")"
  printf "%-16s %12s %12s %14s\n" "dp $((w / pp)) x pp $pp" "$s" "$sps" "$i"
done
echo "## rebalance: dp 2 x pp 2 -> 3 workers -> 4 workers"
d=$tmp/rebalance
"$TROUPE" run configs/quickstart.toml --set job.steps=100000 --set logging.progress=false \
  --set "job.run_dir=\"$d\"" --set cluster.agents=4 --set parallel.pipeline_stages=2 \
  --set batch.micro=4 >/dev/null 2>&1 &
for _ in $(seq 600); do
  n=$(grep -c step_committed "$d/events.jsonl" 2>/dev/null || true)
  [[ ${n:-0} -ge 10 ]] && break
  sleep 0.1
done
"$TROUPE" scale --run-dir "$d" --workers 3 >/dev/null
for _ in $(seq 600); do grep -q '"generation":2,"world_size":3' "$d/events.jsonl" && break; sleep 0.1; done
sleep 2
"$TROUPE" scale --run-dir "$d" --workers 4 >/dev/null
for _ in $(seq 600); do
  grep '"generation":3' "$d/events.jsonl" 2>/dev/null | grep -q step_committed && break
  sleep 0.1
done
"$TROUPE" stop --run-dir "$d" >/dev/null || true
wait || true
$PY - "$d/events.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
reqs = [e for e in ev if e["event"] == "scale_requested"]
for gen, req in zip((2, 3), reqs):
    start = next(e for e in ev if e["event"] == "generation_started" and e["generation"] == gen)
    plan = next(e["plan"] for e in ev if e["event"] == "pipeline_plan" and e["generation"] == gen)
    moved = [e for e in ev if e["event"] == "state_received" and e["generation"] == gen]
    first = next(e for e in ev if e["event"] == "step_committed" and e["generation"] == gen)
    print(f"to {req['workers']} workers ({plan}): request -> generation {start['ts'] - req['ts']:.3f} s, "
          f"blocks moved {sum(m['blocks'] for m in moved)}, bytes {sum(m['bytes'] for m in moved)}, "
          f"transfer {max([m['seconds'] for m in moved], default=0):.3f} s, "
          f"generation -> next committed step {first['ts'] - start['ts']:.3f} s")
PY
