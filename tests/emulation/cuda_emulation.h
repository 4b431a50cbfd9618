// The CUDA execution model on the CPU, to check the logic of the models' kernels where no GPU is.
// models/cuda/kernels.cu is compiled as C++ with this header forced in first (ctest label
// `emulated`, target troupe_cuda_emulated_tests): each launch runs its blocks one after another,
// each block's threads as fibers on the calling thread, with __syncthreads, __syncwarp and the warp
// shuffles as barriers among them. A barrier that not every live thread of its block (or warp)
// reaches, or a full-warp shuffle after a lane of the warp has returned, is reported and aborts
// instead of hanging; the order in which fibers run is fixed, so a run is repeatable.
//
// What it checks: indexing, masking, the order of sums, and that every thread reaches the same
// barriers (the kernels' results against the CPU's, tests/gpu/kernels_test.cpp). What it cannot:
// the GPU's memory model (all threads see every write at once here), timing, occupancy, launch
// limits and anything of cuBLASLt or NCCL; those need the GPU tests on a GPU.
#pragma once

#define TROUPE_CUDA_EMULATION 1
// (Before CUDA's headers, which define these only where nothing has.)
#define __global__
#define __device__
#define __host__
#define __shared__ static

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <math.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>

#define CUDART_INF_F (std::numeric_limits<float>::infinity())

namespace troupe::emulation {

// Where the running thread is.
struct Lane {
  uint3 thread{0, 0, 0}, block{0, 0, 0};
  dim3 block_dim, grid_dim;
};
const Lane& lane();

// Runs body once per thread of every block of the grid (blocks in order, x fastest).
void run(dim3 grid, dim3 block, const std::function<void()>& body);

void sync_block();
void sync_warp();
// A shuffle's bits: gives this lane's value to the warp, returns lane (this ^ xor_mask)'s.
uint64_t exchange_xor(uint64_t bits, int xor_mask, unsigned member_mask);

}  // namespace troupe::emulation

#define threadIdx (::troupe::emulation::lane().thread)
#define blockIdx (::troupe::emulation::lane().block)
#define blockDim (::troupe::emulation::lane().block_dim)
#define gridDim (::troupe::emulation::lane().grid_dim)

inline void __syncthreads() { ::troupe::emulation::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::troupe::emulation::sync_warp(); }

template <typename T>
T __shfl_xor_sync(unsigned member_mask, T value, int xor_mask) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable<T>::value, "a word");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof value);
  bits = ::troupe::emulation::exchange_xor(bits, xor_mask, member_mask);
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// The device's min and max (any two arithmetic types, as CUDA's overloads).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
