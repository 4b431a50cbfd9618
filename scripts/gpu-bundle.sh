#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has CUDA, NCCL and a driver but
# none of our Debian libraries: copies the shared libraries that the GPU test and benchmark
# binaries link (except glibc, the CUDA driver and NCCL, which are the GPU machine's) into
# build/gpu-libs. Run after `make build`, here; then carry `build` to the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/gpu-libs
rm -rf "$out"
mkdir -p "$out"
for bin in build/bin/troupe_gpu_tests build/bin/troupe_nccl_bench; do
  [[ -x $bin ]] || { echo "gpu-bundle: $bin is missing (a build without CUDA?)" >&2; exit 1; }
  ldd "$bin" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
      *) cp -L "$lib" "$out/" ;;
    esac
  done
done
du -sh "$out" build/bin/troupe_gpu_tests build/bin/troupe_nccl_bench
