#include "models/compute.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "models/kernels.h"
#include "models/peak.h"

namespace troupe::models {

// ---- host memory ------------------------------------------------------------------------------

namespace {

size_t rounded_bytes(size_t bytes) {
  size_t r = ((bytes + 63) / 64) * 64;
  if (r == 0) r = 64;
  if (r >= 2 * HostMemory::kHugePage)
    r = (r + HostMemory::kHugePage - 1) / HostMemory::kHugePage * HostMemory::kHugePage;
  return r;
}

}  // namespace

HostMemory::HostMemory(size_t bytes, bool lazy, Compute* owner)
    : Memory(nullptr, bytes, Device::cpu, owner ? *owner : cpu_compute()),
      rounded_(rounded_bytes(bytes)) {
  const bool huge = rounded_ >= 2 * kHugePage;
  if (lazy) {
    // (mmap's address is page-aligned; huge pages need 2 MiB alignment: map a little more.)
    const size_t extra = huge ? kHugePage : 0;
    void* p =
        mmap(nullptr, rounded_ + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    map_ = p;
    map_bytes_ = rounded_ + extra;
    auto at = reinterpret_cast<uintptr_t>(p);
    if (huge) at = (at + kHugePage - 1) / kHugePage * kHugePage;
    data_ = reinterpret_cast<void*>(at);
    if (huge) madvise(data_, rounded_, MADV_HUGEPAGE);
    return;
  }
  data_ = std::aligned_alloc(huge ? kHugePage : 64, rounded_);
  if (!data_) throw std::bad_alloc();
  if (huge) madvise(data_, rounded_, MADV_HUGEPAGE);  // advice: fine if it is not taken
  std::memset(data_, 0, rounded_);
}

HostMemory::~HostMemory() {
  if (map_)
    munmap(map_, map_bytes_);
  else
    std::free(data_);
}

void HostMemory::discard() {
  if (map_)
    madvise(data_, rounded_, MADV_DONTNEED);  // private anonymous: zeros on the next touch
  else
    std::memset(data_, 0, rounded_);
}

// ---- what every Compute does the same way -----------------------------------------------------

std::unique_ptr<Compute::Fence> Compute::fence() {
  struct Reached final : Fence {
    bool reached() override { return true; }
  };
  synchronize();
  return std::make_unique<Reached>();
}

void Compute::to_bf16(uint16_t* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const float r = bf16_round(in[i]);
    uint32_t u;
    std::memcpy(&u, &r, sizeof u);
    out[i] = uint16_t(u >> 16);
  }
}

void Compute::from_bf16(float* out, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t u = uint32_t(in[i]) << 16;
    std::memcpy(&out[i], &u, sizeof u);
  }
}

std::unique_ptr<Memory> Compute::allocate_host(size_t bytes) {
  return std::make_unique<HostMemory>(bytes, false);
}

Tensor Compute::tensor(std::vector<size_t> shape) {
  size_t n = 1;
  for (size_t d : shape) n *= d;
  return Tensor(std::move(shape), std::make_shared<Storage>(allocate(n * sizeof(float))));
}

Tensor Compute::on_device(const Tensor& t) {
  if (!t.defined() || &t.storage()->compute() == this) return t;
  Tensor out = tensor(t.shape());
  Compute& from = t.storage()->compute();
  if (from.device() == Device::cpu) {
    from_host(out.data(), t.data(), t.bytes());
  } else if (device() == Device::cpu) {
    from.to_host(out.data(), t.data(), t.bytes());
  } else {
    Tensor host(t.shape());
    from.to_host(host.data(), t.data(), t.bytes());
    from_host(out.data(), host.data(), t.bytes());
  }
  return out;
}

void Compute::move_storage(Tensor& t) {
  if (!t.defined() || &t.storage()->compute() == this) return;
  Storage& s = *t.storage();
  std::unique_ptr<Memory> to = allocate(s.bytes());
  Compute& from = s.compute();
  if (from.device() == Device::cpu) {
    from_host(to->data(), s.data(), s.bytes());
  } else if (device() == Device::cpu) {
    from.to_host(to->data(), s.data(), s.bytes());
  } else {
    std::vector<uint8_t> host(s.bytes());
    from.to_host(host.data(), s.data(), s.bytes());
    from_host(to->data(), host.data(), s.bytes());
  }
  s.replace(std::move(to));
}

// ---- the CPU ----------------------------------------------------------------------------------

namespace {
namespace k = kernels;

// x rounded to the nearest bf16 (ties to even), as a float: what a bf16 GEMM input holds. NaN
// stays NaN (quiet); infinities and values rounding past the largest bf16 become infinities.
float round_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    u |= 0x00400000u;  // NaN: keep it (and quiet), whatever the low bits
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);
  }
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}

void round_into(std::vector<float>& out, const float* in, size_t n) {
  out.resize(n);
  for (size_t i = 0; i < n; ++i) out[i] = round_to_bf16(in[i]);
}

class CpuCompute final : public Compute {
 public:
  explicit CpuCompute(bool bf16) : bf16_(bf16) {}
  Device device() const override { return Device::cpu; }
  std::string describe() const override {
    return bf16_ ? "cpu (bf16 GEMM inputs, emulated)" : "cpu";
  }
  Peak peak(int threads) const override {  // (the GEMMs run in f32 either way)
    static const CpuModel cpu = this_cpu();
    return cpu_peak(cpu, threads);
  }

  std::unique_ptr<Memory> allocate(size_t bytes) override {
    return std::make_unique<HostMemory>(bytes, false, this);
  }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void from_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void synchronize() override {}

