#include "models/cuda/compute.h"

#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <vector>

#include "models/cuda/kernels.h"
#include "models/peak.h"

namespace troupe::models::cuda {
namespace {

// Pool memory of one CudaCompute, freed in its stream's order.
class CudaMemory final : public Memory {
 public:
  CudaMemory(size_t bytes, CudaCompute& owner)
      : Memory(pool_allocate(bytes == 0 ? 1 : bytes, owner.stream()), bytes, Device::cuda, owner),
        stream_(owner.stream()) {
    fill_zero(data_, bytes, stream_);
  }
  ~CudaMemory() override { pool_free(data_, stream_); }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  void discard() override { fill_zero(data_, bytes_, stream_); }

 private:
  cudaStream_t stream_;
};

}  // namespace

// Pinned host buffers kept by size for reuse: the staged tensors (gradient buckets, block state)
// have the same sizes every step, so after the first step nothing is allocated (cudaHostAlloc
// costs milliseconds). A buffer comes back with an event recorded on the stream when it was
// given back (a copy from pinned memory is asynchronous: the stream may still read it); whoever
// takes it next waits for that event, by then long passed, instead of the giver waiting for the
// whole stream (from the reducer thread: for the backward queued behind the copy). Thread-safe:
// the reducer thread stages too.
class PinnedCache {
 public:
  ~PinnedCache() {
    for (auto& [bytes, b] : free_) {
      settle(b.done);
      pinned_free(b.p);
    }
  }
  void* take(size_t bytes) {
    Buffer b{nullptr, nullptr};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        b = it->second;
        free_.erase(it);
      }
    }
    if (!b.p) return pinned_allocate(bytes);
    settle(b.done);
    return b.p;
  }
  // done: an event after the last use of p on a stream (null: none pending).
  void give(size_t bytes, void* p, cudaEvent_t done) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace(bytes, Buffer{p, done});
  }

 private:
  struct Buffer {
    void* p;
    cudaEvent_t done;
  };
  static void settle(cudaEvent_t done) {
    if (!done) return;
    cudaEventSynchronize(done);  // (an error here is the stream's: its next call reports it)
    cudaEventDestroy(done);
  }
  std::mutex mu_;
  std::multimap<size_t, Buffer> free_;
};

namespace {

// A pinned host buffer from the cache, given back with an event after what the stream has queued
// so far (PinnedCache): the next user waits for it.
class PinnedMemory final : public Memory {
 public:
  PinnedMemory(size_t bytes, std::shared_ptr<PinnedCache> cache, int device, cudaStream_t stream)
      : Memory(cache->take(bytes == 0 ? 1 : bytes), bytes, Device::cpu, cpu_compute()),
        cache_(std::move(cache)),
        device_(device),
        stream_(stream) {}
  ~PinnedMemory() override {
    // (Errors cannot be thrown here; the next call reports them. Without an event: wait here.)
    cudaSetDevice(device_);  // (another thread's: no context on GPU 0 made for it)
    cudaEvent_t done = nullptr;
    if (cudaEventCreateWithFlags(&done, cudaEventDisableTiming) != cudaSuccess) {
      done = nullptr;
    } else if (cudaEventRecord(done, stream_) != cudaSuccess) {
      cudaEventDestroy(done);
      done = nullptr;
    }
    if (!done) cudaStreamSynchronize(stream_);
    cache_->give(bytes_ == 0 ? 1 : bytes_, data_, done);
  }
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;
  void discard() override { std::memset(data_, 0, bytes_); }

 private:
  std::shared_ptr<PinnedCache> cache_;
  int device_;
  cudaStream_t stream_;
};

}  // namespace

CudaCompute::CudaCompute(int device, GemmInput gemm) : device_(device), gemm_input_(gemm) {
  TROUPE_CUDA_CHECK(cudaSetDevice(device));
  keep_pool_memory(device);
  stream_ = std::make_unique<Stream>();
  gemm_ = std::make_unique<Gemm>(stream_->get());
  pinned_ = std::make_shared<PinnedCache>();
}

CudaCompute::~CudaCompute() {
  // (Pending work finishes before the stream and the plans go; errors cannot be thrown here.)
  cudaStreamSynchronize(stream_->get());
}

std::string CudaCompute::describe() const {
  return "cuda:" + std::to_string(device_) + " (" + cuda::describe(device_) +
         (gemm_input_ == GemmInput::bf16 ? ", bf16 GEMM inputs)" : ")");
}

Peak CudaCompute::peak(int) const {
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device_) != cudaSuccess) return {0, describe() + ": no name"};
  return gpu_peak(p.name, gemm_input_ == GemmInput::bf16);
}

template <typename T>
DeviceBuffer<T> CudaCompute::upload(const T* host, size_t n) {
  DeviceBuffer<T> d(n, stream());
  // (From pageable memory the call returns once the host bytes are staged: `host` may go.)
  copy_to_device(d.data(), host, n * sizeof(T), stream());
  return d;
}

