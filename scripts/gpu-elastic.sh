#!/usr/bin/env bash
# The elastic job on a device (issue 16's device check; gpu-check.sh runs it with cuda, and it
# runs here with cpu to check the script itself): a deterministic GPT with 2 workers on the
# device (on one GPU both share it: host-staged), one SIGKILLed mid-run, a new agent joining by
# hand. Passes when the job finishes, the ledger has every sample of every committed step exactly
# once, and the per-step losses and final checksums are bitwise those of a static 1-worker run on
# the same device. Also: two workers on one device with parallel.backend "auto" go host-staged
# (the data_plane event says why) and with "nccl" are refused (exit 2); and a pipeline of 2 stages
# on the device (deterministic) computes a 1-worker run's bits. Prints one table row per
# run. Cleans up every process it started. DTYPE=bf16 runs it all in mixed precision (the GEMMs and
# attention on bf16 operands: on a GPU, tensor cores).
# Usage: [DTYPE=f32|bf16] scripts/gpu-elastic.sh TROUPE_BINARY cuda|cpu [STEPS]
set -uo pipefail
troupe=$1
device=$2
steps=${3:-600}
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/troupe-elastic.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; }
trap cleanup EXIT
# The runs compare bits: their text is a copy taken now (docs/design.md edited while the script
# runs once gave the static and the elastic run different data).
cp docs/design.md "$work/corpus.txt"
cat > "$work/job.toml" <<EOF
[job]
name = "elastic-$device"
seed = 5
steps = $steps
[model]
kind = "gpt"
dtype = "${DTYPE:-f32}"
layers = 2
d_model = 64
heads = 4
context = 32
[data]
kind = "text"
path = "$work/corpus.txt"
ledger = true
[batch]
global = 24
micro = 6
[optimizer]
kind = "adamw"
lr = 0.002
[parallel]
deterministic = true
[cluster]
devices = "$device"
[elastic]
max_restarts = 0
failure_timeout_ms = 3000
[logging]
progress = false
EOF
run() {  # NAME AGENTS: starts a run in the background; its pid in $! 
  "$troupe" run "$work/job.toml" --set "cluster.agents=$2" --set "job.run_dir=\"$work/$1\"" \
    > "$work/$1.out" 2>&1 &
}
committed() {
  local n
  n=$(grep -c '"event":"step_committed"' "$work/$1/events.jsonl" 2>/dev/null)
  echo "${n:-0}"
}

t0=$(date +%s.%N)
run static 1
static_pid=$!
pids+=("$static_pid")
wait "$static_pid"
static_rc=$?
static_s=$("${PYTHON:-python3}" -c "print($(date +%s.%N) - $t0)")

run elastic 2
job=$!
pids+=("$job")
for _ in $(seq 600); do
  [[ $(committed elastic) -ge 30 ]] && break
  kill -0 "$job" 2>/dev/null || break  # (refused, or ended)
  sleep 0.05
