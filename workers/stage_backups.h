// Stage backups: a pipeline stage without a data-parallel replica copies its blocks' state to
// the next stage's worker (cyclically, same replica) and keeps a copy of its own, at the start of
// every generation and every parallel.stage_backup_steps steps. Losing a stage worker then rolls
// everyone back to the newest backup instead of failing the job (docs/design.md).
//
// Thread-safety: none; owned by one worker.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "elastic/planner.h"
#include "models/tensor.h"
#include "workers/block_state.h"

namespace troupe::workers {

class StageBackups {
 public:
  explicit StageBackups(uint32_t num_blocks) : copies_(num_blocks), backed_up_(num_blocks) {}

  // This stage (of the plan, in its replica) sends its blocks' state to the next stage and
  // receives the previous stage's; both are kept as of `step`. Stage 0 sends first, every
  // other stage receives first, so the chain of blocking sends always has a receiver ready.
  void take(comm::Communicator& comm, const elastic::Plan& plan, uint32_t stage, uint32_t replica,
            BlockStates& states, uint64_t step);

  uint64_t step() const { return step_; }
  std::vector<uint32_t> blocks() const;  // held as of step()
  float* data(uint32_t block, size_t buffer) { return copies_[block][buffer].data(); }
  // Adds the backups to what a worker publishes.
  void describe(elastic::Holding& h) const {
    h.backup_step = step_;
    h.backup = blocks();
  }

 private:
  std::vector<models::Tensor>& copy_of(uint32_t block, const BlockStates& states);

  std::vector<std::vector<models::Tensor>> copies_;  // per block: its state buffers as of step_
  std::vector<bool> backed_up_;
  uint64_t step_ = 0;
};

}  // namespace troupe::workers
