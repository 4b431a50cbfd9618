// The emulated CUDA device itself (cuda_emulation.h): what kernels compute on it, and that it
// reports what CUDA leaves undefined (barriers not every thread reaches, shuffles after a lane
// returned, launch limits) instead of computing something or hanging.
#include <gtest/gtest.h>

#include <vector>

namespace {

using troupe::emulation::run;

// Block-wide sum through shared memory, a tree with a barrier at each level.
__global__ void block_sum(const int* x, int* out) {
  __shared__ int part[256];
  part[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = part[0];
}

__device__ float warp_sum(float v) {
  for (int m = 16; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

TEST(CudaEmulation, BlocksBarriersAndShufflesCompute) {
  std::vector<int> x(3 * 256), sums(3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int(i);
  run(dim3(3), dim3(256), [&] { block_sum(x.data(), sums.data()); });
  for (int b = 0; b < 3; ++b) EXPECT_EQ(sums[size_t(b)], 256 * 256 * b + 255 * 128) << b;

  std::vector<float> lanes(64);
  run(dim3(1), dim3(64), [&] { lanes[threadIdx.x] = warp_sum(float(threadIdx.x)); });
  for (size_t l = 0; l < 64; ++l) EXPECT_EQ(lanes[l], l < 32 ? 496.f : 1520.f) << l;
}

TEST(CudaEmulation, WhatCudaLeavesUndefinedIsReported) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // Half a warp at __syncthreads, half at a shuffle that names the whole warp: on the GPU each
  // waits for the other (undefined); here it is named, with who waits where.
  EXPECT_DEATH(run(dim3(1), dim3(32),
                   [] {
                     if (threadIdx.x < 16)
                       __syncthreads();
                     else
                       warp_sum(1.f);
                   }),
               "16 at __syncthreads, 16 at a warp barrier or shuffle");
  EXPECT_DEATH(run(dim3(1), dim3(32),
                   [] {
                     if (threadIdx.x == 5) return;
                     warp_sum(1.f);
                   }),
               "after lane 5 of the warp returned");
  EXPECT_DEATH(run(dim3(1), dim3(32),
                   [] {
                     for (unsigned i = 0; i <= threadIdx.x % 2; ++i) warp_sum(1.f);  // divergent
                   }),
               "different warp barriers|wait at barriers|returned");
  EXPECT_DEATH(run(dim3(1, 70000), dim3(32), [] {}), "y and z 1..65535");
  EXPECT_DEATH(run(dim3(1), dim3(2048), [] {}), "1..1024");
}

}  // namespace
