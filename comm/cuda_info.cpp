#include "comm/cuda_info.h"

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace troupe::comm {

#ifdef TROUPE_HAVE_CUDA
bool built_with_cuda() { return true; }

int cuda_device_count() {
  int count = 0;  // cudaGetDeviceCount leaves it untouched on error (no driver): treat as none
  if (cudaGetDeviceCount(&count) != cudaSuccess) return 0;
  return count;
}

std::string cuda_summary() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  int nccl = 0;
  ncclGetVersion(&nccl);
  std::string out = "CUDA runtime " + std::to_string(runtime) + ", NCCL " +
                    std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
                    std::to_string(nccl % 100) + ", ";
  int devices = cuda_device_count();
  out += std::to_string(devices) + (devices == 1 ? " device" : " devices");
  return out;
}
#else
bool built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
std::string cuda_summary() { return "built without CUDA"; }
#endif

}  // namespace troupe::comm
