#!/usr/bin/env bash
# Recovery latency: SIGKILL of one of 3 agents during the quickstart job -> the next committed step
# (of the new generation), REPS times; prints each and the median. Also the generation switch
# alone (member_failed -> generation_started). Usage: bench/elastic_recovery.sh [REPS] [CONFIG]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
CONFIG=${2:-configs/quickstart.toml}
TROUPE=${TROUPE:-build/bin/troupe}
tmp=$(mktemp -d)
results=()
for ((r = 0; r < REPS; r++)); do
  dir=$tmp/run$r
  "$TROUPE" run "$CONFIG" --set "job.run_dir=\"$dir\"" --set cluster.agents=3 --set job.steps=100000 --set elastic.max_restarts=0 \
    --set logging.progress=false >"$dir.out" 2>&1 &
  run=$!
  # Wait for 20 committed steps, then kill an agent (its pid from troupe status).
  for _ in $(seq 600); do
    n=$(grep -c step_committed "$dir/events.jsonl" 2>/dev/null || true)
    [[ ${n:-0} -ge 20 ]] && break
    sleep 0.1
  done
  pid=$("$TROUPE" status --run-dir "$dir" --json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["members"][1]["pid"])')
  t_kill=$(/usr/bin/python3 -c 'import time; print(time.time())')
  kill -9 "$pid"
  for _ in $(seq 100); do
    grep -q '"generation":2' "$dir/events.jsonl" 2>/dev/null && grep '"generation":2' "$dir/events.jsonl" | grep -q step_committed && break
    sleep 0.05
  done
  "$TROUPE" stop --run-dir "$dir" >/dev/null || true
  wait $run || true
  results+=("$(/usr/bin/python3 - "$dir/events.jsonl" "$t_kill" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
t_kill = float(sys.argv[2])
failed = next(e["ts"] for e in ev if e["event"] == "member_failed")
gen2 = next(e for e in ev if e["event"] == "generation_started" and e["generation"] == 2)
first = next(e["ts"] for e in ev if e["event"] == "step_committed" and e["generation"] == 2)
before = [e for e in ev if e["event"] == "step_committed" and e["generation"] == 1]
step_s = (before[-1]["ts"] - before[-10]["ts"]) / 9
print(f"{first - t_kill:.3f} {failed - t_kill:.3f} {gen2['ts'] - failed:.3f} {step_s:.3f} {gen2['step']}")
PY
)")
done
printf "%-6s %14s %12s %14s %10s %8s\n" run "kill->step s" "detect s" "new gen s" "step s" "from"
i=0
for line in "${results[@]}"; do
  read -r a b c d e <<<"$line"
  printf "%-6s %14s %12s %14s %10s %8s\n" $i $a $b $c $d $e
  i=$((i + 1))
done
printf "%s\n" "${results[@]}" | /usr/bin/python3 -c 'import sys,statistics; v=[float(l.split()[0]) for l in sys.stdin if l.strip()]; print(f"median SIGKILL -> next committed step: {statistics.median(v):.3f} s")'
rm -rf "$tmp"
