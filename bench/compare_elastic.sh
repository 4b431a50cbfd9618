#!/usr/bin/env bash
# Elasticity, side by side with torchrun on the same job: the MLP 784-1024-1024-10, SGD lr 0.1,
# 64 samples per worker per step, 1 thread per worker, CPU.
#   recovery: 3 Troupe agents (global batch 192); after 20 committed steps one is SIGKILLed; time
#             from the kill to the next committed step (the survivors go on, 2 workers). torchrun
#             (--max_restarts 3, c10d rendezvous, default monitor interval) with 2 workers,
#             checkpoint every 20 steps; rank 1 SIGKILLed at step 50; time to the next step of the
#             restarted workers, and the steps they redo.
#   join:     2 Troupe agents; `troupe agent --join` started after 20 steps; time from its start
#             to the first committed step it takes part in.
#   transfer: the joiner's state transfer (parameters + optimizer moments, point to point over
#             the data plane) for a 20M-parameter MLP with AdamW (240 MB), as bytes/s, and that
#             joiner's latency against the goal: 1 s plus the state's bytes at memcpy speed.
# Medians of REPS runs. Needs python3-torch for the peer (scripts/install-deps.sh --peers).
# Usage: bench/compare_elastic.sh [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${1:-5}
TROUPE=${TROUPE:-build/bin/troupe}
source bench/peer_blas.sh
PY=/usr/bin/python3
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
cat >"$tmp/mlp.toml" <<'TOML'
[job]
name = "elastic-bench"
steps = 100000
[model]
kind = "mlp"
inputs = 784
hidden = [1024, 1024]
classes = 10
[data]
kind = "synthetic"
[batch]
global = 192
micro = 64
[optimizer]
kind = "sgd"
lr = 0.1
momentum = 0.0
[logging]
progress = false
TOML
now() { $PY -c 'import time; print(f"{time.time():.6f}")'; }
wait_steps() {  # events.jsonl n
  for _ in $(seq 1200); do
    n=$(grep -c step_committed "$1" 2>/dev/null || true)
    [[ ${n:-0} -ge $2 ]] && return 0
    sleep 0.05
  done
  echo "no progress in $1" >&2
  return 1
}

echo "## Troupe recovery (3 agents, kill 1)"
rec=()
for ((r = 0; r < REPS; r++)); do
  d=$tmp/rec$r
  "$TROUPE" run "$tmp/mlp.toml" --set "job.run_dir=\"$d\"" --set cluster.agents=3 \
    --set elastic.max_restarts=0 >"$d.out" 2>&1 &
  run=$!
  wait_steps "$d/events.jsonl" 20
  pid=$("$TROUPE" status --run-dir "$d" --json | $PY -c 'import json,sys; print(json.load(sys.stdin)["members"][1]["pid"])')
  t_kill=$(now)
  kill -9 "$pid"
  for _ in $(seq 200); do
    grep '"generation":2' "$d/events.jsonl" 2>/dev/null | grep -q step_committed && break
    sleep 0.05
  done
  "$TROUPE" stop --run-dir "$d" >/dev/null || true
  wait $run || true
  rec+=("$($PY - "$d/events.jsonl" "$t_kill" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
t_kill = float(sys.argv[2])
committed_before = [e for e in ev if e["event"] == "step_committed" and e["ts"] < t_kill]
gen2 = next(e for e in ev if e["event"] == "generation_started" and e["generation"] == 2)
first = next(e for e in ev if e["event"] == "step_committed" and e["generation"] == 2)
redone = max(0, len(committed_before) - gen2["step"])
c1 = [e["ts"] for e in ev if e["event"] == "step_committed" and e["generation"] == 1]
step_s = (c1[-1] - c1[-11]) / 10
print(f"{first['ts'] - t_kill:.3f} {gen2['ts'] - t_kill:.3f} {step_s:.3f} {redone}")
PY
)")
  echo "  run $r: kill->next step, kill->new generation, step s, steps redone: ${rec[-1]}"
done

echo "## Troupe join (2 agents + troupe agent --join)"
join=()
for ((r = 0; r < REPS; r++)); do
  d=$tmp/join$r
  "$TROUPE" run "$tmp/mlp.toml" --set "job.run_dir=\"$d\"" --set cluster.agents=2 \
    --set batch.global=128 >"$d.out" 2>&1 &
  run=$!
  wait_steps "$d/events.jsonl" 20
  t_start=$(now)
  "$TROUPE" agent --join "$(cat "$d/coordinator.addr")" --token-file "$d/job.token" --name joiner \
    >"$d.joiner" 2>&1 &
  for _ in $(seq 200); do
    grep '"world_size":3' "$d/events.jsonl" 2>/dev/null | grep -q step_committed && break
    sleep 0.05
  done
  "$TROUPE" stop --run-dir "$d" >/dev/null || true
  wait || true
  join+=("$($PY - "$d/events.jsonl" "$t_start" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
t0 = float(sys.argv[2])
joined = next(e["ts"] for e in ev if e["event"] == "member_joined" and e["name"] == "joiner")
first = next(e["ts"] for e in ev if e["event"] == "step_committed" and e["world_size"] == 3)
print(f"{first - t0:.3f} {joined - t0:.3f}")
PY
)")
  echo "  run $r: agent start->first step with it, agent start->admitted: ${join[-1]}"
done

