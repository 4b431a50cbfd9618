// What this build and this machine offer for CUDA: a line for `troupe version` and the tests.
#pragma once

#include <string>

namespace troupe::comm {

bool built_with_cuda();
// Number of usable CUDA devices (0 without a driver or a GPU, or in a build without CUDA).
int cuda_device_count();
// "CUDA runtime 13000, NCCL 2.28.9, 0 devices" or "built without CUDA".
std::string cuda_summary();

}  // namespace troupe::comm
