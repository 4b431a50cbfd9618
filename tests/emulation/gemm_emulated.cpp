// Gemm (models/cuda/gemm.h) on the emulated device: the same column-major products through the
// CPU's BLAS in f32 (bf16 operands widened first: exact), where the real one calls cuBLASLt.
#include <cblas.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "models/compute.h"
#include "models/cuda/gemm.h"

namespace troupe::models::cuda {

struct Gemm::Plan {};

Gemm::Gemm(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace_bytes, stream) {}
Gemm::~Gemm() = default;

namespace {

// A stored operand (rows x cols, leading dimension ld) as f32: itself, or bf16 widened (exactly)
// by the CPU's conversion into `widened`.
const float* as_f32(const void* p, GemmInput input, size_t rows, size_t cols, size_t ld,
                    std::vector<float>* widened) {
  if (input == GemmInput::f32) return static_cast<const float*>(p);
  widened->resize((cols - 1) * ld + rows);
  cpu_compute().from_bf16(widened->data(), static_cast<const uint16_t*>(p), widened->size());
  return widened->data();
}

}  // namespace

void Gemm::matmul(const Shape& s, const void* A, const void* B, float* D, const float* bias) {
  if (s.m == 0 || s.n == 0) return;
  const float beta = s.accumulate ? 1.f : 0.f;
  if (s.k == 0) {
    if (!s.accumulate)
      for (int c = 0; c < s.n; ++c) std::memset(D + size_t(c) * s.ldd, 0, size_t(s.m) * 4);
  } else {
    std::vector<float> wa, wb;
    const float* a = as_f32(A, s.input, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda, &wa);
    const float* b = as_f32(B, s.input, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb, &wb);
    cblas_sgemm(CblasColMajor, s.trans_a ? CblasTrans : CblasNoTrans,
                s.trans_b ? CblasTrans : CblasNoTrans, s.m, s.n, s.k, 1.f, a, s.lda, b, s.ldb, beta,
                D, s.ldd);
  }
  if (s.bias)
    for (int c = 0; c < s.n; ++c)
      for (int r = 0; r < s.m; ++r) D[size_t(c) * s.ldd + r] += bias[r];
}

}  // namespace troupe::models::cuda
