#!/usr/bin/env bash
# On a machine with a GPU (and CUDA/NCCL, but none of the project's packages): runs the NCCL tests
# (world size 1: init, allreduce, abort, re-init; two devices if there are two) and the NCCL
# allreduce benchmark from a build made on a machine without a GPU, then prints a short table.
# Prepare here first: `make build && scripts/gpu-bundle.sh`; carry `build`. Takes under 5 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
export LD_LIBRARY_PATH="$PWD/build/gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# NCCL: the machine's own (too large to carry); look in the usual places.
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu \
         $(/usr/bin/python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) + "/lib")' 2>/dev/null); do
  [[ -e $d/libnccl.so.2 ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
echo "== NCCL tests (gtest, label gpu)"
timeout 180 build/bin/troupe_gpu_tests --gtest_brief=0 2>&1 | grep -E "^\[ *(RUN|OK|SKIPPED|FAILED|PASSED) *\]|Failure|skipped|Skipped" 
tests_rc=${PIPESTATUS[0]}
echo "== NCCL allreduce benchmark"
timeout 120 build/bin/troupe_nccl_bench --sizes 4096,65536,1048576,16777216,67108864,268435456,1073741824
bench_rc=$?
echo "== summary: tests exit $tests_rc, benchmark exit $bench_rc"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 ]]
