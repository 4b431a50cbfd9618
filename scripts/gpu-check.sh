#!/usr/bin/env bash
# On a machine with a GPU (CUDA, cuBLAS, NCCL, a driver; none of the project's packages): runs the
# GPU tests (the models' CUDA kernels against the CPU's, at odd shapes; a GPT and an MLP trained on
# the GPU against the CPU's losses, bf16 against f32; the NCCL backend at world size 1: init,
# allreduce, abort, re-init; two devices if there are two), the NCCL allreduce
# benchmark, and the CUDA kernels' benchmark next to PyTorch's (bench/peers/torch_kernels.py),
# from a build made on a machine without a GPU; prints tables for docs/performance.md.
# Also the elastic job on the GPU: scripts/gpu-elastic.sh with the bundle's troupe (2 workers
# sharing cuda:0, one SIGKILLed, a joiner: bitwise a static run, the ledger exact).
# Prepare here first: `make build && scripts/gpu-bundle.sh`; carry `build-gpu-pack` (the run
# tool's carry; 12 MB). Takes under 10 minutes: the timeouts add up to 595 s (run it with timeout_s 600).
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=build-gpu
# The Python that has PyTorch (the GPU machine's image: the plain python3, a venv in /opt/torch;
# Debian here: /usr/bin/python3 with python3-torch), else any: the peers and the tables need it.
PYTHON=
for p in python3 /opt/torch/.venv/bin/python3 /usr/bin/python3; do
  command -v "$p" > /dev/null && "$p" -c "import torch" 2> /dev/null && { PYTHON=$p; break; }
done
[[ -n $PYTHON ]] || PYTHON=$(command -v python3 || echo /usr/bin/python3)
export PYTHON
# (The pack is what travels: build-gpu-pack/bundle.tar.xz, unpacked here with Python's lzma.)
if [[ ! -x $bundle/bin/troupe_gpu_tests && -e build-gpu-pack/bundle.tar.xz ]]; then
  "$PYTHON" -c "import tarfile; tarfile.open('build-gpu-pack/bundle.tar.xz').extractall('.')"
fi
[[ -x $bundle/bin/troupe_gpu_tests ]] || { echo "gpu-check: no $bundle (run scripts/gpu-bundle.sh here first)"; exit 2; }
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export UCX_MODULE_DIR="$PWD/$bundle/lib/ucx"
# NCCL and cuBLAS: the machine's own (too large to carry): the CUDA folder, the system's, and
# the NVIDIA wheels next to that Python's PyTorch (nvidia/*/lib).
wheel_libs=$("$PYTHON" - 2> /dev/null <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
print(" ".join(sorted({os.path.dirname(f) for r in roots
                        for f in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True)
                        if os.path.basename(f).startswith(("libnccl.so", "libcublasLt.so"))})))
