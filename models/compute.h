// The kernels of one device behind one table. Blocks, models, the optimizer, clipping and block
// state call a Compute, never a device's kernels directly: the same block code trains on the CPU
// (cpu_compute(): models/kernels.h and OpenBLAS) and on a GPU (models/cuda/compute.h: the CUDA
// kernels and cuBLASLt), and a model moves between them with Model::to.
//
// A Compute belongs to one worker thread. The CPU's is stateless and shared; a CUDA one owns its
// stream, its GEMM plans and its scratch, and must outlive every tensor it allocated.
//
// Pointers are this Compute's device memory unless named host_. Calls may run asynchronously on
// the device, in call order; the ones that return a value to the host (cross_entropy,
// grad_norm_sq) and to_host wait for what they need. Backward kernels ACCUMULATE (+=) into
// gradients, as models/kernels.h, except where a comment says overwrite.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "models/tensor.h"

namespace troupe::models {

// One AdamW step's constants (models/optim.cpp): c1, c2 the bias corrections 1 / (1 - beta^t).
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay, c1, c2, grad_scale;
};

// A device's peak FLOP/s, for MFU, and what it is (models/peak.h).
// Where a peak comes from (its number travels in step reports: control.capnp StepReport).
enum class PeakSource : uint8_t { unknown = 0, cpu_estimate = 1, gpu_data_sheet = 2, given = 3 };

struct Peak {
  double flops = 0;  // per second; 0: unknown
  std::string what;  // e.g. "H200 SXM bf16 dense, data sheet: 989 TFLOP/s"
  PeakSource source = PeakSource::unknown;
};

class Compute {
 public:
  virtual ~Compute() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;  // "cpu", "cuda:0 (NVIDIA H200, ...)"
  // What the device can do at most with `threads` compute threads (the CPU's), for MFU
  // (models/peak.h); unknown by default.
  virtual Peak peak(int threads) const {
    (void)threads;
    return {0, describe() + ": no known peak"};
  }

  // ---- memory -------------------------------------------------------------------------------
  // `bytes` of zeros on this device.
  virtual std::unique_ptr<Memory> allocate(size_t bytes) = 0;
  virtual void zero(void* p, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // within this device
  virtual void to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void from_host(void* dst, const void* host_src, size_t bytes) = 0;
  // Waits until every call made so far has finished.
  virtual void synchronize() = 0;
  // Host memory for this device's copies to and from the host (HostStaged: collectives, state
  // transfer, backups, checkpoints), not zeroed. A CUDA device's is pinned (page-locked: the
  // copies are DMA at full speed, not staged through the driver's buffers) and cached by size;
  // by default plain host memory. Its device() is cpu and its compute() cpu_compute().
  virtual std::unique_ptr<Memory> allocate_host(size_t bytes);

  // ---- for a data plane that reads device memory directly (workers/device_plane.h) ----------
  // Which physical device this is, the same in every process that computes on it
  // ("GPU-<uuid>"): members that share one cannot each be an NCCL rank. Empty for the CPU.
  virtual std::string identity() const { return ""; }
  // A mark after every call made so far: reached() once all of them have finished; it never
  // blocks, so another thread (a reducer) polls it against its own deadline before it hands
  // device memory written by those calls to a collective on another stream.
  class Fence {
   public:
    virtual ~Fence() = default;
    virtual bool reached() = 0;
  };
  // By default synchronize(), then a fence already reached.
  virtual std::unique_ptr<Fence> fence();
  // n floats to bf16 (their bits; to nearest, ties to even) and back, within this device's
  // memory (parallel.reduce_dtype = "bf16": gradients reduced in bf16). By default in host
  // memory: a device's Compute overrides them.
  virtual void to_bf16(uint16_t* out, const float* in, size_t n);
  virtual void from_bf16(float* out, const uint16_t* in, size_t n);

  // A tensor of zeros on this device.
  Tensor tensor(std::vector<size_t> shape);
  // `t` on this device: itself when it is there already, else a copy (from host memory, or to
  // it from the device `t` is on).
  Tensor on_device(const Tensor& t);
  // Moves the storage `t` views (and so every view of it) to this device, in place.
  void move_storage(Tensor& t);

  // ---- kernels (float), in models/kernels.h's legend: B, T, C, OC, NH, V; row-major ---------
  virtual void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                              size_t N, size_t C, size_t OC) = 0;
  // dinp (may be null), dweight, dbias (may be null) accumulate.
  virtual void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, size_t N, size_t C,
                               size_t OC) = 0;
  virtual void relu_forward(float* out, const float* inp, size_t n) = 0;
  // Overwrites: dinp = dout where inp > 0, else 0.
  virtual void relu_backward(float* dinp, const float* dout, const float* inp, size_t n) = 0;
  virtual void gelu_forward(float* out, const float* inp, size_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) = 0;
  virtual void residual_forward(float* out, const float* a, const float* b, size_t n) = 0;
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, size_t N, size_t C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, size_t N, size_t C) = 0;
  // The tokens are on the host (checked against the vocabulary there: Block code).
  virtual void embedding_forward(float* out, const int32_t* host_tokens, const float* wte,
                                 const float* wpe, size_t B, size_t T, size_t C) = 0;
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* host_tokens, size_t B, size_t T, size_t C) = 0;
  // Causal attention keeps attention_saved(B, T, NH) floats from forward for backward (the CPU:
  // the probabilities; a fused kernel: each row's log-sum-exp). backward reads forward's out.
  virtual size_t attention_saved(size_t B, size_t T, size_t NH) const = 0;
  virtual void attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T,
                                 size_t C, size_t NH) = 0;
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv,
                                  const float* out, const float* saved, size_t B, size_t T,
                                  size_t C, size_t NH) = 0;
  // Softmax cross-entropy with host targets: overwrites dlogits; returns the sum of the rows'
  // losses times `scale`; *correct (if given) the rows whose argmax is their target.
  virtual double cross_entropy(float* dlogits, const float* logits, const int32_t* host_targets,
                               size_t N, size_t V, double scale, size_t* correct) = 0;

  // ---- the optimizer ------------------------------------------------------------------------
  // Sum of squares of g, in float per chunk of 1024 and in double over chunks.
  virtual double grad_norm_sq(const float* g, size_t n) = 0;
  virtual void adamw(float* p, const float* g, float* m, float* v, size_t n,
                     const AdamWStep& s) = 0;
  virtual void sgd(float* p, const float* g, float* m, size_t n, float lr, float momentum,
                   float weight_decay, float grad_scale) = 0;
};

// The CPU's Compute (one for the process; stateless).
Compute& cpu_compute();
// The CPU's Compute for model.dtype = "bf16", emulating the CUDA device's mixed precision: each
// linear layer's GEMMs read their operands rounded to bf16 (to nearest, ties to even: forward
// input and weight; backward output gradient, weight, input) and sum the products in f32; so
// does attention with a head of at most kBf16AttentionMaxHead (the CUDA device's runs on tensor
// cores: q, k, v, dout, the probabilities and their gradient rounded where a product reads
// them; kernels::attention_forward_bf16); everything else (activations kept, the softmax, the
// bias gradient, master weights, optimizer moments) is f32 as cpu_compute()'s. Its tensors are
// host memory.
Compute& cpu_bf16_compute();
// In bf16, attention with a head size up to this runs on bf16 operands (above it, in f32).
constexpr size_t kBf16AttentionMaxHead = 128;
// x rounded to the nearest bf16, as a float (NaN stays NaN).
float bf16_round(float x);

}  // namespace troupe::models
