// `troupe bench kernels`: each kernel of a device's Compute (models/compute.h) at a GPT's shapes,
// with the bytes or FLOPs it must move and, where the device's limit is known, the fraction of it.
// bench/peers/torch_kernels.py times the same operations in PyTorch at the same shapes, and
// bench/compare_kernels.sh (scripts/gpu-check.sh on a GPU) prints both side by side.
//
// Its own small library (models only): the troupe_cuda_kernels_bench binary that gpu-check.sh
// carries to a GPU machine without the project's packages runs the same code.
#pragma once

#include <string>
#include <vector>

namespace troupe::bench {

// Arguments after `troupe bench kernels`; returns the exit code (2: a bad argument, or a device
// this machine or build does not have).
int run_kernels_bench(const std::vector<std::string>& args,
                      const std::string& default_device = "cpu");

}  // namespace troupe::bench
