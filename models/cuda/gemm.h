// GEMMs on the CUDA device through cuBLASLt: the linear layers of models/kernels.h (row-major,
// weight (OC, C)), in f32 (f32 compute: no TF32, so a test can hold them to 1e-5 of the CPU) or
// with bf16 inputs and f32 accumulation and output (mixed precision). The bias is added in the
// GEMM's epilogue, or by a kernel after it for a shape cuBLASLt has no epilogue algorithm for.
//
// A Gemm belongs to one stream (one worker): it owns a cuBLASLt handle, a workspace, and the
// descriptors and algorithm chosen for each shape it has seen (the heuristic runs once a shape).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "models/cuda/runtime.h"

namespace troupe::models::cuda {

enum class GemmInput : uint8_t { f32, bf16 };

class Gemm {
 public:
  explicit Gemm(cudaStream_t stream, size_t workspace_bytes = size_t(32) << 20);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // out(N,OC) = inp(N,C) @ weight(OC,C)^T + bias(OC)   (bias may be null)
  void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                      size_t N, size_t C, size_t OC);
  // The same with inp and weight in bf16 (their bits as uint16_t); out and bias stay f32.
  void linear_forward_bf16(float* out, const uint16_t* inp, const uint16_t* weight,
                           const float* bias, size_t N, size_t C, size_t OC);
  // dinp(N,C) += dout @ weight; dweight(OC,C) += dout^T @ inp; dbias(OC) += column sums of dout
  // (any of the three may be null).
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, size_t N, size_t C, size_t OC);

  // The two GEMMs of linear_backward with bf16 operands (dout, and inp or weight: null where its
  // gradient is not wanted); dinp and dweight f32, accumulated.
  void linear_backward_bf16(float* dinp, float* dweight, const uint16_t* dout, const uint16_t* inp,
                            const uint16_t* weight, size_t N, size_t C, size_t OC);
  // The column-major core: D(m,n) = op(A)(m,k) op(B)(k,n) + beta * D [+ bias(m) per column].
  struct Shape {
    bool trans_a, trans_b;
    int m, n, k, lda, ldb, ldd;
    bool bias;
    bool accumulate;  // beta 1 (else 0)
    GemmInput input;
    // The pointers' alignments (bytes, at most 256), set by matmul: an algorithm chosen for
    // aligned buffers may fault on a view at an odd offset, so they are part of the plan's key.
    int align_a = 256, align_b = 256, align_d = 256, align_bias = 256;
    using Key = std::tuple<bool, bool, int, int, int, int, int, int, bool, bool, GemmInput, int,
                           int, int, int>;
    Key key() const {
      return Key(trans_a, trans_b, m, n, k, lda, ldb, ldd, bias, accumulate, input, align_a,
                 align_b, align_d, align_bias);
    }
  };
  void matmul(const Shape& s, const void* A, const void* B, float* D, const float* bias);

 private:
  struct Plan;
  // The shape's plan (made once), or null when cuBLASLt has no algorithm for it (remembered too).
  Plan* plan_for(const Shape& s, const float* bias);
  // A bf16 product cuBLASLt has no algorithm for, in f32 on widened copies of A and B.
  void matmul_widened(const Shape& s, const void* A, const void* B, float* D, const float* bias);

  cudaStream_t stream_;
  void* handle_ = nullptr;  // cublasLtHandle_t
  DeviceBuffer<char> workspace_;
  std::map<Shape::Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace troupe::models::cuda
