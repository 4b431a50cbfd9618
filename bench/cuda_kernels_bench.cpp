// troupe_cuda_kernels_bench: `troupe bench kernels` for a CUDA device (bench/kernels_bench.h), in
// a binary of its own: troupe does not load cuBLAS, and scripts/gpu-check.sh carries this one to
// a GPU machine without the project's packages. Without a GPU: exits 2 saying so.
//
// Usage: troupe_cuda_kernels_bench [--device cuda:N] [--bf16] [--json] [shapes: --help]
#include <string>
#include <vector>

#include "bench/kernels_bench.h"

int main(int argc, char** argv) {
  return troupe::bench::run_kernels_bench({argv + 1, argv + argc}, "cuda");
}
