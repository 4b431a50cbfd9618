// models/cuda/runtime.h without a GPU, for the emulated kernels (cuda_emulation.h): "device"
// memory is host memory, a stream runs nothing (a launch completes before it returns), copies
// are memcpy.
#include <cstdlib>
#include <cstring>
#include <string>

#include "models/cuda/runtime.h"

namespace troupe::models::cuda {

CudaError::CudaError(cudaError_t code, const char* call, const char* file, int line)
    : std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                         " (emulated CUDA: error " + std::to_string(int(code)) + ")"),
      code_(code) {}

int device_count() { return 1; }
std::string describe(int) { return "an emulated CUDA device (CPU fibers)"; }

Stream::Stream() = default;
Stream::~Stream() = default;
void Stream::synchronize() const {}

void* pool_allocate(size_t bytes, cudaStream_t) {
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  if (!p) throw std::bad_alloc();
  return p;
}
void pool_free(void* p, cudaStream_t) noexcept { std::free(p); }
void keep_pool_memory(int) {}
void* pinned_allocate(size_t bytes) { return pool_allocate(bytes, nullptr); }
void pinned_free(void* p) noexcept { std::free(p); }

void copy_to_device(void* device, const void* host, size_t bytes, cudaStream_t) {
  if (bytes) std::memcpy(device, host, bytes);
}
void copy_to_host(void* host, const void* device, size_t bytes, cudaStream_t) {
  if (bytes) std::memcpy(host, device, bytes);
}
void fill_zero(void* device, size_t bytes, cudaStream_t) {
  if (bytes) std::memset(device, 0, bytes);
}

}  // namespace troupe::models::cuda
