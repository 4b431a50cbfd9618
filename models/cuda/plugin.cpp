// libtroupe_cuda.so: the CUDA device's Compute as a module the models library loads when a CUDA
// device is opened (models/devices.h). Its two entry points are plain C; everything else it uses
// of the models library comes from the program that loads it.
#include <cstdio>
#include <exception>

#include "models/cuda/compute.h"

namespace cuda = troupe::models::cuda;

extern "C" {

__attribute__((visibility("default"))) int troupe_cuda_device_count() {
  return cuda::device_count();
}

// A new CudaCompute on GPU `device` (the caller owns it), or null with the reason in `error`.
__attribute__((visibility("default"))) troupe::models::Compute* troupe_cuda_open(
    int device, int bf16, char* error, size_t error_size) {
  try {
    if (device >= cuda::device_count()) {
      std::snprintf(error, error_size, "no such GPU (%s)", cuda::describe(device).c_str());
      return nullptr;
    }
    return new cuda::CudaCompute(device, bf16 ? cuda::GemmInput::bf16 : cuda::GemmInput::f32);
  } catch (const std::exception& e) {
    std::snprintf(error, error_size, "%s", e.what());
    return nullptr;
  }
}

}  // extern "C"