// ---- memory -----------------------------------------------------------------------------------

std::unique_ptr<Memory> CudaCompute::allocate(size_t bytes) {
  return std::make_unique<CudaMemory>(bytes, *this);
}
void CudaCompute::zero(void* p, size_t bytes) { fill_zero(p, bytes, stream()); }
void CudaCompute::copy(void* dst, const void* src, size_t bytes) {
  TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
}
void CudaCompute::to_host(void* host_dst, const void* src, size_t bytes) {
  use_device();
  copy_to_host(host_dst, src, bytes, stream());
  stream_->synchronize();  // (the host reads it next)
}
void CudaCompute::from_host(void* dst, const void* host_src, size_t bytes) {
  use_device();
  copy_to_device(dst, host_src, bytes, stream());
}
void CudaCompute::synchronize() { stream_->synchronize(); }

std::string CudaCompute::identity() const {
  cudaDeviceProp p{};
  TROUPE_CUDA_CHECK(cudaGetDeviceProperties(&p, device_));
  static const char* digits = "0123456789abcdef";
  std::string id = "GPU-";
  for (char c : p.uuid.bytes) {
    id += digits[(uint8_t(c) >> 4) & 15];
    id += digits[uint8_t(c) & 15];
  }
  return id;
}

namespace {

// An event recorded on the stream; queried, never waited on.
class EventFence final : public Compute::Fence {
 public:
  explicit EventFence(cudaStream_t stream) {
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    cudaError_t e = cudaEventRecord(event_, stream);
    if (e != cudaSuccess) cudaEventDestroy(event_);
    TROUPE_CUDA_CHECK(e);
  }
  ~EventFence() override { cudaEventDestroy(event_); }
  bool reached() override {
    cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    TROUPE_CUDA_CHECK(e);
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::unique_ptr<Compute::Fence> CudaCompute::fence() {
  return std::make_unique<EventFence>(stream());
}
void CudaCompute::to_bf16(uint16_t* out, const float* in, size_t n) {
  cuda::to_bf16(out, in, n, stream());
}
void CudaCompute::from_bf16(float* out, const uint16_t* in, size_t n) {
  cuda::from_bf16(out, in, n, stream());
}
std::unique_ptr<Memory> CudaCompute::allocate_host(size_t bytes) {
  use_device();
  return std::make_unique<PinnedMemory>(bytes, pinned_, device_, stream());
}

// ---- kernels ----------------------------------------------------------------------------------

void CudaCompute::linear_forward(float* out, const float* inp, const float* weight,
                                 const float* bias, size_t N, size_t C, size_t OC) {
  if (gemm_input_ == GemmInput::f32) {
    gemm_->linear_forward(out, inp, weight, bias, N, C, OC);
    return;
  }
  auto in16 = converted(inp, N * C), w16 = converted(weight, OC * C);
  gemm_->linear_forward_bf16(out, in16.data(), w16.data(), bias, N, C, OC);
  keep(inp, std::move(in16));
  keep(weight, std::move(w16));
}

void CudaCompute::linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, size_t N, size_t C,
                                  size_t OC) {
  if (gemm_input_ == GemmInput::f32) {
    gemm_->linear_backward(dinp, dweight, dbias, dout, inp, weight, N, C, OC);
    return;
  }
  // bf16 operands for both GEMMs (dout and the weight or input each reads); the bias gradient
  // sums the f32 dout.
  auto dout16 = scratch<uint16_t>(N * OC);
  cuda::to_bf16(dout16.data(), dout, N * OC, stream());
  if (dinp) {
    auto w16 = kept_or_converted(weight, OC * C);
    gemm_->linear_backward_bf16(dinp, nullptr, dout16.data(), nullptr, w16.data(), N, C, OC);
  }
  if (dweight) {
    auto in16 = kept_or_converted(inp, N * C);
    gemm_->linear_backward_bf16(nullptr, dweight, dout16.data(), in16.data(), nullptr, N, C, OC);
  }
  if (dbias) gemm_->linear_backward(nullptr, nullptr, dbias, dout, inp, weight, N, C, OC);
}

DeviceBuffer<uint16_t> CudaCompute::converted(const float* p, size_t n) {
  auto b = scratch<uint16_t>(n);
  cuda::to_bf16(b.data(), p, n, stream());
  return b;
}
void CudaCompute::keep(const float* p, DeviceBuffer<uint16_t> b) {
  if (keep_bf16_) kept_bf16_[{p, b.size()}] = std::move(b);  // (a copy of p before: replaced)
}
DeviceBuffer<uint16_t> CudaCompute::kept_or_converted(const float* p, size_t n) {
  auto it = kept_bf16_.find({p, n});
  if (it == kept_bf16_.end()) return converted(p, n);
  DeviceBuffer<uint16_t> b = std::move(it->second);
  kept_bf16_.erase(it);
  ++bf16_reused_;
  return b;
}

void CudaCompute::relu_forward(float* out, const float* inp, size_t n) {
  cuda::relu_forward(out, inp, n, stream());
}
void CudaCompute::relu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  fill_zero(dinp, n * sizeof(float), stream());  // (overwrite: the kernel accumulates)
  cuda::relu_backward(dinp, dout, inp, n, stream());
}
void CudaCompute::gelu_forward(float* out, const float* inp, size_t n) {
  cuda::gelu_forward(out, inp, n, stream());
}
void CudaCompute::gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  cuda::gelu_backward(dinp, dout, inp, n, stream());
}
void CudaCompute::residual_forward(float* out, const float* a, const float* b, size_t n) {
  cuda::residual_forward(out, a, b, n, stream());
}