done
victim=$([[ -e $work/elastic/events.jsonl ]] && "${PYTHON:-python3}" -c "
import json,sys
for l in open('$work/elastic/events.jsonl'):
    e = json.loads(l)
    if e.get('event') == 'member_joined' and e.get('name') == 'agent-1': print(e['pid'])" | tail -1)
killed_at=$(committed elastic)
killed_ts=$(date +%s.%N)
[[ -n $victim ]] && kill -9 "$victim"
"$troupe" agent --join "$(cat "$work/elastic/coordinator.addr" 2>/dev/null)" --token-file "$work/elastic/job.token" \
  --devices "$device:0" --name joiner > "$work/joiner.out" 2>&1 &
pids+=("$!")
wait "$job"
elastic_rc=$?
# NCCL needs a GPU per rank: two workers on one device with parallel.backend = "nccl" are
# refused before anything starts (exit 2, saying why); "auto" host-stages them.
"$troupe" run "$work/job.toml" --set cluster.agents=2 --set parallel.deterministic=false \
  --set 'parallel.backend="nccl"' --set "job.run_dir=\"$work/nccl\"" > "$work/nccl.out" 2>&1
nccl_rc=$?
nccl_out=$(head -n 1 "$work/nccl.out")
# "auto": two workers on one device go host-staged, and the run's data_plane event says why (on
# a GPU: its UUID, from Compute::identity).
"$troupe" run "$work/job.toml" --set cluster.agents=2 --set parallel.deterministic=false \
  --set job.steps=5 --set "job.run_dir=\"$work/auto\"" > "$work/auto.out" 2>&1
auto_rc=$?
plane=$(grep -o '"event":"data_plane".*' "$work/auto/events.jsonl" 2>/dev/null | head -n 1)
want=$([[ $device == cuda ]] && echo "share one GPU (GPU-" || echo "computes on the CPU")
auto_ok=$([[ $auto_rc == 0 && $plane == *"$want"* ]] && echo 1 || echo 0)
# Pipeline stages on the device: 2 workers as stages (activations and gradients between them over
# the data plane), bitwise a 1-worker run of the same (untied) model: parallel.deterministic.
pp_sets=(--set job.steps=40 --set model.tied_head=false)
"$troupe" run "$work/job.toml" --set cluster.agents=1 "${pp_sets[@]}" \
  --set "job.run_dir=\"$work/pp1\"" > "$work/pp1.out" 2>&1
pp1_rc=$?
"$troupe" run "$work/job.toml" --set cluster.agents=2 --set parallel.pipeline_stages=2 \
  "${pp_sets[@]}" --set "job.run_dir=\"$work/pp2\"" > "$work/pp2.out" 2>&1
pp2_rc=$?
losses_of() { grep -o '"event":"step_committed".*"loss":[^,}]*' "$work/$1/events.jsonl" 2>/dev/null | grep -o '"loss":[^,}]*'; }
pp_n=$(losses_of pp2 | wc -l)
pp_ok=$([[ $pp1_rc == 0 && $pp2_rc == 0 && $pp_n == 40 && "$(losses_of pp1)" == "$(losses_of pp2)" ]] && echo 1 || echo 0)
echo "| pipeline of 2 stages on one $device device (deterministic) | $([[ $pp_ok == 1 ]] && echo PASS || echo FAIL): exit $pp1_rc / $pp2_rc, $pp_n steps | per-step losses bitwise a 1-worker run's |"
echo "| parallel.backend = \"auto\", 2 workers on one $device device | $([[ $auto_ok == 1 ]] && echo PASS || echo FAIL): exit $auto_rc | ${plane//|/\\|} |"
echo "| parallel.backend = \"nccl\", 2 workers on one $device device | $([[ $nccl_rc == 2 ]] && echo PASS || echo FAIL): exit $nccl_rc | ${nccl_out//|/\\|} |"
"${PYTHON:-python3}" - "$work" "$steps" "$static_rc" "$elastic_rc" "$killed_at" "$static_s" "$device" "$killed_ts" <<'PY'
import json, sys
work, steps, static_rc, elastic_rc, killed_at, static_s, device, killed_ts = sys.argv[1:]
steps = int(steps)
def events(run):
    return [json.loads(l) for l in open(f"{work}/{run}/events.jsonl")]
def losses(run):
    by = {}
    for e in events(run):
        if e["event"] == "step_committed":
            by[e["step"]] = e["loss"]
    return [by[s] for s in sorted(by)]
problems = []
if static_rc != "0" or elastic_rc != "0":
    problems.append(f"exit codes: static {static_rc}, elastic {elastic_rc}")
try:
    a, b = losses("static"), losses("elastic")
    ea, eb = events("static")[-1], events("elastic")[-1]
    if len(a) != steps or len(b) != steps:
        problems.append(f"committed steps: static {len(a)}, elastic {len(b)} of {steps}")
    diff = [i for i in range(min(len(a), len(b))) if a[i] != b[i]]
    if diff:
        problems.append(f"losses differ from step {diff[0]} ({a[diff[0]]!r} vs {b[diff[0]]!r})")
    if ea.get("checksums", [None])[0] != eb.get("checksums", [None])[0] or not eb.get("identical_parameters"):
        problems.append(f"checksums: static {ea.get('checksums')}, elastic {eb.get('checksums')}")
    joined = [e for e in events("elastic") if e["event"] == "member_joined" and e.get("name") == "joiner"]
    if not joined:
        problems.append("the joiner never joined")
    failed = [e for e in events("elastic") if e["event"] == "member_failed"]
    if len(failed) != 1:
        problems.append(f"{len(failed)} member_failed events (1 expected)")
    by_step = {}
    for l in open(f"{work}/elastic/ledger.jsonl"):
        e = json.loads(l)
        by_step.setdefault(e["step"], []).extend(tuple(p) for p in e["positions"])
    B = 24
    for s in range(steps):
        at = s * B
        for lo, hi in sorted(by_step.get(s, [])):
            if lo != at:
                problems.append(f"ledger: step {s} has a gap or a sample twice at {at}")
                break
            at = hi
        else:
            if at != (s + 1) * B:
                problems.append(f"ledger: step {s} ends at {at}")
        if len(problems) > 5:
            break
    secs = eb.get("seconds", 0)
    # Recovery: from the SIGKILL to the first step committed by the survivors' new generation
    # (a step in flight at the kill may still commit in the old one).
    ev, k = events("elastic"), float(killed_ts)
    regen = [e["ts"] for e in ev if e["event"] == "generation_started" and e["ts"] > k]
    after = [e["ts"] for e in ev if regen and e["event"] == "step_committed" and e["ts"] > regen[0]]
    if after:
        print("| recovery on %s: SIGKILL -> next committed step | %.2f s | detection, the new "
              "generation (its communicators), the steps since the last commit |"
              % (device, after[0] - float(killed_ts)))
    last = [json.loads(l) for l in open(f"{work}/static/metrics.jsonl") if '"mfu"' in l or '"peak"' in l]
    if last:
        m = last[-1]
        mfu = "%.2f%%" % (100 * m["mfu"]) if m.get("mfu") is not None else "unknown"
        print("| MFU of the static run's last step | %s | %.3g model TFLOP/s; peak: %s |"
              % (mfu, m.get("model_tflops_per_s", 0), m.get("peak", "?")))
except Exception as ex:
    problems.append(f"no results ({ex!r})")
    secs = 0
print("| elastic GPT on %s: 2 workers, SIGKILL at step %s, a joiner | %s | static %.1f s, elastic %.1f s |"
      % (device, killed_at, "PASS: bitwise the static run, ledger exact" if not problems else
         "FAIL: " + "; ".join(problems), float(static_s), secs))
sys.exit(1 if problems else 0)
PY
rc=$?
[[ $auto_ok == 1 && $nccl_rc == 2 && $pp_ok == 1 ]] || rc=1
if [[ $rc -eq 0 ]]; then rm -rf "$work"; else echo "gpu-elastic: kept $work; the static run said:"; tail -n 3 "$work/static.out"; fi
exit $rc
