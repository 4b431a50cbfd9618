#!/usr/bin/env bash
# How far a change of world size moves a training run, in Troupe and in PyTorch from the same
# start: `troupe bench drift` runs the same GPT twice in one process, the gradient summed whole
# (one worker) or in 3 shares added in another order (three workers), and dumps its initial
# parameters and tokens; bench/peers/torch_drift.py runs the same experiment in PyTorch from them.
# Prints, per seed and optimizer, the loss difference and the parameters' relative L2 difference
# at a few steps, side by side.
#
# Usage: bench/compare_drift.sh [SEEDS] [STEPS]    (defaults: "0 1 2", 400)
# Needs: the troupe binary (build/bin/troupe, or TROUPE=...) and python3-torch (scripts/install-deps.sh --peers).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
troupe=${TROUPE:-$here/../build/bin/troupe}
TROUPE=$troupe source "$here/peer_blas.sh"
seeds=${1:-"0 1 2"}
steps=${2:-400}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "GPT 3 layers, d_model 96, 3 heads, context 32, batch 24 (A: micro 8 accumulated; B: 3 shares)"
printf '%-6s %-5s %5s | %12s %12s | %13s %13s\n' optim seed step "troupe dL" "pytorch dL" \
  "troupe dP" "pytorch dP"
for opt in adamw sgd; do
  lr=2e-3
  [[ $opt == sgd ]] && lr=0.1
  for seed in $seeds; do
    "$troupe" bench drift --optimizer "$opt" --lr "$lr" --seed "$seed" --steps "$steps" \
      --every "$steps" --dump "$work" > /dev/null
    /usr/bin/python3 "$here/peers/torch_drift.py" "$work" --every 50 | tail -n 1 |
      /usr/bin/python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
for row in r["rows"]:
    if row["step"] in (5, 10, 49, 99, 199, 299, 399) or row["step"] + 1 == '"$steps"':
        print("%-6s %-5s %5d | %12.3g %12.3g | %13.3g %13.3g" % (r["optimizer"], "'"$seed"'", row["step"],
              row["troupe_loss_diff"], row["pytorch_loss_diff"], row["troupe_param_rel_l2"],
              row["pytorch_param_rel_l2"]))'
  done
done
echo "dL: |loss A - loss B| at that step (PyTorch reports float32 losses: steps of 2.4e-7 near 3)"
echo "dP: ||params A - params B|| / ||params A|| (relative L2 over every parameter)"