echo "## Troupe state transfer (20M parameters, AdamW: 240 MB to the joiner)"
xfer=()
for ((r = 0; r < REPS; r++)); do
  d=$tmp/xfer$r
  "$TROUPE" run "$tmp/mlp.toml" --set "job.run_dir=\"$d\"" --set cluster.agents=1 \
    --set 'model.hidden=[4096,4096]' --set optimizer.kind="adamw" --set optimizer.momentum=0.9 --set optimizer.lr=0.0001 \
    --set batch.global=8 --set batch.micro=8 >"$d.out" 2>&1 &
  wait_steps "$d/events.jsonl" 3
  t_start=$(now)
  "$TROUPE" agent --join "$(cat "$d/coordinator.addr")" --token-file "$d/job.token" \
    >"$d.joiner" 2>&1 &
  for _ in $(seq 400); do
    grep '"world_size":2' "$d/events.jsonl" 2>/dev/null | grep -q step_committed && break
    sleep 0.05
  done
  "$TROUPE" stop --run-dir "$d" >/dev/null || true
  wait || true
  xfer+=("$($PY - "$d/events.jsonl" "$t_start" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
e = next(x for x in ev if x["event"] == "state_received")
first = next(x["ts"] for x in ev if x["event"] == "step_committed" and x["world_size"] == 2)
print(f"{e['bytes'] / e['seconds'] / 1e9:.2f} {e['bytes']} {e['seconds']:.3f} {first - float(sys.argv[2]):.3f}")
PY
)")
  echo "  run $r: GB/s, bytes, seconds, agent start->first step with it: ${xfer[-1]}"
done
copy=$("$TROUPE" bench allreduce --workers 2 --sizes 4K --json 2>/dev/null |
  $PY -c 'import json,sys; print(next(json.loads(l)["busbw_gbps"] for l in sys.stdin if "\"memcpy\"" in l))' || echo "?")

echo "## torchrun recovery (2 workers, kill rank 1 at step 50, checkpoint every 20)"
tr=()
port=$((29500 + RANDOM % 1000))
if $PY -c 'import torch' 2>/dev/null && command -v torchrun >/dev/null; then
  for ((r = 0; r < REPS; r++)); do
    w=$tmp/torchrun$r
    mkdir -p "$w"
    port=$((port + 1))
    WORKDIR=$w OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo \
      torchrun --redirects 1 --tee 1 --log_dir "$w/logs" --nnodes=1 --nproc_per_node=2 \
      --max_restarts=3 --rdzv_backend=c10d --rdzv_endpoint=127.0.0.1:$port --rdzv_id=bench$r \
      bench/peers/torch_elastic_train.py --steps 120 --ckpt-every 20 >"$w/torchrun.log" 2>&1 &
    trpid=$!
    for _ in $(seq 1200); do
      awk '$3 == 0 && $2 >= 50 {f=1} END {exit !f}' "$w/steps.log" 2>/dev/null && break
      sleep 0.02
    done
    t_kill=$(now)
    kill -9 "$(cat "$w/pid.1")"
    wait $trpid || true
    tr+=("$($PY - "$w/steps.log" "$t_kill" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
t_kill = float(sys.argv[2])
before = [int(r[1]) for r in rows if float(r[0]) < t_kill and r[2] == "0"]
after = [r for r in rows if int(r[4]) > 0]
first = min(float(r[0]) for r in after)
resumed = min(int(r[1]) for r in after)
print(f"{first - t_kill:.3f} {max(before) + 1 - resumed}")
PY
)")
    echo "  run $r: kill->next step, steps redone: ${tr[-1]}"
  done
else
  echo "  (python3-torch or torchrun missing: scripts/install-deps.sh --peers)"
fi

$PY - "$copy" <<PY
import statistics, sys
rec = [l.split() for l in """$(printf '%s\n' "${rec[@]}")""".strip().splitlines()]
join = [l.split() for l in """$(printf '%s\n' "${join[@]}")""".strip().splitlines()]
xfer = [l.split() for l in """$(printf '%s\n' "${xfer[@]:-}")""".strip().splitlines() if l]
tr = [l.split() for l in """$(printf '%s\n' "${tr[@]:-}")""".strip().splitlines() if l]
med = lambda rows, i: statistics.median(float(r[i]) for r in rows)
print()
print(f"{'measure':<44} {'troupe':>10} {'torchrun':>10} {'ratio':>7}")
t = med(rec, 0)
p = med(tr, 0) if tr else float('nan')
print(f"{'SIGKILL -> next committed step (s, median)':<44} {t:>10.3f} {p:>10.3f} {p / t:>6.1f}x")
print(f"{'committed steps redone (max)':<44} {max(int(r[3]) for r in rec):>10} {max(int(r[1]) for r in tr) if tr else '?':>10}")
print(f"{'join: agent start -> first step with it (s)':<44} {med(join, 0):>10.3f}")
print(f"{'join: agent start -> admitted (s)':<44} {med(join, 1):>10.3f}")
if xfer:
    print(f"{'state transfer GB/s (median; ' + xfer[0][1] + ' B)':<44} {med(xfer, 0):>10.2f}   single-core memcpy {sys.argv[1]} GB/s")
    budget = 1.0 + float(xfer[0][1]) / (float(sys.argv[1]) / 2 * 1e9)
    print(f"{'join with that state: start -> first step (s)':<44} {med(xfer, 3):>10.3f}   goal <= 1 s + bytes at memcpy speed = {budget:.3f} s")
PY
