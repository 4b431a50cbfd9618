#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has CUDA, NCCL and a driver but
# none of our Debian libraries: the GPU test and benchmark binaries (stripped) and the shared
# libraries they link, except glibc, the CUDA driver, NCCL and cuBLAS/cuBLASLt (the GPU machine's
# own; cuBLASLt alone is 540 MB), into build-gpu/ (a few MB: carry it, not build/, which is GBs).
# Run after `make build`, here.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-gpu
cmake --build build -j 2 --target troupe_cuda_kernels_bench > /dev/null  # (not in the default build)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for bin in build/bin/troupe_gpu_tests build/bin/troupe_nccl_bench build/bin/troupe_cuda_kernels_bench; do
  [[ -x $bin ]] || { echo "gpu-bundle: $bin is missing (a build without CUDA?)" >&2; exit 1; }
  strip -o "$out/bin/$(basename "$bin")" "$bin"
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
      libcublas*) ;;
      *) cp -L "$lib" "$out/lib/" ;;
    esac
  done
done
du -sh "$out"
