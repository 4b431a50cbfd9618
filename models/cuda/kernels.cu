// The CUDA kernels of models/cuda/kernels.h. Plain, deterministic versions first (every sum in a
// fixed order, no atomics); each is checked against its CPU kernel by tests/gpu/kernels_test.cpp,
// on a GPU, and on the CPU through an emulation of CUDA's execution model (this file compiled as
// C++ with tests/emulation/cuda_emulation.h: TROUPE_CUDA_EMULATION).
#include <cuda_bf16.h>
#ifndef TROUPE_CUDA_EMULATION
#include <math_constants.h>
#include <mma.h>
#endif

#include <algorithm>
#include <numeric>
#include <type_traits>

#include "models/cuda/kernels.h"
#include "models/cuda/runtime.h"

namespace troupe::models::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kLayerNormEps = 1e-5f;
constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr size_t kNormChunk = 1024;  // as the CPU's grad_norm_sq
constexpr size_t kLayerNormRowsPerBlock = 32;
constexpr size_t kColumnSumRows = 32;  // bias_backward's rows per partial sum

unsigned blocks_for(size_t n, int threads = kThreads) {
  const size_t b = (n + threads - 1) / threads;
  return unsigned(std::min<size_t>(std::max<size_t>(b, 1), 65535 * 16));
}

// kernel<<<grid, threads, 0, stream>>>(args...), and the launch's error as an exception.
template <typename... Params, typename... Args>
void launch_sized(void (*kernel)(Params...), dim3 grid, unsigned threads, cudaStream_t stream,
                  Args... args) {
#ifdef TROUPE_CUDA_EMULATION
  (void)stream;  // (a launch completes before it returns)
  emulation::run(grid, dim3(threads), [&] { kernel(args...); });
#else
  // clang-format off
  kernel<<<grid, threads, 0, stream>>>(args...);
  // clang-format on
  TROUPE_CUDA_CHECK(cudaGetLastError());
#endif
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, cudaStream_t stream, Args... args) {
  launch_sized(kernel, grid, kThreads, stream, args...);
}

__device__ float warp_sum(float v) {
  // A butterfly: every lane ends with the same bits (x + y == y + x at each level).
  for (int m = kWarp / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

#define GRID_STRIDE(i, n)                                                 \
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < (n); \
       i += size_t(gridDim.x) * blockDim.x)

// ---- elementwise ----------------------------------------------------------------------------

__global__ void relu_forward_kernel(float* out, const float* inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = inp[i] > 0.f ? inp[i] : 0.f;
}

__global__ void relu_backward_kernel(float* dinp, const float* dout, const float* inp, size_t n) {
  GRID_STRIDE(i, n) dinp[i] += inp[i] > 0.f ? dout[i] : 0.f;  // (an inf dout times 0: NaN)
}

__global__ void gelu_forward_kernel(float* out, const float* inp, size_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.f + tanhf(kGeluScale * (x + cube)));
  }
}

