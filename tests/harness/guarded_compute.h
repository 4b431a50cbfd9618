// A stand-in device for tests without a GPU. GuardedCompute runs the CPU's kernels, but the
// addresses its memory has are, like a GPU's, not the host's to dereference: each allocation gets
// an address inside a PROT_NONE reservation (reading or writing it faults), and its bytes live in
// host memory only the Compute finds, translating every pointer it is called with. Any code that
// touches a tensor on this device other than through its Compute crashes. Models trained on it
// compute what they compute on the CPU, bit for bit; workers on it (TROUPE_TEST_GUARDED_DEVICE in
// the troupe_test binary) take every host-staged path a GPU worker takes.
//
// Thread-safety: one thread (a worker's), as any Compute.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "models/compute.h"

namespace troupe::testing {

class GuardedCompute final : public models::Compute {
 public:
  // `identity`: which "physical device" it is (Compute::identity): workers whose stand-ins
  // share one are host-staged, as members sharing a GPU are.
  explicit GuardedCompute(std::string identity = "guarded");
  ~GuardedCompute() override;
  GuardedCompute(const GuardedCompute&) = delete;
  GuardedCompute& operator=(const GuardedCompute&) = delete;

  models::Device device() const override { return models::Device::cuda; }  // (not the CPU)
  std::string describe() const override { return "guarded host memory"; }
  std::string identity() const override { return identity_; }
  size_t calls = 0;  // kernel and copy calls made

  std::unique_ptr<models::Memory> allocate(size_t bytes) override;
  void zero(void* p, size_t n) override;
  void copy(void* dst, const void* src, size_t n) override;
  void to_host(void* host_dst, const void* src, size_t n) override;
  void from_host(void* dst, const void* host_src, size_t n) override;
  void synchronize() override {}
  void to_bf16(uint16_t* out, const float* in, size_t n) override {
    ++calls;
    Compute::to_bf16(at(out), at(in), n);
  }
  void from_bf16(float* out, const uint16_t* in, size_t n) override {
    ++calls;
    Compute::from_bf16(at(out), at(in), n);
  }
  // (Plain host memory, counted: what a CUDA device would pin.)
  std::unique_ptr<models::Memory> allocate_host(size_t bytes) override {
    ++host_buffers;
    return Compute::allocate_host(bytes);
  }
  size_t host_buffers = 0;

  void linear_forward(float* out, const float* inp, const float* w, const float* b, size_t N,
                      size_t C, size_t OC) override;
  void linear_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                       const float* w, size_t N, size_t C, size_t OC) override;
  void relu_forward(float* out, const float* inp, size_t n) override;
  void relu_backward(float* dinp, const float* dout, const float* inp, size_t n) override;
  void gelu_forward(float* out, const float* inp, size_t n) override;
  void gelu_backward(float* dinp, const float* dout, const float* inp, size_t n) override;
  void residual_forward(float* out, const float* a, const float* b, size_t n) override;
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                         const float* b, size_t N, size_t C) override;
  void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                          const float* w, const float* mean, const float* rstd, size_t N,
                          size_t C) override;
  void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                         size_t B, size_t T, size_t C) override;
  void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                          size_t B, size_t T, size_t C) override;
  size_t attention_saved(size_t B, size_t T, size_t NH) const override;
  void attention_forward(float* out, float* saved, const float* qkv, size_t B, size_t T, size_t C,
                         size_t NH) override;
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                          const float* saved, size_t B, size_t T, size_t C, size_t NH) override;
  double cross_entropy(float* dlogits, const float* logits, const int32_t* targets, size_t N,
                       size_t V, double scale, size_t* correct) override;
  double grad_norm_sq(const float* g, size_t n) override;
  void adamw(float* p, const float* g, float* m, float* v, size_t n,
             const models::AdamWStep& s) override;
  void sgd(float* p, const float* g, float* m, size_t n, float lr, float mu, float wd,
           float scale) override;

  // Where the bytes at device address p are (null stays null); aborts on an address this
  // device never gave out.
  void* real(const void* p);
  template <typename T>
  T* at(T* p) {
    return static_cast<T*>(real(p));
  }

 private:
  friend class GuardedMemory;
  void* reserve(size_t bytes, void* host);
  void release(void* address);

  std::string identity_;
  std::mutex mu_;         // (the address map: a reducer thread translates while a worker allocates)
  char* base_ = nullptr;  // the PROT_NONE reservation
  size_t reserved_ = 0, used_ = 0;
  struct Region {
    size_t bytes;
    void* host;
  };
  std::map<uintptr_t, Region> regions_;  // by device address
};

}  // namespace troupe::testing
