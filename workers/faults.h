// Faults a test injects into an agent's workers, through an interface the test build passes in
// (tests/harness/env_faults.cpp, in the `troupe_test` binary); the release `troupe` passes none
// and never reads the environment for them. The hooks throw, wait, or change what a worker
// says or builds (each names the defect of another process it stands for).
//
// Thread-safety: called from every worker thread of an agent; implementations synchronise.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "models/compute.h"

namespace troupe::comm {
class Communicator;  // (comm/communicator.h: not an installed header)
}
namespace troupe::models {
struct ModelSpec;  // (models/model.h)
}

namespace troupe::workers {

class FaultInjector {
 public:
  virtual ~FaultInjector() = default;
  // Before worker `device` of agent `agent` runs step `step` (counting from 0): may throw (a
  // worker that fails; its agent restarts it) or sleep (pacing, so a test can act between steps).
  virtual void before_step(const std::string& agent, uint32_t device, uint64_t step) = 0;
  // In a state transfer this worker sends, after its first buffer: may sleep (a transfer caught
  // in the middle, so a test can kill the sender then).
  virtual void mid_state_transfer(const std::string& agent, uint32_t device) = 0;
  // On the checkpoint writer's thread, after the first shard of a write is durable: may sleep (a
  // checkpoint caught in the middle, so a test can kill the writer then).
  virtual void mid_checkpoint_write(const std::string& agent, uint32_t device) {}
  // Before agent `agent` asks to join (connected to the coordinator): may sleep (an agent slow
  // to start, so a test can act while it is on its way).
  virtual void before_join(const std::string& agent) {}
  // Before worker `device` of `agent` computes its final checksum: may change its parameters
  // (a member that ended different: the job must say so, not report success).
  virtual void before_checksum(const std::string& agent, uint32_t device, float* parameters,
                               size_t count) {}
  // Before worker `device` of `agent` says it is ready (the step its state is as of, its model's
  // blocks): may change what it says (a worker claiming a step it never ran, or another model:
  // the coordinator must not believe it).
  virtual void before_ready(const std::string& agent, uint32_t device, uint64_t& applied,
                            uint32_t& blocks) {}
  // Before worker `device` of `agent` builds its model: may change it (an agent of another
  // program version: the worker must refuse to start, not fail a transfer later).
  virtual void model(const std::string& agent, uint32_t device, models::ModelSpec& spec) {}
  // As worker `device` of `agent` reads the generation's start: may change the step the
  // coordinator relays as its own state's (a coordinator's bug: the worker must not believe it).
  virtual void relayed_applied(const std::string& agent, uint32_t device, uint64_t& applied) {}
  // The device worker `device` of `agent` computes on instead of its own (null: its own): a
  // stand-in device whose memory the host cannot read, so a test sees every host-staged path.
  virtual std::shared_ptr<models::Compute> device_for(const std::string& agent, uint32_t device) {
    return nullptr;
  }
  // The device plane of a worker on such a stand-in device (workers/device_plane.h): a
  // communicator over its memory in place of NCCL's, on the generation's host communicator
  // (null: NCCL's; defined in device_plane.cpp, where a Communicator is complete), its waits
  // given up as NCCL's once `abandoned` says so (PlaneOptions::abandoned).
  virtual std::unique_ptr<comm::Communicator> device_link(models::Compute& compute,
                                                          comm::Communicator& host,
                                                          std::function<bool()> abandoned);
};

}  // namespace troupe::workers