__global__ void gelu_backward_kernel(float* dinp, const float* dout, const float* inp, size_t n) {
  GRID_STRIDE(i, n) {
    const float x = inp[i];
    const float th = tanhf(kGeluScale * (x + 0.044715f * x * x * x));
    const float sech2 = 1.f - th * th;
    const float local =
        0.5f * (1.f + th) + x * 0.5f * sech2 * kGeluScale * (1.f + 3.f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

__global__ void residual_forward_kernel(float* out, const float* a, const float* b, size_t n) {
  GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void residual_backward_kernel(float* da, float* db, const float* dout, size_t n) {
  GRID_STRIDE(i, n) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

__global__ void bias_forward_kernel(float* out, const float* bias, size_t N, size_t OC) {
  GRID_STRIDE(i, N * OC) out[i] += bias[i % OC];
}

// Block (g, c-chunk): the column sums of rows [g*R, g*R+R) in order, one thread a column (one
// thread down all N rows would leave the GPU idle: 3 blocks for OC 768).
__global__ void column_sums_partial_kernel(float* scratch, const float* x, size_t N, size_t C) {
  const size_t c = blockIdx.y * size_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const size_t begin = blockIdx.x * kColumnSumRows, end = min(N, begin + kColumnSumRows);
  float s = 0.f;
  for (size_t r = begin; r < end; ++r) s += x[r * C + c];
  scratch[blockIdx.x * C + c] = s;
}

// out[c] += the groups' sums, in group order: scratch[g * stride + c] (bias_backward's, and
// LayerNorm's two halves of its rows).
__global__ void column_sums_final_kernel(float* out, const float* scratch, size_t groups,
                                         size_t stride, size_t C) {
  const size_t c = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  float s = 0.f;
  for (size_t g = 0; g < groups; ++g) s += scratch[g * stride + c];
  out[c] += s;
}

// ---- layer norm -----------------------------------------------------------------------------

// One warp per row, two passes over it as the CPU (mean, then the mean squared deviation).
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, size_t N, size_t C,
                                         const float* residual, float* sum) {
  const size_t row = blockIdx.x * size_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* x = inp + row * C;
  const float* r = residual ? residual + row * C : nullptr;
  float* xs = sum ? sum + row * C : nullptr;
  float m = 0.f;
  for (size_t i = lane; i < C; i += kWarp) {
    float xi = r ? x[i] + r[i] : x[i];
    if (xs) xs[i] = xi;
    m += xi;
  }
  m = warp_sum(m) / float(C);
  const float* src = xs ? xs : x;
  if (xs) __syncwarp();
  float v = 0.f;
  for (size_t i = lane; i < C; i += kWarp) v += (src[i] - m) * (src[i] - m);
  v = warp_sum(v) / float(C);
  const float s = 1.f / sqrtf(v + kLayerNormEps);
  float* y = out + row * C;
  for (size_t i = lane; i < C; i += kWarp) y[i] = (src[i] - m) * s * weight[i] + bias[i];
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, size_t N, size_t C) {
  const size_t row = blockIdx.x * size_t(blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= N) return;
  const float* dy = dout + row * C;
  const float* x = inp + row * C;
  float* dx = dinp + row * C;
  const float m = mean[row], s = rstd[row];
  float dmean = 0.f, dnorm_mean = 0.f;
  for (size_t i = lane; i < C; i += kWarp) {
    const float dnorm = weight[i] * dy[i];
    dmean += dnorm;
    dnorm_mean += dnorm * (x[i] - m) * s;
  }
  dmean = warp_sum(dmean) / float(C);
  dnorm_mean = warp_sum(dnorm_mean) / float(C);
  for (size_t i = lane; i < C; i += kWarp) {
    const float norm = (x[i] - m) * s;
    dx[i] += (weight[i] * dy[i] - dmean - norm * dnorm_mean) * s;
  }
}

// Block (g, c-chunk): the parameter gradients of rows [g*R, g*R+R), one thread a channel.
__global__ void layernorm_backward_partial_kernel(float* scratch, const float* dout,
                                                  const float* inp, const float* mean,
                                                  const float* rstd, size_t N, size_t C) {
  const size_t c = blockIdx.y * size_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const size_t g = blockIdx.x, begin = g * kLayerNormRowsPerBlock;
  const size_t end = min(N, begin + kLayerNormRowsPerBlock);
  float dw = 0.f, db = 0.f;
  for (size_t r = begin; r < end; ++r) {
    const float dy = dout[r * C + c];
    dw += (inp[r * C + c] - mean[r]) * rstd[r] * dy;
    db += dy;
  }
  scratch[g * 2 * C + c] = dw;
  scratch[g * 2 * C + C + c] = db;
}

// ---- embedding ------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, size_t B, size_t T, size_t C) {
  GRID_STRIDE(i, B * T * C) {
    const size_t c = i % C, bt = i / C, t = bt % T;
    out[i] = wte[size_t(tokens[bt]) * C + c] + wpe[t * C + c];
  }
}

// Thread (t, c): the batch's rows at time t, in batch order.
__global__ void embedding_backward_position_kernel(float* dwpe, const float* dout, size_t B,
                                                   size_t T, size_t C) {
  GRID_STRIDE(i, T * C) {
    const size_t t = i / C, c = i % C;
    float s = 0.f;
    for (size_t b = 0; b < B; ++b) s += dout[(b * T + t) * C + c];
    dwpe[i] += s;
  }
}

// Block (group, c-chunk): one token's rows in position order.
__global__ void embedding_backward_token_kernel(float* dwte, const float* dout,
                                                const int32_t* tokens, const int32_t* offsets,
                                                const int32_t* positions, size_t C) {
  const size_t c = blockIdx.y * size_t(blockDim.x) + threadIdx.x;
  if (c >= C) return;
  const size_t g = blockIdx.x;
  float s = 0.f;
  for (int32_t k = offsets[g]; k < offsets[g + 1]; ++k) s += dout[size_t(positions[k]) * C + c];
  dwte[size_t(tokens[g]) * C + c] += s;
}

// ---- attention ------------------------------------------------------------------------------

// A head's row of qkv for one time step: q, k, v at offsets 0, C, 2C.
struct HeadRows {
  const float* base;  // qkv + (b*T) * 3C + h*hs
  size_t C3;
  __device__ const float* q(size_t t) const { return base + t * C3; }
  __device__ const float* k(size_t t) const { return base + t * C3 + C3 / 3; }
  __device__ const float* v(size_t t) const { return base + t * C3 + 2 * (C3 / 3); }
};

// The tiled kernels below: a block takes one head of one batch row and a run of rows (queries,
// or keys for dk/dv); each row has R lanes (a power of two, R * kPerLane >= head size), lane s of
// a row holding the head's elements s, s + R, s + 2R, ... in registers. The other side's rows
// come through shared memory a tile of kTile rows at a time (every row of a tile read by every
// thread: a broadcast). Dot products are each lane's partial sum, then a butterfly over the R
// lanes (every lane ends with the same bits). Loops run to the block's last row and mask the
// causal part, so every lane reaches every shuffle and barrier.
constexpr int kTile = 16;
constexpr int kMaxHead = 256;  // the largest head size

int lanes_for(int hs, int per_lane) {
  int r = 1;
  while (r * per_lane < hs) r *= 2;
  return r;
}

__device__ float lanes_sum(float v, int R) {
  for (int m = R / 2; m > 0; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Which rows a block of the tiled kernels takes: head (b, h), rows [first, first + per_block).
struct HeadBlock {
  size_t b, h, first, per_block;
  int R, sub;
  size_t row;  // this thread's row (may be >= T: a lane with nothing to do but the barriers)
  __device__ HeadBlock(size_t T, size_t NH, int lanes) : R(lanes) {
    per_block = blockDim.x / unsigned(R);
    const size_t chunks = (T + per_block - 1) / per_block, bh = blockIdx.x / chunks;
    b = bh / NH;
    h = bh % NH;
    first = blockIdx.x % chunks * per_block;
    sub = int(threadIdx.x % unsigned(R));
    row = first + threadIdx.x / unsigned(R);
  }
};

// This lane's elements of a head row: e -> element sub + R * e.
template <int kPerLane>
__device__ void lane_load(float (&a)[kPerLane], const float* src, int sub, int R, int hs,
                          bool live) {
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = sub + R * e;
    a[e] = live && d < hs ? src[d] : 0.f;
  }
}

template <int kPerLane>
__device__ float lane_dot(const float (&a)[kPerLane], const float* b, int sub, int R, int hs) {
  float p = 0.f;
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = sub + R * e;
    if (d < hs) p += a[e] * b[d];
  }
  return lanes_sum(p, R);
}

// Rows [j0, j0 + n) of two of the head's arrays (k and v; q and dout), rows `stride` floats
// apart, into two tiles of shared memory, hs floats a row; a barrier before (the last tile's
// readers) and after.
struct TileSource {
  const float* row0;
  size_t stride;
};
__device__ void load_tiles(float* first_tile, float* second_tile, TileSource first,
                           TileSource second, size_t j0, size_t n, int hs) {
  __syncthreads();
  for (size_t i = threadIdx.x; i < n * size_t(hs); i += blockDim.x) {
    const size_t r = j0 + i / size_t(hs), d = i % size_t(hs);
    first_tile[i] = first.row0[r * first.stride + d];
    second_tile[i] = second.row0[r * second.stride + d];
  }
  __syncthreads();
}

// Queries: keys 0..t with the online softmax (a running max and sum); out and lse.
template <int kPerLane>
__global__ void attention_forward_kernel(float* out, float* lse, const float* qkv, size_t B,
                                         size_t T, size_t C, size_t NH, int R) {
  __shared__ float ks[kTile * kMaxHead], vs[kTile * kMaxHead];
  const HeadBlock blk(T, NH, R);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t t = blk.row, last = min(T, blk.first + blk.per_block) - 1;
  const bool live = t < T;
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  float q[kPerLane], acc[kPerLane] = {};
  lane_load(q, rows.q(live ? t : 0), blk.sub, R, hs, live);
  float mx = -CUDART_INF_F, l = 0.f;
  for (size_t j0 = 0; j0 <= last; j0 += kTile) {
    const size_t n = min(size_t(kTile), last + 1 - j0);
    load_tiles(ks, vs, {rows.k(0), 3 * C}, {rows.v(0), 3 * C}, j0, n, hs);
    for (size_t jj = 0; jj < n; ++jj) {
      const float s = lane_dot(q, ks + jj * hs, blk.sub, R, hs) * scale;
      if (!live || j0 + jj > t) continue;
      const float m_new = fmaxf(mx, s);
      const float corr = expf(mx - m_new), p = expf(s - m_new);
      l = l * corr + p;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = blk.sub + R * e;
        if (d < hs) acc[e] = acc[e] * corr + p * vs[jj * hs + d];
      }
      mx = m_new;
    }
  }
  if (!live) return;
  float* o = out + (blk.b * T + t) * C + blk.h * size_t(hs);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = blk.sub + R * e;
    if (d < hs) o[d] = acc[e] / l;
  }
  if (blk.sub == 0) lse[(blk.b * NH + blk.h) * T + t] = mx + logf(l);
}

// D[b,h,t] = dot(dout row, out row) over the head, R lanes a row as the tiled kernels.
template <int kPerLane>
__global__ void attention_backward_dot_kernel(float* D, const float* dout, const float* out,
                                              size_t B, size_t T, size_t C, size_t NH, int R) {
  const HeadBlock blk(T, NH, R);
  const int hs = int(C / NH);
  const size_t t = blk.row;
  const bool live = t < T;
  const size_t at = (blk.b * T + (live ? t : 0)) * C + blk.h * size_t(hs);
  float dy[kPerLane];
  lane_load(dy, dout + at, blk.sub, R, hs, live);
  const float d = lane_dot(dy, out + at, blk.sub, R, hs);  // (0 for a lane past T: dy is 0)
  if (live && blk.sub == 0) D[(blk.b * NH + blk.h) * T + t] = d;
}

// Queries i: dq_i = scale * sum_j ds_ij k_j over the keys j <= i.
template <int kPerLane>
__global__ void attention_backward_q_kernel(float* dqkv, const float* dout, const float* qkv,
                                            const float* lse, const float* D, size_t B, size_t T,
                                            size_t C, size_t NH, int R) {
  __shared__ float ks[kTile * kMaxHead], vs[kTile * kMaxHead];
  const HeadBlock blk(T, NH, R);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t i = blk.row, last = min(T, blk.first + blk.per_block) - 1;
  const bool live = i < T;
  const size_t w = (blk.b * NH + blk.h) * T + (live ? i : 0);
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  float q[kPerLane], dy[kPerLane], dq[kPerLane] = {};
  lane_load(q, rows.q(live ? i : 0), blk.sub, R, hs, live);
  lane_load(dy, dout + (blk.b * T + (live ? i : 0)) * C + blk.h * size_t(hs), blk.sub, R, hs, live);
  const float lse_i = live ? lse[w] : 0.f, D_i = live ? D[w] : 0.f;
  for (size_t j0 = 0; j0 <= last; j0 += kTile) {
    const size_t n = min(size_t(kTile), last + 1 - j0);
    load_tiles(ks, vs, {rows.k(0), 3 * C}, {rows.v(0), 3 * C}, j0, n, hs);
    for (size_t jj = 0; jj < n; ++jj) {
      const float qk = lane_dot(q, ks + jj * hs, blk.sub, R, hs);
      const float dv = lane_dot(dy, vs + jj * hs, blk.sub, R, hs);
      if (!live || j0 + jj > i) continue;
      const float p = expf(qk * scale - lse_i), ds = p * (dv - D_i);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = blk.sub + R * e;
        if (d < hs) dq[e] += ds * ks[jj * hs + d];
      }
    }
  }
  if (!live) return;
  float* o = dqkv + (blk.b * T + i) * 3 * C + blk.h * size_t(hs);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = blk.sub + R * e;
    if (d < hs) o[d] += dq[e] * scale;
  }
}

