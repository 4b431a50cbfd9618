// The CUDA device's Compute (models/compute.h): the kernels of models/cuda/kernels.h and the
// cuBLASLt GEMMs of gemm.h, in order on one stream of one GPU, with memory from the device's
// stream-ordered pool (runtime.h). A model moved to it (Model::to) trains on the GPU with the
// same block code as on the CPU; tests/gpu/ checks that it follows the CPU's losses.
//
// Mixed precision (GemmInput::bf16): the linear layers' GEMMs, forward and backward, read their
// operands rounded to bf16 (converted into pool memory by the forward and kept for the backward
// of the same micro-batch) and accumulate and write f32; attention runs on the tensor cores (bf16
// operands, f32 sums; heads up to 128); everything else, the master weights and the optimizer's
// moments stay f32.
//
// Thread-safety: one worker thread; to_host, from_host and allocate_host (host-staged copies) also
// from one other thread at a time (a reducer's), which they make use this GPU. It must outlive
// every tensor it allocated.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "models/compute.h"
#include "models/cuda/gemm.h"
#include "models/cuda/runtime.h"

namespace troupe::models::cuda {

class CudaCompute final : public Compute {
 public:
  // On GPU `device` (made this thread's current device). Throws CudaError when it cannot be used.
  explicit CudaCompute(int device = 0, GemmInput gemm = GemmInput::f32);
  ~CudaCompute() override;

  Device device() const override { return Device::cuda; }
  std::string describe() const override;
  Peak peak(int threads) const override;  // the GPU's, in its GEMM precision
  int ordinal() const { return device_; }
  cudaStream_t stream() const { return stream_->get(); }
  // In bf16: whether a forward GEMM's bf16 operands are kept for its backward (by default; off,
  // the backward converts them again: the same bits, checked by a test).
  void keep_bf16_operands(bool on) {
    keep_bf16_ = on;
    if (!on) kept_bf16_.clear();
  }
  uint64_t bf16_operands_reused() const { return bf16_reused_; }  // (backward GEMM operands)

  std::unique_ptr<Memory> allocate(size_t bytes) override;
  void zero(void* p, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void to_host(void* host_dst, const void* src, size_t bytes) override;
  void from_host(void* dst, const void* host_src, size_t bytes) override;
  void synchronize() override;
  std::unique_ptr<Memory> allocate_host(size_t bytes) override;  // pinned, cached
  std::string identity() const override;                         // "GPU-<uuid>"
  std::unique_ptr<Fence> fence() override;                       // an event on the stream
  void to_bf16(uint16_t* out, const float* in, size_t n) override;
  void from_bf16(float* out, const uint16_t* in, size_t n) override;

  void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                      size_t N, size_t C, size_t OC) override;
  void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, size_t N, size_t C,
                       size_t OC) override;
  void relu_forward(float* out, const float* inp, size_t n) override;
  void relu_backward(float* dinp, const float* dout, const float* inp, size_t n) override;
  void gelu_forward(float* out, const float* inp, size_t n) override;
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                         const float* weight, const float* bias, size_t N, size_t C) override;
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                          const float* inp, const float* weight, const float* mean,
                          const float* rstd, size_t N, size_t C) override;
  void embedding_forward(float* out, const int32_t* host_tokens, const float* wte, const float* wpe,
                         size_t B, size_t T, size_t C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* host_tokens,
                          size_t B, size_t T, size_t C) override;
  size_t attention_saved(size_t B, size_t T, size_t NH) const override { return B * NH * T; }
  void attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T, size_t C,
                         size_t NH) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, size_t B, size_t T, size_t C, size_t NH) override;
  double cross_entropy(float* dlogits, const float* logits, const int32_t* host_targets, size_t N,
                       size_t V, double scale, size_t* correct) override;

  double grad_norm_sq(const float* g, size_t n) override;
  void adamw(float* p, const float* g, float* m, float* v, size_t n, const AdamWStep& s) override;
  void sgd(float* p, const float* g, float* m, size_t n, float lr, float momentum,
           float weight_decay, float grad_scale) override;

 private:
  // Makes this GPU the calling thread's current device (a thread that has none would otherwise
  // get a context on GPU 0).
  void use_device() const { TROUPE_CUDA_CHECK(cudaSetDevice(device_)); }
  template <typename T>
  DeviceBuffer<T> scratch(size_t n) {
    return DeviceBuffer<T>(n, stream());
  }
  template <typename T>
  DeviceBuffer<T> upload(const T* host, size_t n);

  // bf16 and a head of at most kBf16AttentionMaxHead: attention on the tensor cores.
  bool tensor_core_attention(size_t C, size_t NH) const;
  // bf16 GEMM operands: `p`'s n floats converted now; kept after a forward GEMM for the backward
  // of the same micro-batch, which reads the same operands (the block's saved input, the
  // weight: a backward's input is its forward's, or its gradients would be wrong too); taken out
  // by that backward, converted anew where none is kept.
  DeviceBuffer<uint16_t> converted(const float* p, size_t n);
  void keep(const float* p, DeviceBuffer<uint16_t> b);
  DeviceBuffer<uint16_t> kept_or_converted(const float* p, size_t n);

  int device_;
  GemmInput gemm_input_;
  bool keep_bf16_ = true;
  uint64_t bf16_reused_ = 0;
  std::unique_ptr<Stream> stream_;
  std::unique_ptr<Gemm> gemm_;
  std::shared_ptr<class PinnedCache> pinned_;
  // (Last: freed on the stream before it goes.)
  std::map<std::pair<const float*, size_t>, DeviceBuffer<uint16_t>> kept_bf16_;
};

}  // namespace troupe::models::cuda
