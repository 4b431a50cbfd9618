// Tensor bytes where the data plane (UCX, shared memory) reaches them: host memory. A worker's
// model may live on a device (models/compute.h); its collectives, state transfer, backups,
// snapshots and checksums then go host-staged: the device's bytes copied to a host buffer and,
// for what they change, back, through the device's host memory for copies
// (Compute::allocate_host: pinned and cached on CUDA). A host tensor is used in place (no copy).
//
// Thread-safety: none; one worker thread.
#pragma once

#include <memory>

#include "models/compute.h"

namespace troupe::workers {

class HostStaged {
 public:
  // The tensor's bytes on the host: read from its device (unless `load` is false: a buffer a
  // receive fills).
  explicit HostStaged(models::Tensor& t, bool load = true);
  // Read only (store() is refused).
  explicit HostStaged(const models::Tensor& t);
  HostStaged(const HostStaged&) = delete;
  HostStaged& operator=(const HostStaged&) = delete;

  float* data() { return host_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * sizeof(float); }
  // Writes the host bytes back into the tensor's device (nothing for a host tensor).
  void store();

 private:
  models::Tensor* tensor_;                // null: read only
  std::unique_ptr<models::Memory> copy_;  // the device's host staging memory (pinned on CUDA)
  float* host_;
  size_t count_;
};

// The Compute whose memory `t` is in (the CPU's for host tensors and undefined ones).
models::Compute& compute_of(const models::Tensor& t);

// `bytes` from src to dst, each in the memory of the Compute named beside it.
void copy_between(void* dst, models::Compute& dst_on, const void* src, models::Compute& src_on,
                  size_t bytes);

}  // namespace troupe::workers