// Keys j: dk_j = scale * sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i over the queries i >= j.
template <int kPerLane>
__global__ void attention_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv,
                                             const float* lse, const float* D, size_t B, size_t T,
                                             size_t C, size_t NH, int R) {
  __shared__ float qs[kTile * kMaxHead], dys[kTile * kMaxHead], lses[kTile], Ds[kTile];
  const HeadBlock blk(T, NH, R);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t j = blk.row;
  const bool live = j < T;
  const size_t row0 = (blk.b * NH + blk.h) * T;  // (b, h, 0) in lse and D
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  float k[kPerLane], v[kPerLane], dk[kPerLane] = {}, dv[kPerLane] = {};
  lane_load(k, rows.k(live ? j : 0), blk.sub, R, hs, live);
  lane_load(v, rows.v(live ? j : 0), blk.sub, R, hs, live);
  const float* dout_head = dout + blk.b * T * C + blk.h * size_t(hs);
  for (size_t i0 = blk.first; i0 < T;
       i0 += kTile) {  // (queries before the block's first key: none)
    const size_t n = min(size_t(kTile), T - i0);
    load_tiles(qs, dys, {rows.q(0), 3 * C}, {dout_head, C}, i0, n, hs);
    for (size_t ii = threadIdx.x; ii < n; ii += blockDim.x) {
      lses[ii] = lse[row0 + i0 + ii];
      Ds[ii] = D[row0 + i0 + ii];
    }
    __syncthreads();
    for (size_t ii = 0; ii < n; ++ii) {
      const float qk = lane_dot(k, qs + ii * hs, blk.sub, R, hs);
      const float dpv = lane_dot(v, dys + ii * hs, blk.sub, R, hs);
      if (!live || i0 + ii < j) continue;
      const float p = expf(qk * scale - lses[ii]), ds = p * (dpv - Ds[ii]);
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        const int d = blk.sub + R * e;
        if (d < hs) {
          dk[e] += ds * qs[ii * hs + d];
          dv[e] += p * dys[ii * hs + d];
        }
      }
    }
  }
  if (!live) return;
  float* base = dqkv + (blk.b * T + j) * 3 * C + blk.h * size_t(hs);
#pragma unroll
  for (int e = 0; e < kPerLane; ++e) {
    const int d = blk.sub + R * e;
    if (d < hs) {
      base[C + d] += dk[e] * scale;
      base[2 * C + d] += dv[e];
    }
  }
}

// ---- attention on tensor cores (bf16 operands, f32 accumulation) ----------------------------
// For mixed precision (model.dtype = "bf16"), as flash attention runs it: q, k, v and the output
// gradient rounded to bf16 where a product reads them, the probabilities and their gradient
// rounded to bf16 for the products that read them, every product summed in f32 on the tensor
// cores (wmma 16 x 16 x 16), the softmax in f32. A block has 4 warps; warp w owns 16 rows (queries,
// or keys for dk/dv) of the block's 64 and holds them as fragments; the other side's rows come
// through shared memory 32 at a time, converted to bf16 and padded to HP = 16 * kChunks columns
// (zeros past the head size add nothing). Which element of a fragment a lane holds is
// unspecified, so the kernels never touch fragments elementwise: the softmax's work goes through
// a warp's strip of shared memory (16 rows x 32 columns; lane l takes row l / 2, columns
// (l % 2) * 16 + [0, 16)). Every sum a fragment accumulates is a plain sum, so the forward runs
// two passes (each row's log-sum-exp first, then the output with final probabilities) instead of
// rescaling an accumulator it cannot address row by row.
namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, Bf16, wmma::row_major>;
using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::row_major>;
using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, Bf16, wmma::col_major>;
using FragAcc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr int kTcWarps = 4;
constexpr int kTcOwn = kTcWarps * 16;  // a block's own rows at most (fewer warps: 16 each)
constexpr int kTcTile = 32;            // the other side's rows a step

