// The part of the CUDA runtime Troupe calls (models/cuda/runtime.cpp, compute.cpp), for the
// emulated device (cuda_emulation.h): one device; its memory is host memory; work on a stream is
// done when the call returns (kernels run at their launch), so streams and events are tokens
// and every event has been reached. The real runtime.cpp and compute.cpp run on it unchanged.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

namespace {

// A stream, event or pool: only its identity matters.
template <typename Handle>
Handle token() {
  return reinterpret_cast<Handle>(new char(0));
}
template <typename Handle>
cudaError_t made(Handle* h) {
  *h = token<Handle>();
  return cudaSuccess;
}
template <typename Handle>
cudaError_t released(Handle h) {
  delete reinterpret_cast<char*>(h);
  return cudaSuccess;
}

cudaMemPool_t the_pool() {
  static cudaMemPool_t pool = token<cudaMemPool_t>();
  return pool;
}

// Fresh memory holds what CUDA leaves undefined: here all ones (a NaN in every float and bf16),
// the same in every run, so a kernel that reads before it writes computes NaNs, always, instead
// of whatever the host allocator last left there.
cudaError_t allocated(void** p, size_t bytes) {
  const size_t rounded = (bytes + 255) / 256 * 256 + 256;
  *p = std::aligned_alloc(256, rounded);
  if (!*p) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, rounded);
  return cudaSuccess;
}
cudaError_t freed(void* p) {
  std::free(p);
  return cudaSuccess;
}

}  // namespace

extern "C" {

const char* cudaGetErrorName(cudaError_t e) {
  return e == cudaSuccess ? "cudaSuccess" : "cudaError";
}
const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "an error of the emulated CUDA device";
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  std::memset(p, 0, sizeof *p);
  std::strncpy(p->name, "Emulated CUDA device (CPU fibers)", sizeof p->name - 1);
  p->major = 9;
  p->totalGlobalMem = size_t(1) << 30;
  p->multiProcessorCount = 1;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return made(s); }
cudaError_t cudaStreamDestroy(cudaStream_t s) { return released(s); }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaMalloc(void** p, size_t bytes) { return allocated(p, bytes); }
cudaError_t cudaFree(void* p) { return freed(p); }
cudaError_t cudaMemset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return made(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) { return released(e); }
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t* pool, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  *pool = the_pool();
  return cudaSuccess;
}
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t, enum cudaMemPoolAttr, void*) {
  return cudaSuccess;
}
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t) { return allocated(p, bytes); }
cudaError_t cudaFreeAsync(void* p, cudaStream_t) { return freed(p); }
cudaError_t cudaMallocHost(void** p, size_t bytes) { return allocated(p, bytes); }
cudaError_t cudaFreeHost(void* p) { return freed(p); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind,
                            cudaStream_t) {
  if (bytes) std::memmove(dst, src, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes, cudaStream_t) {
  if (bytes) std::memset(p, value, bytes);
  return cudaSuccess;
}

}  // extern "C"
