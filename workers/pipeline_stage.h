// One step of a pipeline stage: executes elastic::one_f_one_b's list of operations with a small
// loop. Activations go to the next stage and gradients come back, one sendrecv per exchange:
// host-staged over the generation's communicator, or device to device over its device plane
// (workers/device_plane.h: NCCL, whose point-to-point operations between two ranks match in the
// order they are posted, as the schedule posts them: elastic/pipeline_schedule.h). The
// blocks' forward caches of a micro-batch whose backward has not run are put away (Block::save)
// before the next forward and put back for its backward: at most pp - s micro-batches in flight
// on stage s. With recompute_activations the blocks keep one and the backward of micro-batch j
// recomputes its forward from the saved stage input (the same numbers, one more forward). The
// last stage scores the loss.
//
// Legend: pp stages, s this stage, m micro-batches, j a micro-batch; blocks [first, last).
// Thread-safety: none; used by one worker's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "elastic/membership.h"
#include "elastic/pipeline_schedule.h"
#include "models/trainer.h"

namespace troupe::workers {

struct StageLayout {
  uint32_t stages = 1, stage = 0;  // pp, s
  uint32_t first = 0, last = 0;    // the stage's blocks
  int prev = -1, next = -1;        // the neighbours' ranks (-1: none)
  bool recompute = false;          // parallel.recompute_activations
};

struct StageStepResult {
  double loss = 0;        // the last stage: its micro-batches' loss (weights 1/B); others: 0
  double loss_fixed = 0;  // the same, each micro-batch's in fixed point (workers/exact_sum.h)
  double busy = 0;        // seconds computing (forward, recompute, loss, backward)
};

class PipelineStage {
 public:
  // out_shape: each block's output shape for one sample (dim 0 scales with the samples).
  PipelineStage(models::Model& model, models::Trainer& trainer,
                const std::vector<std::vector<size_t>>& out_shape, StageLayout layout);

  // The step's forward and backward for this stage's share [share.begin, share.end) of the
  // global batch, in micro-batches of `micro` samples. Gradients accumulate into the blocks;
  // after_backward, if given, runs after each micro-batch's backward (parallel.deterministic
  // moves each micro-batch's gradient aside there).
  StageStepResult run(comm::Communicator& comm, uint64_t step, elastic::Share share, uint64_t micro,
                      const std::function<void()>& after_backward = nullptr);
  // The generation's device plane (null: host-staged): the exchanges go over it from the
  // device memory the blocks compute in, and what it receives lands there.
  void set_device_plane(comm::Communicator* plane) { plane_ = plane; }

 private:
  struct Micro {  // one micro-batch's tensors in this step
    uint64_t begin = 0, end = 0;
    models::Batch batch;  // (first stage: inputs; last stage: targets)
    models::Tensor input, output, grad_out, grad_in;
    std::vector<models::Block::Saved> stash;  // the blocks' forward caches, put away
    std::vector<size_t> in_numel;             // each of the stage's blocks' input size
  };
  void load(uint32_t j);
  void forward(uint32_t j);
  void loss(uint32_t j);
  void backward(uint32_t j);
  void exchange(comm::Communicator& comm, const elastic::PipeOp& op);
  void put_away();
  size_t rows(uint32_t j) const { return size_t(mbs_[j].end - mbs_[j].begin); }
  models::Tensor shaped(uint32_t block_output, uint32_t j) const;

  models::Model& model_;
  models::Trainer& trainer_;
  const std::vector<std::vector<size_t>>& out_shape_;
  StageLayout layout_;
  uint64_t step_ = 0;
  std::vector<Micro> mbs_;
  int cached_ = -1;  // the micro-batch whose forward the blocks hold
  std::function<void()> after_backward_;
  StageStepResult result_;
  comm::Communicator* plane_ = nullptr;
};

}  // namespace troupe::workers