// Shared memory: two tiles of kTcTile bf16 rows (the block's own 64 rows are staged in both at
// the start, before the fragments take them), and each warp's strips: one f32, two bf16.
template <int kChunks>
struct TcShared {
  static_assert(kTcOwn == 2 * kTcTile, "a block's own rows are staged in the two tiles");
  static constexpr int HP = kChunks * 16;
  static constexpr size_t kTileBytes = size_t(kTcTile) * HP * sizeof(Bf16);
  static constexpr size_t kStrip = size_t(16) * kTcTile;  // elements
  static constexpr size_t kBytes = 2 * kTileBytes +
                                   kTcWarps * kStrip * (sizeof(float) + 2 * sizeof(Bf16)) +
                                   2 * kTcTile * sizeof(float);
  Bf16 *own, *tile0, *tile1;
  float *strips, *lse, *D;
  Bf16* strips16;
  __device__ explicit TcShared(unsigned char* p)
      : own(reinterpret_cast<Bf16*>(p)),
        tile0(own),
        tile1(reinterpret_cast<Bf16*>(p + kTileBytes)),
        strips(reinterpret_cast<float*>(p + 2 * kTileBytes)),
        lse(strips + kTcWarps * kStrip),
        D(lse + kTcTile),
        strips16(reinterpret_cast<Bf16*>(D + kTcTile)) {}
  __device__ float* strip(int warp) const { return strips + warp * kStrip; }
  __device__ Bf16* strip16(int warp, int which) const {
    return strips16 + (2 * warp + which) * kStrip;
  }
};

// Which rows a block takes: head (b, h), own rows [first, first + own) (16 a warp); this lane's
// warp, row of the warp's 16 and half of a strip row.
struct TcBlock {
  size_t b, h, first, own;
  int warp, r, half;
  __device__ TcBlock(size_t T, size_t NH) : own(blockDim.x / kWarp * 16) {
    const size_t chunks = (T + own - 1) / own, bh = blockIdx.x / chunks;
    b = bh / NH;
    h = bh % NH;
    first = blockIdx.x % chunks * own;
    warp = int(threadIdx.x / kWarp);
    r = int(threadIdx.x % kWarp) / 2;
    half = int(threadIdx.x % 2);
  }
  __device__ size_t warp_row0() const { return first + size_t(warp) * 16; }
  __device__ size_t row() const { return warp_row0() + size_t(r); }
  // The strip column of this lane's cc-th element (0..15 of its half), rotated by the row so that
  // the 32 lanes read 32 banks at once (unrotated, 16 rows 128 bytes apart: 2 banks).
  __device__ int column(int cc) const { return half * 16 + ((cc + r) & 15); }
};

// Rows [r0, r0 + n) of a head's f32 array (rows `stride` floats apart, hs wide) as `rows` bf16
// rows of HP columns (zeros past hs and past row n); by the whole block, no barrier.
__device__ void stage_bf16(Bf16* tile, int rows, int HP, const float* row0, size_t stride,
                           size_t r0, size_t n, int hs) {
  for (int i = int(threadIdx.x); i < rows * HP; i += int(blockDim.x)) {
    const int r = i / HP, d = i % HP;
    tile[i] = __float2bfloat16(size_t(r) < n && d < hs ? row0[(r0 + size_t(r)) * stride + d] : 0.f);
  }
}

// The warp's 16 rows of a staged 64-row tile, as fragments.
template <int kChunks>
__device__ void own_fragments(FragA (&f)[kChunks], const Bf16* own, int warp) {
  constexpr int HP = kChunks * 16;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) wmma::load_matrix_sync(f[c], own + warp * 16 * HP + c * 16, HP);
}

// strip (16 x 32, f32) = a (the warp's 16 rows) times the tile's 32 rows, transposed.
template <int kChunks>
__device__ void strip_product(float* strip, const FragA (&a)[kChunks], const Bf16* tile) {
  constexpr int HP = kChunks * 16;
  for (int nf = 0; nf < kTcTile / 16; ++nf) {
    FragAcc acc;
    wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      FragBCol b;
      wmma::load_matrix_sync(b, tile + nf * 16 * HP + c * 16, HP);
      wmma::mma_sync(acc, a[c], b, acc);
    }
    wmma::store_matrix_sync(strip + nf * 16, acc, kTcTile, wmma::mem_row_major);
  }
  __syncwarp();
}

// acc (16 x HP) += strip16 (16 x 32, bf16) times the tile's 32 rows.
template <int kChunks>
__device__ void accumulate(FragAcc (&acc)[kChunks], const Bf16* strip16, const Bf16* tile) {
  constexpr int HP = kChunks * 16;
  for (int kk = 0; kk < kTcTile / 16; ++kk) {
    FragA a;
    wmma::load_matrix_sync(a, strip16 + kk * 16, kTcTile);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      FragBRow b;
      wmma::load_matrix_sync(b, tile + kk * 16 * HP + c * 16, HP);
      wmma::mma_sync(acc[c], a, b, acc[c]);
    }
  }
}

// dst rows [row0, row0 + 16) (f32, `stride` apart; those below T, the first hs columns) set to
// (add: += ) acc * factor, through the warp's f32 strip.
template <int kChunks>
__device__ void write_rows(float* dst, size_t stride, const FragAcc (&acc)[kChunks], float* strip,
                           size_t row0, size_t T, int hs, float factor, bool add) {
  const int r = int(threadIdx.x % kWarp) / 2, half = int(threadIdx.x % 2);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    wmma::store_matrix_sync(strip, acc[c], kTcTile, wmma::mem_row_major);
    __syncwarp();
    for (int cc = 0; cc < 8; ++cc) {
      const int col = half * 8 + ((cc + r) & 7),
                d = c * 16 + col;  // (rotated: fewer bank conflicts)
      if (row0 + size_t(r) >= T || d >= hs) continue;
      float& o = dst[(row0 + size_t(r)) * stride + size_t(d)];
      const float v = strip[r * kTcTile + col] * factor;
      o = add ? o + v : v;
    }
    __syncwarp();
  }
}

// K and V rows [j0, j0 + n) of the head into the two tiles, between barriers (the last step's
// readers; this step's).
template <int kChunks>
__device__ void stage_keys_values(const TcShared<kChunks>& sh, const HeadRows& rows, size_t j0,
                                  size_t n, int hs) {
  __syncthreads();
  stage_bf16(sh.tile0, kTcTile, kChunks * 16, rows.k(0), rows.C3, j0, n, hs);
  stage_bf16(sh.tile1, kTcTile, kChunks * 16, rows.v(0), rows.C3, j0, n, hs);
  __syncthreads();
}

