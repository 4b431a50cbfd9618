#!/usr/bin/env bash
# What parallel.deterministic costs: the same job with and without it, alternating, RUNS rounds;
# the median step time (metrics.jsonl, after 5 warm-up steps) of each, and the ratio. Jobs: the
# quickstart (GPT 4 x 128, batch 32 in micro-batches of 16, 2 workers) and a larger GPT
# (6 x 256, context 128, batch 16 in micro-batches of 4, 2 workers).
# Usage: bench/compare_deterministic.sh [RUNS] [STEPS]     (defaults 3, 40)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
STEPS=${2:-40}
TROUPE=${TROUPE:-build/bin/troupe}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) cores"
declare -A jobs=(
  [quickstart]="--set cluster.agents=2"
  [gpt-6x256]="--set cluster.agents=2 --set model.layers=6 --set model.d_model=256 --set model.heads=8 --set model.context=128 --set batch.global=16 --set batch.micro=4"
)
for ((r = 0; r < RUNS; r++)); do
  for job in quickstart gpt-6x256; do
    for det in false true; do
      # shellcheck disable=SC2086
      "$TROUPE" run configs/quickstart.toml ${jobs[$job]} --set job.steps="$STEPS" \
        --set parallel.deterministic=$det --set "job.run_dir=\"$tmp/$job-$det-$r\"" >/dev/null
    done
  done
done
/usr/bin/python3 - "$tmp" "$RUNS" <<'PY'
import json, os, statistics, sys
tmp, runs = sys.argv[1], int(sys.argv[2])
print(f"{'job':>12} {'default ms':>11} {'deterministic ms':>17} {'ratio':>6}")
for job in ("quickstart", "gpt-6x256"):
    med = {}
    for det in ("false", "true"):
        per_run = []
        for r in range(runs):
            rows = [json.loads(l) for l in open(os.path.join(tmp, f"{job}-{det}-{r}", "metrics.jsonl"))]
            per_run.append(statistics.median(x["step_seconds"] for x in rows[5:] if "step_seconds" in x))
        med[det] = statistics.median(per_run) * 1e3
    print(f"{job:>12} {med['false']:>11.1f} {med['true']:>17.1f} {med['true'] / med['false']:>5.3f}x")
PY