  void linear_forward(float* out, const float* inp, const float* w, const float* bias, size_t N,
                      size_t C, size_t OC) override {
    if (!bf16_) {
      k::linear_forward(out, inp, w, bias, N, C, OC);
      return;
    }
    // Mixed precision as the CUDA device computes it: input and weight rounded to bf16, the
    // products (exact in f32) summed in f32. (Per worker thread: the CPU Compute is shared.)
    thread_local std::vector<float> inp16, w16;
    round_into(inp16, inp, N * C);
    round_into(w16, w, OC * C);
    k::linear_forward(out, inp16.data(), w16.data(), bias, N, C, OC);
  }
  void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                       const float* w, size_t N, size_t C, size_t OC) override {
    if (!bf16_) {
      k::linear_backward(dinp, dw, dbias, dout, inp, w, N, C, OC);
      return;
    }
    // The backward GEMMs read bf16 operands too (dout, and the input or weight each needs);
    // the bias gradient sums the f32 dout.
    thread_local std::vector<float> dout16, inp16, w16;
    round_into(dout16, dout, N * OC);
    round_into(inp16, inp, N * C);
    if (dinp) round_into(w16, w, OC * C);
    k::linear_backward(dinp, dw, static_cast<float*>(nullptr), dout16.data(), inp16.data(),
                       dinp ? w16.data() : w, N, C, OC);
    for (size_t n = 0; dbias && n < N; ++n)
      for (size_t o = 0; o < OC; ++o) dbias[o] += dout[n * OC + o];
  }
  void relu_forward(float* out, const float* inp, size_t n) override {
    k::relu_forward(out, inp, n);
  }
  void relu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    for (size_t i = 0; i < n; ++i) dinp[i] = inp[i] > 0.0f ? dout[i] : 0.0f;
  }
  void gelu_forward(float* out, const float* inp, size_t n) override {
    k::gelu_forward(out, inp, n);
  }
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override {
    k::gelu_backward(dinp, dout, inp, n);
  }
  void residual_forward(float* out, const float* a, const float* b, size_t n) override {
    k::residual_forward(out, a, b, n);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, size_t N, size_t C) override {
    k::layernorm_forward(out, mean, rstd, inp, w, b, N, C);
  }
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, size_t N,
                          size_t C) override {
    k::layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
  }
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         size_t B, size_t T, size_t C) override {
    k::embedding_forward(out, tokens, wte, wpe, B, T, C);
  }
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          size_t B, size_t T, size_t C) override {
    k::embedding_backward(dwte, dwpe, dout, tokens, B, T, C);
  }
  size_t attention_saved(size_t B, size_t T, size_t NH) const override { return B * NH * T * T; }
  void attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T, size_t C,
                         size_t NH) override {
    if (bf16_attention(C, NH))
      k::attention_forward_bf16(out, saved, qkv, B, T, C, NH);
    else
      k::attention_forward(out, saved, qkv, B, T, C, NH);
  }
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, size_t B, size_t T, size_t C, size_t NH) override {
    if (bf16_attention(C, NH))
      k::attention_backward_bf16(dqkv, dout, qkv, out, saved, B, T, C, NH);
    else
      k::attention_backward(dqkv, dout, qkv, saved, B, T, C, NH);
  }
  double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, size_t N,
                       size_t V, double scale, size_t* correct) override {
    return k::softmax_cross_entropy(dlogits, logits, targets, N, V, scale, correct);
  }

  double grad_norm_sq(const float* g, size_t n) override {
    // Float partial sums over chunks, added in double: the result does not depend on the
    // thread count or the machine, only on the data. 32 lanes are four independent vector
    // accumulators: one would wait on its own addition's latency every step (13.6 GB/s).
    constexpr size_t kLanes = 32, kChunk = 1024;
    double total = 0;
    for (size_t at = 0; at < n; at += kChunk) {
      const size_t end = std::min(n, at + kChunk);
      float lanes[kLanes] = {};
      size_t i = at;
      for (; i + kLanes <= end; i += kLanes)
        for (size_t l = 0; l < kLanes; ++l) lanes[l] += g[i + l] * g[i + l];
      for (; i < end; ++i) lanes[0] += g[i] * g[i];
      float s = 0;
      for (float v : lanes) s += v;
      total += s;
    }
    return total;
  }
  void adamw(float* p, const float* g, float* m, float* v, size_t n,
             const AdamWStep& step) override {
    const AdamWStep s = step;  // (a copy: the stores below cannot alias it, so the loop vectorises)
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * s.grad_scale;
      m[i] = s.beta1 * m[i] + (1 - s.beta1) * gi;
      v[i] = s.beta2 * v[i] + (1 - s.beta2) * gi * gi;
      const float mhat = m[i] * s.c1, vhat = v[i] * s.c2;
      p[i] -= s.lr * (mhat / (std::sqrt(vhat) + s.eps) + s.weight_decay * p[i]);
    }
  }
  void sgd(float* p, const float* g, float* m, size_t n, float lr, float mu, float wd,
           float scale) override {
    for (size_t i = 0; i < n; ++i) {
      const float gi = g[i] * scale + wd * p[i];
      m[i] = mu * m[i] + gi;
      p[i] -= lr * m[i];
    }
  }

 private:
  bool bf16_attention(size_t C, size_t NH) const {
    return bf16_ && NH > 0 && C / NH <= kBf16AttentionMaxHead;
  }

  const bool bf16_;  // model.dtype = "bf16": linear_forward rounds its operands
};

}  // namespace

Compute& cpu_compute() {
  static CpuCompute cpu(false);
  return cpu;
}

Compute& cpu_bf16_compute() {
  static CpuCompute cpu(true);
  return cpu;
}

float bf16_round(float x) { return round_to_bf16(x); }

}  // namespace troupe::models
