#include "models/cuda/gemm.h"

#include <cublasLt.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "models/cuda/kernels.h"

namespace troupe::models::cuda {
namespace {

void check(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("cuBLASLt: ") + what +
                             " failed: " + cublasLtGetStatusName(status) + " (" +
                             cublasLtGetStatusString(status) + ")");
}

cublasLtHandle_t lt(void* h) { return static_cast<cublasLtHandle_t>(h); }

int alignment(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && at % uintptr_t(a) != 0) a /= 2;
  return a;
}

}  // namespace

struct Gemm::Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool found = false;  // (false: the heuristic had nothing for the shape)
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Gemm::Gemm(cudaStream_t stream, size_t workspace_bytes)
    : stream_(stream), workspace_(workspace_bytes, stream) {
  cublasLtHandle_t h = nullptr;
  check(cublasLtCreate(&h), "cublasLtCreate");
  handle_ = h;
}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(lt(handle_));
}

Gemm::Plan* Gemm::plan_for(const Shape& s, const float* bias) {
  auto& slot = plans_[s.key()];
  if (slot) return slot->found ? slot.get() : nullptr;
  auto p = std::make_unique<Plan>();
  check(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
  const cublasOperation_t ta = s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
        "TRANSA");
  check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
        "TRANSB");
  if (s.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                         sizeof(epilogue)),
          "EPILOGUE");
    const cudaDataType_t bias_type = CUDA_R_32F;
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                         sizeof(bias_type)),
          "BIAS_DATA_TYPE");
    // (The heuristic reads the bias pointer's alignment from its value.)
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "BIAS_POINTER");
  }
  const cudaDataType_t in = s.input == GemmInput::bf16 ? CUDA_R_16BF : CUDA_R_32F;
  // Column-major layouts of the stored matrices: op(A) is (m,k), so A is (k,m) when transposed.
  check(cublasLtMatrixLayoutCreate(&p->a, in, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda),
        "layout A");
  check(cublasLtMatrixLayoutCreate(&p->b, in, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb),
        "layout B");
  check(cublasLtMatrixLayoutCreate(&p->d, CUDA_R_32F, s.m, s.n, s.ldd), "layout D");
  cublasLtMatmulPreference_t pref = nullptr;
  check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
  const size_t ws = workspace_.bytes();
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                       sizeof(ws));
  const uint32_t aligns[4] = {uint32_t(s.align_a), uint32_t(s.align_b), uint32_t(s.align_d),
                              uint32_t(s.align_d)};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i)
    cublasLtMatmulPreferenceSetAttribute(pref, which[i], &aligns[i], sizeof(aligns[i]));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt(handle_), p->op, p->a, p->b, p->d,
                                                           p->d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  // (NOT_SUPPORTED is how the heuristic says "none" for some shapes, e.g. a bias epilogue on a
  // one-row output.)
  if (st != CUBLAS_STATUS_NOT_SUPPORTED) check(st, "AlgoGetHeuristic");
  p->found = st == CUBLAS_STATUS_SUCCESS && found > 0;
  p->algo = result.algo;
  slot = std::move(p);
  return slot->found ? slot.get() : nullptr;
}

// No bf16 algorithm for these operands (leading dimensions or offsets that leave them 2-byte
// aligned): the same products in f32 (bf16 widens exactly; f32 compute, no TF32), from copies.
void Gemm::matmul_widened(const Shape& shape, const void* A, const void* B, float* D,
                          const float* bias) {
  auto stored = [](bool trans, int rows, int cols, int ld) {  // the elements a layout spans
    const size_t r = size_t(trans ? cols : rows), c = size_t(trans ? rows : cols);
    return (c - 1) * size_t(ld) + r;
  };
  const size_t a = stored(shape.trans_a, shape.m, shape.k, shape.lda);
  const size_t b = stored(shape.trans_b, shape.k, shape.n, shape.ldb);
  DeviceBuffer<float> wa(a, stream_), wb(b, stream_);  // (freed in stream order, after the GEMM)
  from_bf16(wa.data(), static_cast<const uint16_t*>(A), a, stream_);
  from_bf16(wb.data(), static_cast<const uint16_t*>(B), b, stream_);
  Shape f = shape;
  f.input = GemmInput::f32;
  matmul(f, wa.data(), wb.data(), D, bias);
}

void Gemm::matmul(const Shape& shape, const void* A, const void* B, float* D, const float* bias) {
  if (shape.m == 0 || shape.n == 0) return;
  if (shape.k == 0) {  // an empty sum: D = beta * D (+ bias, which no caller passes with k = 0)
    if (!shape.accumulate) fill_zero(D, size_t(shape.m) * size_t(shape.n) * sizeof(float), stream_);
    return;
  }
  Shape s = shape;
  s.align_a = alignment(A);
  s.align_b = alignment(B);
  s.align_d = alignment(D);
  s.align_bias = s.bias ? alignment(bias) : 256;
  Plan* p = plan_for(s, bias);
  bool bias_after = false;
  if (!p && s.bias && s.ldd == s.m) {  // no epilogue algorithm: the GEMM, then the bias kernel
    s.bias = false;
    s.align_bias = 256;
    p = plan_for(s, nullptr);
    bias_after = true;
  }
  if (!p && s.input == GemmInput::bf16) {
    matmul_widened(shape, A, B, D, bias);  // (shape: with its bias, which may take the epilogue)
    return;
  }
  if (!p)
    throw std::runtime_error("cuBLASLt: no algorithm for a " + std::to_string(s.m) + "x" +
                             std::to_string(s.n) + "x" + std::to_string(s.k) + " GEMM");
  if (s.bias)
    check(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                         sizeof(bias)),
          "BIAS_POINTER");
  const float alpha = 1.f, beta = s.accumulate ? 1.f : 0.f;
  check(cublasLtMatmul(lt(handle_), p->op, &alpha, A, p->a, B, p->b, &beta, D, p->d, D, p->d,
                       &p->algo, workspace_.data(), workspace_.bytes(), stream_),
        "Matmul");
  // (D is m columns of n rows, row-major (n, m): the bias runs along m, as bias_forward's OC.)
  if (bias_after) bias_forward(D, bias, size_t(s.n), size_t(s.m), stream_);
}

}  // namespace troupe::models::cuda
