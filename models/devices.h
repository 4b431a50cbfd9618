// Opening a device's Compute by name. The CPU's is in every build; a CUDA device's lives in a
// module of its own, libtroupe_cuda.so (models/cuda/plugin.cpp), loaded the first time a CUDA
// device is opened: linked into troupe, cuBLAS would cost every process 0.36 s at start here
// (every agent, every `troupe status`), GPU or not.
//
// The module resolves the models library's symbols against the program that loads it (troupe
// and the test binaries export theirs: ENABLE_EXPORTS), so there is one cpu_compute() and one
// copy of every class.
#pragma once

#include <memory>
#include <string>

#include "models/compute.h"

namespace troupe::models {

// "cpu", "cpu:N" (the CPU's; not owned) or "cuda:N". bf16 (model.dtype = "bf16"): the linear
// layers' GEMMs read bf16 operands (on the CPU emulated: cpu_bf16_compute()).
// Throws std::runtime_error saying why a device cannot be opened: a malformed name, a build
// without the CUDA module, a module that does not load, no such GPU.
std::shared_ptr<Compute> open_compute(const std::string& device, bool bf16 = false);

// Whether this program can open CUDA devices, and if not why: "" when it can (the module loads
// and sees `count` devices), else the reason. Loads the module.
std::string cuda_workers_unavailable(int* count = nullptr);

}  // namespace troupe::models
