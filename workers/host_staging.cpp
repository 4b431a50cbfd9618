#include "workers/host_staging.h"

#include <cstring>
#include <stdexcept>

namespace troupe::workers {

models::Compute& compute_of(const models::Tensor& t) {
  return t.defined() ? t.storage()->compute() : models::cpu_compute();
}

HostStaged::HostStaged(models::Tensor& t, bool load) : tensor_(&t), count_(t.numel()) {
  if (t.device() == models::Device::cpu) {
    host_ = t.data();
    return;
  }
  copy_ = compute_of(t).allocate_host(bytes());
  host_ = static_cast<float*>(copy_->data());
  if (load) compute_of(t).to_host(host_, t.data(), bytes());
}

HostStaged::HostStaged(const models::Tensor& t) : tensor_(nullptr), count_(t.numel()) {
  if (t.device() == models::Device::cpu) {
    host_ = const_cast<float*>(t.data());
    return;
  }
  copy_ = compute_of(t).allocate_host(bytes());
  host_ = static_cast<float*>(copy_->data());
  compute_of(t).to_host(host_, t.data(), bytes());
}

void HostStaged::store() {
  if (!tensor_) throw std::logic_error("HostStaged: store() on a read-only view");
  if (!copy_) return;  // (host memory: written in place)
  compute_of(*tensor_).from_host(tensor_->data(), host_, bytes());
}

void copy_between(void* dst, models::Compute& dst_on, const void* src, models::Compute& src_on,
                  size_t bytes) {
  const bool dst_host = dst_on.device() == models::Device::cpu;
  const bool src_host = src_on.device() == models::Device::cpu;
  if (dst_host && src_host) {
    std::memcpy(dst, src, bytes);
  } else if (src_host) {
    dst_on.from_host(dst, src, bytes);
  } else if (dst_host) {
    src_on.to_host(dst, src, bytes);
  } else if (&dst_on == &src_on) {
    dst_on.copy(dst, src, bytes);
  } else {
    auto host = src_on.allocate_host(bytes);  // (given back after dst_on's copy: see below)
    src_on.to_host(host->data(), src, bytes);
    dst_on.from_host(dst, host->data(), bytes);
    dst_on.synchronize();  // (the buffer goes back when `host` goes; the copy must be done)
  }
}

}  // namespace troupe::workers
