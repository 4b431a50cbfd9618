// The linear layers of gemm.h as column-major GEMMs (Gemm::matmul): the layouts only, apart from
// cuBLASLt (gemm.cpp), so that the emulated device's GEMM (tests/emulation) runs them too.
#include "models/cuda/gemm.h"
#include "models/cuda/kernels.h"

namespace troupe::models::cuda {

// A row-major X(r,c) is the column-major X^T(c,r) with leading dimension c. So out^T(OC,N) =
// W(OC,C) * inp^T(C,N): W is stored as (C,OC), transposed; inp is stored as (C,N), as it is.
void Gemm::linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                          size_t N, size_t C, size_t OC) {
  Shape s{true,   false,   int(OC),         int(N), int(C),        int(C),
          int(C), int(OC), bias != nullptr, false,  GemmInput::f32};
  matmul(s, weight, inp, out, bias);
}

void Gemm::linear_forward_bf16(float* out, const uint16_t* inp, const uint16_t* weight,
                               const float* bias, size_t N, size_t C, size_t OC) {
  Shape s{true,   false,   int(OC),         int(N), int(C),         int(C),
          int(C), int(OC), bias != nullptr, false,  GemmInput::bf16};
  matmul(s, weight, inp, out, bias);
}

void Gemm::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, size_t N, size_t C, size_t OC) {
  if (dinp) {  // dinp^T(C,N) += W^T(C,OC) as stored * dout^T(OC,N) as stored
    Shape s{false,   false,  int(C), int(N), int(OC),       int(C),
            int(OC), int(C), false,  true,   GemmInput::f32};
    matmul(s, weight, dout, dinp, nullptr);
  }
  if (dweight) {  // dW^T(C,OC) += inp^T(C,N) as stored * op_T(dout^T(OC,N) as stored)
    Shape s{false,   true,   int(C), int(OC), int(N),        int(C),
            int(OC), int(C), false,  true,    GemmInput::f32};
    matmul(s, inp, dout, dweight, nullptr);
  }
  if (dbias) bias_backward(dbias, dout, N, OC, stream_);
}

void Gemm::linear_backward_bf16(float* dinp, float* dweight, const uint16_t* dout,
                                const uint16_t* inp, const uint16_t* weight, size_t N, size_t C,
                                size_t OC) {
  if (dinp) {  // as linear_backward's, on bf16 operands
    Shape s{false,   false,  int(C), int(N), int(OC),        int(C),
            int(OC), int(C), false,  true,   GemmInput::bf16};
    matmul(s, weight, dout, dinp, nullptr);
  }
  if (dweight) {
    Shape s{false,   true,   int(C), int(OC), int(N),         int(C),
            int(OC), int(C), false,  true,    GemmInput::bf16};
    matmul(s, inp, dout, dweight, nullptr);
  }
}

}  // namespace troupe::models::cuda
