#!/usr/bin/env bash
# Checkpoint costs side by side, RUNS rounds alternating: `troupe bench checkpoint` (blocking copy,
# background write, restore) and PyTorch's torch.save (with fsync) / torch.load of the same state
# (bench/peers/torch_checkpoint.py), with the limits measured in the same run: memcpy of the
# state (for the blocking copy) and dd with fsync (for the write). Medians.
# Usage: bench/compare_checkpoint.sh [RUNS] [PARAMS]     (defaults 3, 100e6)
# Needs python3-torch (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
PARAMS=${2:-100e6}
TROUPE=${TROUPE:-build/bin/troupe}
source bench/peer_blas.sh
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for ((r = 0; r < RUNS; r++)); do
  "$TROUPE" bench checkpoint --params "$PARAMS" --json >>"$out"
  /usr/bin/python3 bench/peers/torch_checkpoint.py --params "$PARAMS" >>"$out"
done
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
t = [r for r in rows if r["impl"] == "troupe"]
p = [r for r in rows if r["impl"] == "pytorch"]
m = lambda rs, k: statistics.median(r[k] for r in rs)
gb = t[0]["bytes"] / 1e9
print(f"host: {open('/proc/cpuinfo').read().split('model name')[1].split(':')[1].splitlines()[0].strip()}")
print(f"state: {t[0]['params']} parameters + AdamW moments = {gb:.2f} GB; medians of {len(t)} runs")
print(f"  blocking copy  {m(t,'blocking_s'):7.3f} s   memcpy {m(t,'memcpy_s'):6.3f} s   ratio {m(t,'blocking_s')/m(t,'memcpy_s'):5.2f}x  (goal <= 2x)")
print(f"  first copy     {m(t,'first_blocking_s'):7.3f} s   (allocating the staging buffers, once)")
print(f"  write          {m(t,'write_s'):7.3f} s   dd+fsync {m(t,'dd_fsync_s'):6.3f} s   ratio {m(t,'write_s')/m(t,'dd_fsync_s'):5.2f}x  (goal <= 1.5x)")
print(f"  torch.save     {m(p,'save_s'):7.3f} s   (blocks training the whole time)")
print(f"  restore        {m(t,'restore_s'):7.3f} s   torch.load {m(p,'load_s'):6.3f} s   speedup {m(p,'load_s')/m(t,'restore_s'):5.2f}x  (goal >= 2x)")
PY