PY
)
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/lib/x86_64-linux-gnu $wheel_libs; do
  [[ -e $d/libnccl.so.2 || -e $d/libcublasLt.so.13 ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
echo "== machine (Python with PyTorch: $PYTHON)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
missing=$(ldd $bundle/bin/troupe_gpu_tests | grep "not found")
[[ -z $missing ]] || echo "gpu-check: libraries not found: $missing"
echo "== GPU tests (gtest, label gpu: CUDA kernels vs CPU, NCCL)"
timeout 120 $bundle/bin/troupe_gpu_tests --gtest_brief=0 2>&1 | grep -E "^\[ *(RUN|OK|SKIPPED|FAILED|PASSED) *\]|Failure|Expected|Which is|element|skipped|Skipped"
tests_rc=${PIPESTATUS[0]}
echo "== NCCL allreduce benchmark"
timeout 45 $bundle/bin/troupe_nccl_bench --sizes 4096,65536,1048576,16777216,67108864,268435456,1073741824
bench_rc=$?
echo "== CUDA kernels next to PyTorch (GPT-2 small shapes; ratio = PyTorch time / Troupe time)"
# (f32, then the bf16 rows, the GEMM and attention on tensor cores, from a second run with bf16 inputs.)
timeout 60 $bundle/bin/troupe_cuda_kernels_bench --json > /tmp/troupe_kernels.json
kernels_rc=$?
timeout 30 $bundle/bin/troupe_cuda_kernels_bench --bf16 --json > /tmp/troupe_kernels_bf16.json
timeout 60 "$PYTHON" bench/peers/torch_kernels.py --device cuda --json > /tmp/torch_kernels.json
torch_rc=$?
timeout 30 "$PYTHON" bench/peers/torch_kernels.py --device cuda --bf16 --json > /tmp/torch_kernels_bf16.json
"$PYTHON" - <<'PY'
import json
def rows(path, only_bf16=False):
    try:
        return {r["kernel"]: r for r in json.load(open(path))
                if not only_bf16 or r["kernel"].endswith("bf16")}
    except Exception as e:
        print("%s: no results (%s)" % (path, e))
        return {}
ours = {**rows("/tmp/troupe_kernels.json"), **rows("/tmp/troupe_kernels_bf16.json", True)}
peer = {**rows("/tmp/torch_kernels.json"), **rows("/tmp/torch_kernels_bf16.json", True)}
print("| kernel | Troupe us | of limit | PyTorch us | of limit | ratio |")
print("|---|---|---|---|---|---|")
for k in list(ours) + [k for k in peer if k not in ours]:
    t, p = ours.get(k), peer.get(k)
    cell = lambda r: ("%.1f" % r["us"], "%.0f%%" % (100 * r["of_limit"])) if r else ("-", "-")
    ratio = "%.2fx" % (p["us"] / t["us"]) if t and p else "-"
    print("| %s | %s | %s | %s | %s | %s |" % ((k,) + cell(t) + cell(p) + (ratio,)))
PY
rm -f /tmp/torch_gpt2_compile.json
echo "== GPT-2 small on the GPU next to PyTorch (bf16, batch 16, context 1024; MFU of the named peak)"
timeout 90 $bundle/bin/troupe bench model --model gpt2 --device cuda:0 --dtype bf16 --steps 10 --warmup 3 --json > /tmp/troupe_gpt2.json
gpt2_rc=$?
peak=$("$PYTHON" -c "import json; print(json.load(open('/tmp/troupe_gpt2.json'))['peak_tflops'])" 2>/dev/null || echo 989)
timeout 60 "$PYTHON" bench/peers/torch_gpt2.py --device cuda --bf16 --batch 16 --steps 10 --warmup 3 --peak-tflops "$peak" > /tmp/torch_gpt2.json
# torch.compile (the stretch goal) takes a minute to compile: only with GPU_CHECK_COMPILE=1.
[[ -n ${GPU_CHECK_COMPILE:-} ]] && timeout 150 "$PYTHON" bench/peers/torch_gpt2.py --device cuda --bf16 --batch 16 --steps 10 --warmup 3 --peak-tflops "$peak" --compile > /tmp/torch_gpt2_compile.json
"$PYTHON" - <<'PY'
import json
def one(path):
    try:
        return json.loads(open(path).read().strip().splitlines()[-1])
    except Exception as e:
        print("%s: no result (%s)" % (path, e))
        return None
t = one("/tmp/troupe_gpt2.json")
print("| GPT-2 small, bf16, batch 16 | tokens/s | MFU | ratio to Troupe |")
print("|---|---|---|---|")
for name, r in (("Troupe", t), ("PyTorch eager (SDPA, fused AdamW)", one("/tmp/torch_gpt2.json")),
                ("PyTorch torch.compile", one("/tmp/torch_gpt2_compile.json"))):
    if r:
        ratio = "%.2fx" % (r["tokens_per_s"] / t["tokens_per_s"]) if t else "-"
        print("| %s | %.0f | %.1f%% | %s |" % (name, r["tokens_per_s"], 100 * r.get("mfu", 0), ratio))
if t:
    print("peak: %s" % t["peak"])
PY
echo "== the elastic job on the GPU (scripts/gpu-elastic.sh: 2 workers on cuda:0, SIGKILL, a joiner)"
$bundle/bin/troupe version | tail -1
timeout 100 scripts/gpu-elastic.sh "$PWD/$bundle/bin/troupe" cuda
elastic_rc=$?
echo "== summary: tests exit $tests_rc, NCCL benchmark exit $bench_rc, kernels exit $kernels_rc, PyTorch exit $torch_rc, GPT-2 exit $gpt2_rc, elastic exit $elastic_rc"
[[ $tests_rc -eq 0 && $bench_rc -eq 0 && $kernels_rc -eq 0 && $elastic_rc -eq 0 ]]
