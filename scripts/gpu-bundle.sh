#!/usr/bin/env bash
# Prepares what scripts/gpu-check.sh needs on a GPU machine that has CUDA, NCCL and a driver but
# none of our Debian libraries: the GPU test and benchmark binaries, troupe itself with its CUDA
# module (for the elastic job on the GPU), stripped, and the shared libraries they link (UCX's
# transport modules too), except glibc, the CUDA driver, NCCL and cuBLAS/cuBLASLt (the GPU
# machine's own; cuBLASLt alone is 540 MB). Packed with xz into build-gpu-pack/bundle.tar.xz
# (about 10 MB; the run tool carries at most 64 MiB: carry build-gpu-pack). Run after
# `make build`, here; gpu-check.sh unpacks it there.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build-gpu
cmake --build build -j 2 --target troupe_cuda_kernels_bench > /dev/null  # (not in the default build)
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib/ucx"
copy_libs() {
  ldd "$1" | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libnccl.so*) ;;
      libcublas*) ;;
      *) [[ -e $out/lib/$(basename "$lib") ]] || cp -L "$lib" "$out/lib/" ;;
    esac
  done
}
for bin in build/bin/troupe_gpu_tests build/bin/troupe_nccl_bench build/bin/troupe_cuda_kernels_bench \
           build/bin/troupe build/bin/libtroupe_cuda.so; do
  [[ -e $bin ]] || { echo "gpu-bundle: $bin is missing (a build without CUDA?)" >&2; exit 1; }
  strip -o "$out/bin/$(basename "$bin")" "$bin"  # (the exported symbols stay: .dynsym)
  copy_libs "$bin"
done
# UCX finds its transports (shared memory, TCP, ...) as modules of its own.
ucx_modules=$(dirname "$(ldd build/bin/troupe | awk '/libucp.so/ {print $3}')")/ucx
for m in "$ucx_modules"/*.so.0; do
  cp -L "$m" "$out/lib/ucx/"
  copy_libs "$m"
done
mkdir -p build-gpu-pack
tar cJf build-gpu-pack/bundle.tar.xz "$out"
du -sh "$out" build-gpu-pack/bundle.tar.xz
