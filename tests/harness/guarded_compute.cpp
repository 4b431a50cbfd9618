#include "tests/harness/guarded_compute.h"

#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace troupe::testing {
namespace {

constexpr size_t kReservation = size_t(64) << 30;  // address space only (PROT_NONE)
constexpr size_t kPage = 4096;

models::Compute& cpu() { return models::cpu_compute(); }

}  // namespace

// An allocation: its bytes in host memory, its address in the reservation.
class GuardedMemory final : public models::Memory {
 public:
  GuardedMemory(size_t bytes, GuardedCompute& owner)
      : Memory(nullptr, bytes, models::Device::cuda, owner), owner_(owner), host_(bytes, false) {
    data_ = owner.reserve(bytes, host_.data());
  }
  ~GuardedMemory() override { owner_.release(data_); }
  void discard() override { std::memset(host_.data(), 0, bytes_); }

 private:
  GuardedCompute& owner_;
  models::HostMemory host_;
};

GuardedCompute::GuardedCompute(std::string identity)
    : identity_(std::move(identity)), reserved_(kReservation) {
  void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<char*>(p);
}

GuardedCompute::~GuardedCompute() { munmap(base_, reserved_); }

void* GuardedCompute::reserve(size_t bytes, void* host) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t span = (bytes + kPage - 1) / kPage * kPage + kPage;  // (a gap after each)
  if (used_ + span > reserved_) throw std::bad_alloc();
  void* address = base_ + used_;  // (addresses are not reused: a stale pointer still faults)
  used_ += span;
  regions_[reinterpret_cast<uintptr_t>(address)] = {bytes, host};
  return address;
}

void GuardedCompute::release(void* address) {
  std::lock_guard<std::mutex> lock(mu_);
  regions_.erase(reinterpret_cast<uintptr_t>(address));
}

void* GuardedCompute::real(const void* p) {
  if (!p) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(at);
  if (it == regions_.begin() || at >= std::prev(it)->first + std::prev(it)->second.bytes + 1) {
    std::fprintf(stderr, "guarded device: %p is not this device's memory\n", p);
    std::abort();
  }
  --it;
  return static_cast<char*>(it->second.host) + (at - it->first);
}

std::unique_ptr<models::Memory> GuardedCompute::allocate(size_t bytes) {
  return std::make_unique<GuardedMemory>(bytes, *this);
}

void GuardedCompute::zero(void* p, size_t n) {
  ++calls;
  std::memset(at(p), 0, n);
}
void GuardedCompute::copy(void* d, const void* s, size_t n) {
  ++calls;
  std::memcpy(at(d), at(s), n);
}
void GuardedCompute::to_host(void* d, const void* s, size_t n) {
  ++calls;
  std::memcpy(d, at(s), n);
}
void GuardedCompute::from_host(void* d, const void* s, size_t n) {
  ++calls;
  std::memcpy(at(d), s, n);
}

void GuardedCompute::linear_forward(float* out, const float* inp, const float* w, const float* b,
                                    size_t N, size_t C, size_t OC) {
  ++calls;
  cpu().linear_forward(at(out), at(inp), at(w), at(b), N, C, OC);
}
void GuardedCompute::linear_backward(float* dinp, float* dw, float* db, const float* dout,
                                     const float* inp, const float* w, size_t N, size_t C,
                                     size_t OC) {
  ++calls;
  cpu().linear_backward(at(dinp), at(dw), at(db), at(dout), at(inp), at(w), N, C, OC);
}
void GuardedCompute::relu_forward(float* out, const float* inp, size_t n) {
  ++calls;
  cpu().relu_forward(at(out), at(inp), n);
}
void GuardedCompute::relu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  ++calls;
  cpu().relu_backward(at(dinp), at(dout), at(inp), n);
}
void GuardedCompute::gelu_forward(float* out, const float* inp, size_t n) {
  ++calls;
  cpu().gelu_forward(at(out), at(inp), n);
}
void GuardedCompute::gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) {
  ++calls;
  cpu().gelu_backward(at(dinp), at(dout), at(inp), n);
}
void GuardedCompute::residual_forward(float* out, const float* a, const float* b, size_t n) {
  ++calls;
  cpu().residual_forward(at(out), at(a), at(b), n);
}
void GuardedCompute::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                       const float* w, const float* b, size_t N, size_t C) {
  ++calls;
  cpu().layernorm_forward(at(out), at(mean), at(rstd), at(inp), at(w), at(b), N, C);
}
void GuardedCompute::layernorm_backward(float* dinp, float* dw, float* db, const float* dout,
                                        const float* inp, const float* w, const float* mean,
                                        const float* rstd, size_t N, size_t C) {
  ++calls;
  cpu().layernorm_backward(at(dinp), at(dw), at(db), at(dout), at(inp), at(w), at(mean), at(rstd),
                           N, C);
}
void GuardedCompute::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                       const float* wpe, size_t B, size_t T, size_t C) {
  ++calls;
  cpu().embedding_forward(at(out), tokens, at(wte), at(wpe), B, T, C);  // (host tokens)
}
void GuardedCompute::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                        const int32_t* tokens, size_t B, size_t T, size_t C) {
  ++calls;
  cpu().embedding_backward(at(dwte), at(dwpe), at(dout), tokens, B, T, C);
}
size_t GuardedCompute::attention_saved(size_t B, size_t T, size_t NH) const {
  return models::cpu_compute().attention_saved(B, T, NH);
}
void GuardedCompute::attention_forward(float* out, float* saved, const float* qkv, size_t B,
                                       size_t T, size_t C, size_t NH) {
  ++calls;
  cpu().attention_forward(at(out), at(saved), at(qkv), B, T, C, NH);
}
void GuardedCompute::attention_backward(float* dqkv, const float* dout, const float* qkv,
                                        const float* out, const float* saved, size_t B, size_t T,
                                        size_t C, size_t NH) {
  ++calls;
  cpu().attention_backward(at(dqkv), at(dout), at(qkv), at(out), at(saved), B, T, C, NH);
}
double GuardedCompute::cross_entropy(float* dlogits, const float* logits, const int32_t* targets,
                                     size_t N, size_t V, double scale, size_t* correct) {
  ++calls;
  return cpu().cross_entropy(at(dlogits), at(logits), targets, N, V, scale, correct);
}
double GuardedCompute::grad_norm_sq(const float* g, size_t n) {
  ++calls;
  return cpu().grad_norm_sq(at(g), n);
}
void GuardedCompute::adamw(float* p, const float* g, float* m, float* v, size_t n,
                           const models::AdamWStep& s) {
  ++calls;
  cpu().adamw(at(p), at(g), at(m), at(v), n, s);
}
void GuardedCompute::sgd(float* p, const float* g, float* m, size_t n, float lr, float mu, float wd,
                         float scale) {
  ++calls;
  cpu().sgd(at(p), at(g), at(m), n, lr, mu, wd, scale);
}

}  // namespace troupe::testing
