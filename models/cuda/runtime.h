// The CUDA device for the models: errors, streams, and owned memory.
//
// Device memory comes from the device's stream-ordered pool (cudaMallocFromPoolAsync on a pool
// whose release threshold keeps every freed byte cached): after the first step no allocation
// reaches the driver, and a buffer freed on a stream is reused by later work on that stream
// without a synchronisation. DeviceBuffer owns such memory (RAII, move-only); PinnedBuffer owns
// page-locked host memory for the copies of state between host and device.
//
// Thread-safety: a Stream and the buffers used on it belong to one thread at a time (the
// worker's); the pool is the driver's and is thread-safe.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::models::cuda {

// A CUDA call failed: what was called, where, and the runtime's words for the error.
class CudaError : public std::runtime_error {
 public:
  CudaError(cudaError_t code, const char* call, const char* file, int line);
  cudaError_t code() const { return code_; }

 private:
  cudaError_t code_;
};

#define TROUPE_CUDA_CHECK(call)                                                                \
  do {                                                                                         \
    cudaError_t troupe_cuda_status_ = (call);                                                  \
    if (troupe_cuda_status_ != cudaSuccess)                                                    \
      throw ::troupe::models::cuda::CudaError(troupe_cuda_status_, #call, __FILE__, __LINE__); \
  } while (0)

// The number of usable devices: 0 without a driver or a GPU (never throws).
int device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for device d, or why there is none.
std::string describe(int device);

// A non-blocking stream on the current device.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  void synchronize() const;

 private:
  cudaStream_t stream_ = nullptr;
};

// Bytes from the current device's default memory pool, freed in stream order.
void* pool_allocate(size_t bytes, cudaStream_t stream);
void pool_free(void* p, cudaStream_t stream) noexcept;
// Keeps every freed byte in the pool (no release at synchronisation points): call once per device.
void keep_pool_memory(int device);

template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t n, cudaStream_t stream)
      : data_(static_cast<T*>(pool_allocate(n * sizeof(T), stream))), size_(n), stream_(stream) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { swap(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    DeviceBuffer(std::move(o)).swap(*this);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }
  cudaStream_t stream() const { return stream_; }
  void reset() noexcept {
    if (data_) pool_free(data_, stream_);
    data_ = nullptr;
    size_ = 0;
  }
  void swap(DeviceBuffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(stream_, o.stream_);
  }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Page-locked host memory (cudaMallocHost): copies from and to it run asynchronously.
void* pinned_allocate(size_t bytes);
void pinned_free(void* p) noexcept;

template <typename T>
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t n)
      : data_(static_cast<T*>(pinned_allocate(n * sizeof(T)))), size_(n) {}
  ~PinnedBuffer() { pinned_free(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_;
  size_t size_;
};

// Stream-ordered copies (the host side should be pinned for them to overlap).
void copy_to_device(void* device, const void* host, size_t bytes, cudaStream_t stream);
void copy_to_host(void* host, const void* device, size_t bytes, cudaStream_t stream);
void fill_zero(void* device, size_t bytes, cudaStream_t stream);

}  // namespace troupe::models::cuda