// This lane's 16 probabilities of query row i against keys j0 + its strip columns, from the
// scores in S: exp(s * scale - lse_i), 0 where the key is after the query or the row past T.
__device__ void row_probabilities(float (&p)[16], const float* S, const TcBlock& blk, size_t j0,
                                  size_t i, size_t T, float scale, float lse_i) {
  for (int cc = 0; cc < 16; ++cc) {
    const int col = blk.column(cc);
    const bool on = i < T && j0 + size_t(col) <= i;
    p[cc] = on ? expf(S[blk.r * kTcTile + col] * scale - lse_i) : 0.f;
  }
}

// Pass 1 of the forward: this lane's row's log-sum-exp of the scaled scores (0 for a row past T).
template <int kChunks>
__device__ float row_lse(const TcShared<kChunks>& sh, const TcBlock& blk, const FragA (&q)[kChunks],
                         const HeadRows& rows, size_t last, int hs, float scale, size_t T) {
  float* S = sh.strip(blk.warp);
  const size_t i = blk.row();
  float m = -CUDART_INF_F, l = 0.f;
  for (size_t j0 = 0; j0 <= last; j0 += kTcTile) {
    __syncthreads();
    stage_bf16(sh.tile0, kTcTile, kChunks * 16, rows.k(0), rows.C3, j0,
               min(size_t(kTcTile), last + 1 - j0), hs);
    __syncthreads();
    strip_product(S, q, sh.tile0);
    for (int cc = 0; cc < 16; ++cc) {
      const size_t j = j0 + size_t(blk.column(cc));
      if (i >= T || j > i) continue;
      const float s = S[blk.r * kTcTile + blk.column(cc)] * scale, m_new = fmaxf(m, s);
      l = l * expf(m - m_new) + expf(s - m_new);
      m = m_new;
    }
    __syncwarp();
  }
  // The row's two lanes combine theirs (a lane that saw no key has l = 0).
  const float m_o = __shfl_xor_sync(0xffffffffu, m, 1), l_o = __shfl_xor_sync(0xffffffffu, l, 1);
  const float m_row = fmaxf(m, m_o);
  const float l_row =
      (l > 0.f ? l * expf(m - m_row) : 0.f) + (l_o > 0.f ? l_o * expf(m_o - m_row) : 0.f);
  return i < T ? m_row + logf(l_row) : 0.f;
}

template <int kChunks>
__global__ void attention_forward_tc_kernel(float* out, float* lse, const float* qkv, size_t B,
                                            size_t T, size_t C, size_t NH) {
  constexpr int HP = kChunks * 16;
  __shared__ __align__(128) unsigned char smem[TcShared<kChunks>::kBytes];
  const TcShared<kChunks> sh(smem);
  const TcBlock blk(T, NH);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t i = blk.row(), last = min(T, blk.first + blk.own) - 1;
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  FragA q[kChunks];
  stage_bf16(sh.own, int(blk.own), HP, rows.q(0), 3 * C, blk.first, min(blk.own, T - blk.first),
             hs);
  __syncthreads();
  own_fragments(q, sh.own, blk.warp);
  const float lse_i = row_lse(sh, blk, q, rows, last, hs, scale, T);
  // Pass 2: out = P V with the final probabilities, rounded to bf16 for the product.
  float* S = sh.strip(blk.warp);
  Bf16* P = sh.strip16(blk.warp, 0);
  FragAcc o[kChunks];
  for (auto& f : o) wmma::fill_fragment(f, 0.f);
  for (size_t j0 = 0; j0 <= last; j0 += kTcTile) {
    stage_keys_values(sh, rows, j0, min(size_t(kTcTile), last + 1 - j0), hs);
    strip_product(S, q, sh.tile0);
    float p[16];
    row_probabilities(p, S, blk, j0, i, T, scale, lse_i);
    for (int cc = 0; cc < 16; ++cc) P[blk.r * kTcTile + blk.column(cc)] = __float2bfloat16(p[cc]);
    __syncwarp();
    accumulate(o, P, sh.tile1);
  }
  write_rows(out + blk.b * T * C + blk.h * size_t(hs), C, o, S, blk.warp_row0(), T, hs, 1.f, false);
  if (i < T && blk.half == 0) lse[(blk.b * NH + blk.h) * T + i] = lse_i;
}

// Queries i: dq_i = scale * sum_j ds_ij k_j, ds_ij = p_ij (dout_i . v_j - D_i), keys j <= i.
template <int kChunks>
__global__ void attention_backward_q_tc_kernel(float* dqkv, const float* dout, const float* qkv,
                                               const float* lse, const float* D, size_t B, size_t T,
                                               size_t C, size_t NH) {
  constexpr int HP = kChunks * 16;
  __shared__ __align__(128) unsigned char smem[TcShared<kChunks>::kBytes];
  const TcShared<kChunks> sh(smem);
  const TcBlock blk(T, NH);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t i = blk.row(), last = min(T, blk.first + blk.own) - 1;
  const size_t own_n = min(blk.own, T - blk.first);
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  FragA q[kChunks], dy[kChunks];
  stage_bf16(sh.own, int(blk.own), HP, rows.q(0), 3 * C, blk.first, own_n, hs);
  __syncthreads();
  own_fragments(q, sh.own, blk.warp);
  __syncthreads();
  stage_bf16(sh.own, int(blk.own), HP, dout + blk.b * T * C + blk.h * size_t(hs), C, blk.first,
             own_n, hs);
  __syncthreads();
  own_fragments(dy, sh.own, blk.warp);
  const size_t w = (blk.b * NH + blk.h) * T + (i < T ? i : 0);
  const float lse_i = i < T ? lse[w] : 0.f, D_i = i < T ? D[w] : 0.f;
  float* S = sh.strip(blk.warp);
  Bf16* dS = sh.strip16(blk.warp, 0);
  FragAcc dq[kChunks];
  for (auto& f : dq) wmma::fill_fragment(f, 0.f);
  for (size_t j0 = 0; j0 <= last; j0 += kTcTile) {
    stage_keys_values(sh, rows, j0, min(size_t(kTcTile), last + 1 - j0), hs);
    strip_product(S, q, sh.tile0);
    float p[16];
    row_probabilities(p, S, blk, j0, i, T, scale, lse_i);
    __syncwarp();                    // (every lane has read S)
    strip_product(S, dy, sh.tile1);  // dout . v
    for (int cc = 0; cc < 16; ++cc) {
      const int col = blk.column(cc);
      dS[blk.r * kTcTile + col] = __float2bfloat16(p[cc] * (S[blk.r * kTcTile + col] - D_i));
    }
    __syncwarp();
    accumulate(dq, dS, sh.tile0);
  }
  write_rows(dqkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C, dq, S, blk.warp_row0(), T, hs,
             scale, true);
}

