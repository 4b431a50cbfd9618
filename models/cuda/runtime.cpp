#include "models/cuda/runtime.h"

#include <cstdint>

namespace troupe::models::cuda {

CudaError::CudaError(cudaError_t code, const char* call, const char* file, int line)
    : std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                         ": " + cudaGetErrorName(code) + " (" + cudaGetErrorString(code) + ")"),
      code_(code) {}

int device_count() {
  int n = 0;  // (left untouched when there is no driver: error 35)
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: later calls must not see a stale error
    return 0;
  }
  return n;
}

std::string describe(int device) {
  const int n = device_count();
  if (n == 0) return "no CUDA device (no driver or no GPU)";
  if (device < 0 || device >= n)
    return "no CUDA device " + std::to_string(device) + " (" + std::to_string(n) + " visible)";
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess)
    return "CUDA device " + std::to_string(device);
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.totalGlobalMem >> 30) + " GiB)";
}

Stream::Stream() { TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }

Stream::~Stream() {
  if (stream_) (void)cudaStreamDestroy(stream_);
}

void Stream::synchronize() const { TROUPE_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void keep_pool_memory(int device) {
  cudaMemPool_t pool = nullptr;
  TROUPE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t keep = UINT64_MAX;
  TROUPE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
}

void* pool_allocate(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  if (bytes == 0) bytes = 1;  // a valid, unique pointer for an empty buffer
  TROUPE_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  return p;
}

void pool_free(void* p, cudaStream_t stream) noexcept { (void)cudaFreeAsync(p, stream); }

void* pinned_allocate(size_t bytes) {
  void* p = nullptr;
  TROUPE_CUDA_CHECK(cudaMallocHost(&p, bytes == 0 ? 1 : bytes));
  return p;
}

void pinned_free(void* p) noexcept {
  if (p) (void)cudaFreeHost(p);
}

void copy_to_device(void* device, const void* host, size_t bytes, cudaStream_t stream) {
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream));
}

void copy_to_host(void* host, const void* device, size_t bytes, cudaStream_t stream) {
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream));
}

void fill_zero(void* device, size_t bytes, cudaStream_t stream) {
  TROUPE_CUDA_CHECK(cudaMemsetAsync(device, 0, bytes, stream));
}

}  // namespace troupe::models::cuda
