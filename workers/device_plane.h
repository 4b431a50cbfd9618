// The device plane of one generation: a communicator over the members' device memory (NCCL)
// for what a data-parallel step reduces, when elastic::choose_data_plane says it can serve the
// members; otherwise none, and the worker stages its tensors through host memory over the
// generation's host communicator (UCX, shared memory).
//
// Formed collectively over the host communicator right after it connects: every member's
// device identity (a GPU's UUID) is allgathered, every member decides alike, and rank 0's NCCL
// unique id is broadcast. NCCL's init is non-blocking and has the generation's deadline; every
// operation is polled against its deadline and against `abandoned` (a member of the generation is
// gone, and NCCL between GPUs may never notice; not a planned change, in which every member
// finishes its step), and any failure ends in ncclCommAbort (comm/nccl_communicator.h). The
// plane goes with its generation.
//
// Thread-safety: as comm::Communicator (one thread runs its operations; abort from any).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"
#include "elastic/data_plane.h"
#include "models/compute.h"

namespace troupe::workers {

struct PlaneOptions {
  std::string backend = "auto";  // parallel.backend
  int cuda_device = 0;           // the worker's GPU (NCCL's device)
  std::chrono::milliseconds timeout{30000};
  // True once a member of the generation is gone (checked while an operation waits on a peer).
  std::function<bool()> abandoned;
  // In place of NCCL (tests: a stand-in device's plane, workers/faults.h); null: NCCL.
  std::function<std::unique_ptr<comm::Communicator>(comm::Communicator& host)> link;
};

// parallel.backend = "nccl" and the members cannot use NCCL: the job cannot go on as asked.
class PlaneRefused : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class DevicePlane {
 public:
  // Collective over `host` (every member, at the generation's start). Throws comm::Error (the
  // generation broke: a member lost, the init deadline) or PlaneRefused.
  static std::unique_ptr<DevicePlane> form(comm::Communicator& host, models::Compute& compute,
                                           const PlaneOptions& options);

  // Null: host-staged.
  comm::Communicator* device() const { return device_.get(); }
  const elastic::PlaneChoice& choice() const { return choice_; }

 private:
  DevicePlane(elastic::PlaneChoice choice, std::unique_ptr<comm::Communicator> device)
      : choice_(std::move(choice)), device_(std::move(device)) {}
  elastic::PlaneChoice choice_;
  std::unique_ptr<comm::Communicator> device_;
};

// Waits (never blocking on the device) until `fence` is reached, up to `timeout`: the device
// memory written before it may go to a collective on another stream. Throws comm::Error
// (timed_out).
void await_fence(models::Compute::Fence& fence, std::chrono::milliseconds timeout);

}  // namespace troupe::workers