// Keys j: dk_j = scale * sum_i ds_ij q_i, dv_j = sum_i p_ij dout_i over the queries i >= j.
template <int kChunks>
__global__ void attention_backward_kv_tc_kernel(float* dqkv, const float* dout, const float* qkv,
                                                const float* lse, const float* D, size_t B,
                                                size_t T, size_t C, size_t NH) {
  constexpr int HP = kChunks * 16;
  __shared__ __align__(128) unsigned char smem[TcShared<kChunks>::kBytes];
  const TcShared<kChunks> sh(smem);
  const TcBlock blk(T, NH);
  const int hs = int(C / NH);
  const float scale = 1.f / sqrtf(float(hs));
  const size_t j = blk.row(), own_n = min(blk.own, T - blk.first);
  const size_t row0 = (blk.b * NH + blk.h) * T;  // (b, h, 0) in lse and D
  const HeadRows rows{qkv + blk.b * T * 3 * C + blk.h * size_t(hs), 3 * C};
  const float* dout_head = dout + blk.b * T * C + blk.h * size_t(hs);
  FragA k[kChunks], v[kChunks];
  stage_bf16(sh.own, int(blk.own), HP, rows.k(0), 3 * C, blk.first, own_n, hs);
  __syncthreads();
  own_fragments(k, sh.own, blk.warp);
  __syncthreads();
  stage_bf16(sh.own, int(blk.own), HP, rows.v(0), 3 * C, blk.first, own_n, hs);
  __syncthreads();
  own_fragments(v, sh.own, blk.warp);
  float* S = sh.strip(blk.warp);
  Bf16 *P = sh.strip16(blk.warp, 0), *dS = sh.strip16(blk.warp, 1);
  FragAcc dk[kChunks], dv[kChunks];
  for (auto& f : dk) wmma::fill_fragment(f, 0.f);
  for (auto& f : dv) wmma::fill_fragment(f, 0.f);
  for (size_t i0 = blk.first; i0 < T; i0 += kTcTile) {  // (no query before the first key)
    const size_t n = min(size_t(kTcTile), T - i0);
    __syncthreads();
    stage_bf16(sh.tile0, kTcTile, HP, rows.q(0), 3 * C, i0, n, hs);
    stage_bf16(sh.tile1, kTcTile, HP, dout_head, C, i0, n, hs);
    for (int ii = int(threadIdx.x); ii < kTcTile; ii += int(blockDim.x)) {
      sh.lse[ii] = size_t(ii) < n ? lse[row0 + i0 + size_t(ii)] : 0.f;
      sh.D[ii] = size_t(ii) < n ? D[row0 + i0 + size_t(ii)] : 0.f;
    }
    __syncthreads();
    strip_product(S, k, sh.tile0);  // row: this key, column: a query
    float p[16];
    for (int cc = 0; cc < 16; ++cc) {
      const int col = blk.column(cc);
      const size_t qi = i0 + size_t(col);
      const bool on = j < T && qi < T && qi >= j;
      p[cc] = on ? expf(S[blk.r * kTcTile + col] * scale - sh.lse[col]) : 0.f;
      P[blk.r * kTcTile + col] = __float2bfloat16(p[cc]);
    }
    __syncwarp();                   // (every lane has read S)
    strip_product(S, v, sh.tile1);  // v . dout
    for (int cc = 0; cc < 16; ++cc) {
      const int col = blk.column(cc);
      dS[blk.r * kTcTile + col] = __float2bfloat16(p[cc] * (S[blk.r * kTcTile + col] - sh.D[col]));
    }
    __syncwarp();
    accumulate(dv, P, sh.tile1);
    accumulate(dk, dS, sh.tile0);
  }
  float* base = dqkv + blk.b * T * 3 * C + blk.h * size_t(hs);
  write_rows(base + C, 3 * C, dk, S, blk.warp_row0(), T, hs, scale, true);
  write_rows(base + 2 * C, 3 * C, dv, S, blk.warp_row0(), T, hs, 1.f, true);
}

// ---- softmax cross-entropy ------------------------------------------------------------------

struct MaxAt {
  float value;
  int index;
};

__device__ MaxAt better(MaxAt a, MaxAt b) {
  // The larger value; on a tie the first index (as the CPU's strict >).
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) return b;
  return a;
}

// One block per row: the max and its index, the sum of exponentials (in double), then the row
// overwritten with its gradient. The block-wide reductions have a fixed shape: deterministic.
__global__ void softmax_cross_entropy_kernel(float* dlogits, const float* logits, double* losses,
                                             int32_t* correct, const int32_t* targets, size_t V,
                                             double scale) {
  __shared__ MaxAt best[kThreads];
  __shared__ double sums[kThreads];
  __shared__ float target_logit;
  const float* row = logits + blockIdx.x * V;
  float* drow =
      dlogits + blockIdx.x * V;  // (may be row: each element is read before it is written)
  const int tid = threadIdx.x;
  const int target = targets[blockIdx.x];
  if (tid == 0) target_logit = row[target];
  MaxAt mine{-CUDART_INF_F, int(V)};
  for (size_t i = tid; i < V; i += blockDim.x) mine = better(mine, MaxAt{row[i], int(i)});
  best[tid] = mine;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (tid < s) best[tid] = better(best[tid], best[tid + s]);
    __syncthreads();
  }
  const float mx = best[0].value;
  double sum = 0;
  for (size_t i = tid; i < V; i += blockDim.x) sum += double(expf(row[i] - mx));
  sums[tid] = sum;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s /= 2) {
    if (tid < s) sums[tid] += sums[tid + s];
    __syncthreads();
  }
  const double total = sums[0];
  const float inv = float(1.0 / total);
  for (size_t i = tid; i < V; i += blockDim.x) {
    double d = double(expf(row[i] - mx) * inv) * scale;
    if (int(i) == target) d -= scale;
    drow[i] = float(d);
  }
  if (tid == 0) {
    losses[blockIdx.x] = -(double(target_logit) - double(mx) - log(total)) * scale;
    correct[blockIdx.x] = best[0].index == target;
  }
}

// ---- reductions -----------------------------------------------------------------------------