void CudaCompute::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, size_t N, size_t C) {
  cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, stream());
}
void CudaCompute::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, size_t N, size_t C) {
  auto s = scratch<float>(layernorm_scratch(N, C));
  cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, s.data(),
                           stream());
}

void CudaCompute::embedding_forward(float* out, const int32_t* host_tokens, const float* wte,
                                    const float* wpe, size_t B, size_t T, size_t C) {
  auto tokens = upload(host_tokens, B * T);
  cuda::embedding_forward(out, tokens.data(), wte, wpe, B, T, C, stream());
}
void CudaCompute::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                     const int32_t* host_tokens, size_t B, size_t T, size_t C) {
  const TokenGroups g = group_tokens(host_tokens, B * T);
  auto tokens = upload(g.tokens.data(), g.tokens.size());
  auto offsets = upload(g.offsets.data(), g.offsets.size());
  auto positions = upload(g.positions.data(), g.positions.size());
  cuda::embedding_backward(dwte, dwpe, dout, tokens.data(), offsets.data(), positions.data(),
                           g.tokens.size(), B, T, C, stream());
}

// In bf16, attention on the tensor cores where the CPU's emulation of bf16 does it too.
static_assert(kBf16AttentionMaxHead == cuda::kTensorCoreMaxHead,
              "the CPU emulates the GPU's choice");
bool CudaCompute::tensor_core_attention(size_t C, size_t NH) const {
  return gemm_input_ == GemmInput::bf16 && NH > 0 && C / NH <= kBf16AttentionMaxHead;
}

void CudaCompute::attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T,
                                    size_t C, size_t NH) {
  if (tensor_core_attention(C, NH))
    cuda::attention_forward_bf16(out, saved, qkv, B, T, C, NH, stream());
  else
    cuda::attention_forward(out, saved, qkv, B, T, C, NH, stream());
}
void CudaCompute::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                     const float* out, const float* saved, size_t B, size_t T,
                                     size_t C, size_t NH) {
  auto s = scratch<float>(B * NH * T);
  if (tensor_core_attention(C, NH))
    cuda::attention_backward_bf16(dqkv, dout, qkv, out, saved, B, T, C, NH, s.data(), stream());
  else
    cuda::attention_backward(dqkv, dout, qkv, out, saved, B, T, C, NH, s.data(), stream());
}

double CudaCompute::cross_entropy(float* dlogits, const float* logits, const int32_t* host_targets,
                                  size_t N, size_t V, double scale, size_t* correct) {
  if (N == 0) return 0;
  auto targets = upload(host_targets, N);
  auto losses = scratch<double>(N);
  auto right = scratch<int32_t>(N);
  auto total = scratch<double>(1);
  softmax_cross_entropy(dlogits, logits, losses.data(), right.data(), targets.data(), N, V, scale,
                        stream());
  sum_to_double(total.data(), losses.data(), N, stream());
  double loss = 0;
  std::vector<int32_t> rows(correct ? N : 0);
  copy_to_host(&loss, total.data(), sizeof loss, stream());
  if (correct) copy_to_host(rows.data(), right.data(), N * sizeof(int32_t), stream());
  stream_->synchronize();
  if (correct) *correct += size_t(std::accumulate(rows.begin(), rows.end(), int64_t(0)));
  return loss;
}

// ---- the optimizer ----------------------------------------------------------------------------

double CudaCompute::grad_norm_sq(const float* g, size_t n) {
  if (n == 0) return 0;
  auto s = scratch<double>(norm_scratch(n));
  auto total = scratch<double>(1);
  cuda::grad_norm_sq(total.data(), g, n, s.data(), stream());
  double out = 0;
  to_host(&out, total.data(), sizeof out);
  return out;
}

void CudaCompute::adamw(float* p, const float* g, float* m, float* v, size_t n,
                        const models::AdamWStep& s) {
  cuda::adamw(p, g, m, v, n,
              {s.lr, s.beta1, s.beta2, s.eps, s.weight_decay, s.c1, s.c2, s.grad_scale}, stream());
}

void CudaCompute::sgd(float* p, const float* g, float* m, size_t n, float lr, float momentum,
                      float weight_decay, float grad_scale) {
  cuda::sgd(p, g, m, n, lr, momentum, weight_decay, grad_scale, stream());
}

}  // namespace troupe::models::cuda
