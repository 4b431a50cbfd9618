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
// Reports `what` (as the emulation reports a divergence) unless ok.
void require(bool ok, const char* what);
// The running thread's lane in its warp.
int lane_in_warp();
// The running warp's tiles of 16 x 16 floats for the wmma emulation: 0 and 1 where a load
// assembles what its lanes read (in turn, by warp_parity()), 2-5 lane 0's last product (a, b, c
// and the result).
constexpr int kWarpMatrices = 6;
float* warp_matrix(int which);
// How many warp barriers the running lane has passed, modulo 2 (the same for every lane of a
// warp between two of them).
int warp_parity();

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

// Warp matrix operations (CUDA's <mma.h>, 16 x 16 x 16 tiles of bf16 with f32 accumulators), as
// CUDA specifies them and no more. Which elements of a tile a lane loads and stores is
// unspecified: here lane (5e + 3) % 32 takes element e (row-major), a spread no kernel's own
// division of rows among lanes matches, so a lane that reads what other lanes wrote without a
// __syncwarp between reads stale values, as it could on a GPU. After a load every lane holds
// the whole tile and computes the whole product. Each operation is a warp barrier (every lane of
// the warp must call it together) and checks CUDA's alignment rules (256-bit pointers, ldm a
// multiple of 16 bytes).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 16, "the emulation has the 16 x 16 x 16 shape only");
  float tile[16][16];  // [row][column] of the matrix the fragment holds
};

namespace detail {
inline float value(float x) { return x; }
inline float value(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
void check(const T* p, unsigned ldm) {
  ::troupe::emulation::require(reinterpret_cast<uintptr_t>(p) % 32 == 0,
                               "a wmma load or store's pointer is not 256-bit aligned");
  ::troupe::emulation::require(ldm * sizeof(T) % 16 == 0,
                               "a wmma load or store's ldm is not a multiple of 16 bytes");
}
// The first element of the running lane's eight (e with (5e + 3) % 32 == lane; 13 = 1/5 mod 32);
// the others follow 32 apart.
inline int first_owned() { return ((::troupe::emulation::lane_in_warp() - 3 + 32) * 13) % 32; }
inline size_t at(int e, unsigned ldm, bool row_major) {
  const size_t r = size_t(e / 16), c = size_t(e % 16);
  return row_major ? r * ldm + c : c * ldm + r;
}
// Each lane reads its elements now; after the barrier every lane takes the whole tile. (Two
// tiles in turn: a lane writes one again two barriers later, once every lane has read it.)
template <typename T>
void load(float (&tile)[16][16], const T* p, unsigned ldm, bool row_major) {
  check(p, ldm);
  float* assembled = ::troupe::emulation::warp_matrix(::troupe::emulation::warp_parity());
  for (int e = first_owned(); e < 256; e += 32) assembled[e] = value(p[at(e, ldm, row_major)]);
  __syncwarp();
  std::memcpy(tile, assembled, sizeof tile);
}
}  // namespace detail

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  detail::load(f.tile, p, ldm, std::is_same<Layout, row_major>::value);
}
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  detail::load(f.tile, p, ldm, layout == mem_row_major);
}
template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float v) {
  for (auto& row : f.tile)
    for (float& x : row) x = v;
}
// d = a b + c, each sum in k order. Lane 0 (the first of the warp to run between barriers)
// computes it; a lane with the same a, b and c takes its result (the 32 lanes of a warp hold the
// same tiles unless a kernel hands them different ones, which then computes its own). No barrier
// of its own (the emulation's time goes to barriers): the loads before it check that the whole
// warp is there.
template <typename La, typename Lb>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, La>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, Lb>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  using ::troupe::emulation::warp_matrix;
  constexpr size_t kTile = sizeof(float) * 256;
  const bool first = ::troupe::emulation::lane_in_warp() == 0;
  const bool same = !first && std::memcmp(warp_matrix(2), a.tile, kTile) == 0 &&
                    std::memcmp(warp_matrix(3), b.tile, kTile) == 0 &&
                    std::memcmp(warp_matrix(4), c.tile, kTile) == 0;
  if (same) {
    std::memcpy(d.tile, warp_matrix(5), kTile);
  } else {
    float out[16][16];
    std::memcpy(out, c.tile, kTile);
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < 16; ++n) out[r][n] += a.tile[r][k] * b.tile[k][n];
    if (first) {
      std::memcpy(warp_matrix(2), a.tile, kTile);
      std::memcpy(warp_matrix(3), b.tile, kTile);
      std::memcpy(warp_matrix(4), c.tile, kTile);
      std::memcpy(warp_matrix(5), out, kTile);
    }
    std::memcpy(d.tile, out, kTile);
  }
}
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  detail::check(p, ldm);
  __syncwarp();  // (first: what a lane stores is seen by the others after their next barrier)
  for (int e = detail::first_owned(); e < 256; e += 32)
    p[detail::at(e, ldm, layout == mem_row_major)] = f.tile[e / 16][e % 16];
}
}  // namespace nvcuda::wmma

// The device's min and max (any two arithmetic types, as CUDA's overloads).
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}