// One block: thread t sums x[t], x[t + blockDim], ... in order; then a fixed tree.
__global__ void sum_to_double_kernel(double* out, const double* x, size_t n) {
  __shared__ double part[kThreads];
  double s = 0;
  for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  part[threadIdx.x] = s;
  __syncthreads();
  for (int k = blockDim.x / 2; k > 0; k /= 2) {
    if (int(threadIdx.x) < k) part[threadIdx.x] += part[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0];
}

// One thread per chunk of 1024: 32 float lanes as the CPU's Compute, their float sum in lane
// order as a double.
__global__ void norm_chunks_kernel(double* chunks, const float* g, size_t n) {
  const size_t chunk = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t at = chunk * kNormChunk;
  if (at >= n) return;
  const size_t end = min(n, at + kNormChunk);
  constexpr int kLanes = 32;
  float lanes[kLanes] = {};
  size_t i = at;
  for (; i + kLanes <= end; i += kLanes)
#pragma unroll
    for (int l = 0; l < kLanes; ++l) lanes[l] += g[i + l] * g[i + l];
  for (; i < end; ++i) lanes[0] += g[i] * g[i];
  float s = 0.f;
#pragma unroll
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  chunks[chunk] = double(s);
}

// ---- optimizers -----------------------------------------------------------------------------

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, size_t n, AdamWStep s) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] * s.grad_scale;
    const float mi = s.beta1 * m[i] + (1 - s.beta1) * gi;
    const float vi = s.beta2 * v[i] + (1 - s.beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] -= s.lr * (mi * s.c1 / (sqrtf(vi * s.c2) + s.eps) + s.weight_decay * p[i]);
  }
}

__global__ void sgd_kernel(float* p, const float* g, float* m, size_t n, float lr, float mu,
                           float wd, float scale) {
  GRID_STRIDE(i, n) {
    const float gi = g[i] * scale + wd * p[i];
    m[i] = mu * m[i] + gi;
    p[i] -= lr * m[i];
  }
}

__global__ void to_bf16_kernel(uint16_t* out, const float* inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(inp[i]));
}

__global__ void from_bf16_kernel(float* out, const uint16_t* inp, size_t n) {
  GRID_STRIDE(i, n) out[i] = __bfloat162float(__ushort_as_bfloat16(inp[i]));
}

void check_head_size(size_t C, size_t NH) {
  if (NH == 0 || C % NH != 0 || C / NH > size_t(kMaxHead))
    throw std::invalid_argument("attention: C " + std::to_string(C) + " and NH " +
                                std::to_string(NH) +
                                " need a head size that divides C, at most the fused kernel's 256");
}

unsigned warps_blocks(size_t warps) {
  return unsigned((warps + kThreads / kWarp - 1) / (kThreads / kWarp));
}

// The tiled attention kernels' blocks: R lanes for each of up to kThreads / R rows, whole warps
// (a short context gets a small block, not idle warps that only keep the barriers).
unsigned head_threads(size_t T, int R) {
  const size_t wanted = (T * size_t(R) + kWarp - 1) / kWarp * kWarp;
  return unsigned(std::min<size_t>(kThreads, wanted));
}
// Their grid: per (b, h), the rows in blocks of head_threads / R.
unsigned head_blocks(size_t B, size_t T, size_t NH, int R) {
  const size_t per_block = head_threads(T, R) / size_t(R);
  return unsigned(B * NH * ((T + per_block - 1) / per_block));
}

void check_tensor_core_head(size_t hs) {
  if (hs == 0 || hs > kTensorCoreMaxHead)
    throw std::invalid_argument("attention on tensor cores: head size " + std::to_string(hs) +
                                " is not in 1.." + std::to_string(kTensorCoreMaxHead));
}

// The tensor-core kernels' template for a head of hs columns: f(integral_constant<kChunks>), the
// head in chunks of 16 (1 to kTensorCoreMaxHead / 16), found by trying each in turn.
template <int kChunks = 1, typename F>
void with_chunks(int hs, F&& f) {
  if constexpr (kChunks * 16 > int(kTensorCoreMaxHead)) {
    check_tensor_core_head(size_t(hs));
    throw std::logic_error("with_chunks: no case for head size " + std::to_string(hs));
  } else if ((hs + 15) / 16 == kChunks) {
    f(std::integral_constant<int, kChunks>());
  } else {
    with_chunks<kChunks + 1>(hs, std::forward<F>(f));
  }
}

// The tensor-core kernels' blocks: up to kTcWarps warps of 16 rows (a short context gets fewer),
// per (b, h) the rows in blocks of that many.
unsigned tc_threads(size_t T) {
  return unsigned(std::min<size_t>(kTcWarps, (T + 15) / 16) * kWarp);
}
unsigned tc_blocks(size_t B, size_t T, size_t NH) {
  const size_t own = tc_threads(T) / kWarp * 16;
  return unsigned(B * NH * ((T + own - 1) / own));
}

}  // namespace

void relu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  launch(relu_forward_kernel, blocks_for(n), stream, out, inp, n);
}

void relu_backward(float* dinp, const float* dout, const float* inp, size_t n,
                   cudaStream_t stream) {
  launch(relu_backward_kernel, blocks_for(n), stream, dinp, dout, inp, n);
}

void gelu_forward(float* out, const float* inp, size_t n, cudaStream_t stream) {
  launch(gelu_forward_kernel, blocks_for(n), stream, out, inp, n);
}

void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n,
                   cudaStream_t stream) {
  launch(gelu_backward_kernel, blocks_for(n), stream, dinp, dout, inp, n);
}

void residual_forward(float* out, const float* a, const float* b, size_t n, cudaStream_t stream) {
  launch(residual_forward_kernel, blocks_for(n), stream, out, a, b, n);
}

void residual_backward(float* da, float* db, const float* dout, size_t n, cudaStream_t stream) {
  launch(residual_backward_kernel, blocks_for(n), stream, da, db, dout, n);
}

void bias_forward(float* out, const float* bias, size_t N, size_t OC, cudaStream_t stream) {
  launch(bias_forward_kernel, blocks_for(N * OC), stream, out, bias, N, OC);
}

void bias_backward(float* dbias, const float* dout, size_t N, size_t OC, cudaStream_t stream) {
  if (N == 0 || OC == 0) return;
  const size_t groups = (N + kColumnSumRows - 1) / kColumnSumRows;
  DeviceBuffer<float> scratch(groups * OC, stream);  // (the pool's: freed in stream order)
  launch(column_sums_partial_kernel, dim3(unsigned(groups), blocks_for(OC)), stream, scratch.data(),
         dout, N, OC);
  launch(column_sums_final_kernel, blocks_for(OC), stream, dbias, scratch.data(), groups, OC, OC);
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, size_t N, size_t C, cudaStream_t stream,
                       const float* residual, float* sum) {
  if ((residual == nullptr) != (sum == nullptr))
    throw std::invalid_argument("layernorm_forward: the residual and the sum go together");
  if (N == 0) return;
  launch(layernorm_forward_kernel, warps_blocks(N), stream, out, mean, rstd, inp, weight, bias, N,
         C, residual, sum);
}

