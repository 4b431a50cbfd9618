// What a worker holds of the model, block by block: whether each block's state (parameters and
// optimizer moments) is current as of a step, a copy of it from before the last update (a
// pipeline stage's snapshot: a failure can end a step after some stages applied it and before
// others did, and the next generation then resumes one step earlier), and blocks held as of step
// 0 but not yet made from the seed (pipeline workers initialise only what they keep or send).
// holding() is what the worker publishes for the next generation (elastic::Holding).
//
// Thread-safety: none; owned by one worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "elastic/generation.h"
#include "models/model.h"
#include "models/optim.h"

namespace troupe::workers {

class BlockStates {
 public:
  // Where the first state comes from: the seed (step 0), a checkpoint (its step), or (neither)
  // the members of a running job.
  struct Origin {
    bool init_state = true;  // false: nothing is held until it is received
    uint64_t seed = 0;
    std::string checkpoint;  // "" or the checkpoint's directory (block-B.trpblk per block)
    uint64_t step = 0;       // the checkpoint's step
  };
  // With init_state every block is held as of the origin's step: made (from the seed, or read
  // from the checkpoint) now, or when lazy, at materialize(). Throws std::runtime_error naming a
  // shard that cannot be read or does not fit the model.
  BlockStates(models::Model& model, models::Optimizer& opt, const Origin& origin, bool lazy);

  uint32_t num_blocks() const { return uint32_t(held_at_.size()); }
  // The buffers of a block's state: parameters, then the optimizer's moments (allocated when a
  // block's moments were released).
  std::vector<models::Tensor*> buffers(uint32_t block);
  std::vector<size_t> sizes(uint32_t block) const;
  uint64_t bytes(uint32_t block) const;

  // Marks a block current as of `step` (trained, received or restored).
  void hold(uint32_t block, uint64_t step);
  bool holds(uint32_t block, uint64_t step) const { return held_at_[block] == step; }
  // Every block is held as of `step` again, from the checkpoint in `directory`, or ("") made
  // from the seed (the job's state was lost with the members that held it): now, or when lazy,
  // at materialize(). Snapshots of the lost steps go.
  void reload(const std::string& directory, uint64_t step, bool lazy);
  // Initialises the block (from the seed or the checkpoint) if that is pending.
  void materialize(uint32_t block);
  // Copies the block's state as of `step` (before the update that follows).
  void snapshot(uint32_t block, uint64_t step);
  float* snapshot_data(uint32_t block, size_t buffer) { return snap_[block][buffer].data(); }
  // The block is not this worker's any more: its memory goes back (lazy buffers), its copies too.
  void release(uint32_t block);

  // What this worker holds as of next_step (live) and next_step - 1 (snapshots).
  elastic::Holding holding(uint64_t next_step) const;

 private:
  static constexpr uint64_t kStale = UINT64_MAX;
  models::Model& model_;
  models::Optimizer& opt_;
  Origin origin_;
  std::vector<uint64_t> held_at_;  // per block: the step its state is current as of, or kStale
  std::vector<bool> pending_init_;
  std::vector<uint64_t> snap_at_;                  // per block: the step of its snapshot, or kStale
  std::vector<std::vector<models::Tensor>> snap_;  // per block: copies of its state buffers
};

}  // namespace troupe::workers
