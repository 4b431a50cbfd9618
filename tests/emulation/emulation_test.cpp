// The emulated CUDA device itself (cuda_emulation.h): what kernels compute on it, and that it
// reports what CUDA leaves undefined (barriers not every thread reaches, shuffles after a lane
// returned, launch limits, misaligned warp matrices) instead of computing something or hanging.
#include <gtest/gtest.h>

#include <vector>

namespace {

namespace wmma = nvcuda::wmma;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

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

// C = A B (A row-major, B stored as its transpose), through a strip of shared memory that every
// lane then reads whole: after the __syncwarp every lane sees every lane's share of the store.
__global__ void warp_product(const __nv_bfloat16* a, const __nv_bfloat16* bt, float* c, bool sync) {
  __shared__ __align__(32) float strip[256];
  for (int e = int(threadIdx.x); e < 256; e += 32) strip[e] = -1.f;  // (not the last launch's)
  __syncwarp();
  FragA fa;
  FragB fb;
  FragC fc;
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, bt, 16);
  wmma::fill_fragment(fc, 0.f);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(strip, fc, 16, wmma::mem_row_major);
  if (sync) __syncwarp();
  for (int e = int(threadIdx.x); e < 256; e += 32) c[e] = strip[(e + 128) % 256];  // (others')
}

TEST(CudaEmulation, WarpMatrixProductsAndTheirRules) {
  alignas(32) __nv_bfloat16 a[256], bt[256];
  float want[256] = {}, got[256];
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16(float(i % 7) - 3.f);
    bt[i] = __float2bfloat16(float(i % 5) * 0.5f);
  }
  for (int r = 0; r < 16; ++r)
    for (int n = 0; n < 16; ++n)
      for (int k = 0; k < 16; ++k)
        want[r * 16 + n] += __bfloat162float(a[r * 16 + k]) * __bfloat162float(bt[n * 16 + k]);
  run(dim3(1), dim3(32), [&] { warp_product(a, bt, got, true); });
  for (int e = 0; e < 256; ++e) EXPECT_EQ(got[e], want[(e + 128) % 256]) << e;
  // Without the __syncwarp a lane reads its neighbours' shares before they stored them.
  std::fill(got, got + 256, -1.f);
  run(dim3(1), dim3(32), [&] { warp_product(a, bt, got, false); });
  int stale = 0;
  for (int e = 0; e < 256; ++e) stale += got[e] != want[(e + 128) % 256];
  EXPECT_GT(stale, 0);

  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(run(dim3(1), dim3(32), [&] { warp_product(a + 1, bt, got, true); }),
               "not 256-bit aligned");
  EXPECT_DEATH(run(dim3(1), dim3(32),
                   [&] {
                     FragA fa;
                     wmma::load_matrix_sync(fa, a, 12);
                   }),
               "multiple of 16 bytes");
  EXPECT_DEATH(run(dim3(1), dim3(32),
                   [&] {
                     if (threadIdx.x == 3) return;
                     FragA fa;
                     wmma::load_matrix_sync(fa, a, 16);
                   }),
               "after lane 3 of the warp returned");
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