size_t layernorm_scratch(size_t N, size_t C) {
  return (N + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock * 2 * C;
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        size_t N, size_t C, float* scratch, cudaStream_t stream) {
  if (N == 0) return;
  launch(layernorm_backward_input_kernel, warps_blocks(N), stream, dinp, dout, inp, weight, mean,
         rstd, N, C);
  const size_t groups = (N + kLayerNormRowsPerBlock - 1) / kLayerNormRowsPerBlock;
  const dim3 grid(unsigned(groups), blocks_for(C));
  launch(layernorm_backward_partial_kernel, grid, stream, scratch, dout, inp, mean, rstd, N, C);
  launch(column_sums_final_kernel, blocks_for(C), stream, dweight, scratch, groups, 2 * C, C);
  launch(column_sums_final_kernel, blocks_for(C), stream, dbias, scratch + C, groups, 2 * C, C);
}

void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                       size_t B, size_t T, size_t C, cudaStream_t stream) {
  launch(embedding_forward_kernel, blocks_for(B * T * C), stream, out, tokens, wte, wpe, B, T, C);
}

TokenGroups group_tokens(const int32_t* host_tokens, size_t n) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return host_tokens[a] < host_tokens[b]; });
  TokenGroups g;
  g.positions = order;
  for (size_t k = 0; k < n; ++k) {
    if (k == 0 || host_tokens[order[k]] != host_tokens[order[k - 1]]) {
      g.tokens.push_back(host_tokens[order[k]]);
      g.offsets.push_back(int32_t(k));
    }
  }
  g.offsets.push_back(int32_t(n));
  return g;
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* group_tokens,
                        const int32_t* group_offsets, const int32_t* group_positions, size_t groups,
                        size_t B, size_t T, size_t C, cudaStream_t stream) {
  launch(embedding_backward_position_kernel, blocks_for(T * C), stream, dwpe, dout, B, T, C);
  if (groups == 0) return;
  const dim3 grid(unsigned(groups), blocks_for(C));
  launch(embedding_backward_token_kernel, grid, stream, dwte, dout, group_tokens, group_offsets,
         group_positions, C);
}

void attention_forward(float* out, float* lse, const float* qkv, size_t B, size_t T, size_t C,
                       size_t NH, cudaStream_t stream) {
  check_head_size(C, NH);
  if (B * NH * T == 0) return;
  const int R = lanes_for(int(C / NH), 32);
  launch_sized(attention_forward_kernel<32>, head_blocks(B, T, NH, R), head_threads(T, R), stream,
               out, lse, qkv, B, T, C, NH, R);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                        const float* lse, size_t B, size_t T, size_t C, size_t NH, float* scratch,
                        cudaStream_t stream) {
  check_head_size(C, NH);
  if (B * NH * T == 0) return;
  const int hs = int(C / NH), Rq = lanes_for(hs, 32), Rkv = lanes_for(hs, 16);
  launch_sized(attention_backward_dot_kernel<32>, head_blocks(B, T, NH, Rq), head_threads(T, Rq),
               stream, scratch, dout, out, B, T, C, NH, Rq);
  launch_sized(attention_backward_q_kernel<32>, head_blocks(B, T, NH, Rq), head_threads(T, Rq),
               stream, dqkv, dout, qkv, lse, scratch, B, T, C, NH, Rq);
  launch_sized(attention_backward_kv_kernel<16>, head_blocks(B, T, NH, Rkv), head_threads(T, Rkv),
               stream, dqkv, dout, qkv, lse, scratch, B, T, C, NH, Rkv);
}

void attention_forward_bf16(float* out, float* lse, const float* qkv, size_t B, size_t T, size_t C,
                            size_t NH, cudaStream_t stream) {
  check_head_size(C, NH);
  check_tensor_core_head(C / NH);
  if (B * NH * T == 0) return;
  with_chunks(int(C / NH), [&](auto chunks) {
    launch_sized(attention_forward_tc_kernel<decltype(chunks)::value>, tc_blocks(B, T, NH),
                 tc_threads(T), stream, out, lse, qkv, B, T, C, NH);
  });
}

void attention_backward_bf16(float* dqkv, const float* dout, const float* qkv, const float* out,
                             const float* lse, size_t B, size_t T, size_t C, size_t NH,
                             float* scratch, cudaStream_t stream) {
  check_head_size(C, NH);
  check_tensor_core_head(C / NH);
  if (B * NH * T == 0) return;
  const int hs = int(C / NH), R = lanes_for(hs, 32);
  launch_sized(attention_backward_dot_kernel<32>, head_blocks(B, T, NH, R), head_threads(T, R),
               stream, scratch, dout, out, B, T, C, NH, R);
  with_chunks(hs, [&](auto chunks) {
    constexpr int kChunks = decltype(chunks)::value;
    launch_sized(attention_backward_q_tc_kernel<kChunks>, tc_blocks(B, T, NH), tc_threads(T),
                 stream, dqkv, dout, qkv, lse, scratch, B, T, C, NH);
    launch_sized(attention_backward_kv_tc_kernel<kChunks>, tc_blocks(B, T, NH), tc_threads(T),
                 stream, dqkv, dout, qkv, lse, scratch, B, T, C, NH);
  });
}

void softmax_cross_entropy(float* dlogits, const float* logits, double* losses, int32_t* correct,
                           const int32_t* targets, size_t N, size_t V, double scale,
                           cudaStream_t stream) {
  if (N == 0) return;
  launch(softmax_cross_entropy_kernel, unsigned(N), stream, dlogits, logits, losses, correct,
         targets, V, scale);
}

void sum_to_double(double* out, const double* x, size_t n, cudaStream_t stream) {
  launch(sum_to_double_kernel, 1, stream, out, x, n);
}

size_t norm_scratch(size_t n) { return std::max<size_t>(1, (n + kNormChunk - 1) / kNormChunk); }

void grad_norm_sq(double* out, const float* g, size_t n, double* scratch, cudaStream_t stream) {
  const size_t chunks = (n + kNormChunk - 1) / kNormChunk;
  if (chunks > 0) {
    launch(norm_chunks_kernel, blocks_for(chunks), stream, scratch, g, n);
  }
  launch(sum_to_double_kernel, 1, stream, out, scratch, chunks);
}

void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s,
           cudaStream_t stream) {
  launch(adamw_kernel, blocks_for(n), stream, p, g, m, v, n, s);
}

void sgd(float* p, const float* g, float* m, size_t n, float lr, float momentum, float weight_decay,
         float grad_scale, cudaStream_t stream) {
  launch(sgd_kernel, blocks_for(n), stream, p, g, m, n, lr, momentum, weight_decay, grad_scale);
}

void to_bf16(uint16_t* out, const float* inp, size_t n, cudaStream_t stream) {
  launch(to_bf16_kernel, blocks_for(n), stream, out, inp, n);
}

void from_bf16(float* out, const uint16_t* inp, size_t n, cudaStream_t stream) {
  launch(from_bf16_kernel, blocks_for(n), stream, out, inp, n);
}

}  // namespace troupe::models::cuda
