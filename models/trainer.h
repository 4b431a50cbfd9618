// The training step, top to bottom: zero grads; forward + backward over micro-batches of this
// worker's share of the global batch; [reduce: the distributed layer]; clip; update.
#pragma once

#include <functional>
#include <memory>

#include "models/data.h"
#include "models/model.h"
#include "models/optim.h"
#include "models/prefetch.h"

namespace troupe::models {

struct StepStats {
  double loss = 0;      // mean loss over the global batch (this worker's share if not reduced)
  double accuracy = 0;  // over the rows this worker scored
  double grad_norm = 0;
  double lr = 0;
  size_t samples = 0;
  // Where forward_backward's time went: assembling the batches, forward (with the loss),
  // backward (with the gradient hooks it calls).
  double data_seconds = 0, forward_seconds = 0, backward_seconds = 0;
};

class Trainer {
 public:
  Trainer(Model& model, Optimizer& opt, const Dataset& data, uint64_t seed, size_t global_batch,
          size_t micro_batch);

  // Forward and backward for global positions [begin, end) of the step (a rank's share), with
  // loss weights 1/global_batch. Gradients accumulate into the blocks.
  // block_done: as Model::forward_backward, on the last micro-batch only (when gradients are
  // final).
  StepStats forward_backward(uint64_t step, uint64_t begin, uint64_t end,
                             const std::function<void(size_t)>& block_done = nullptr);
  // Clip (with the total squared norm over all blocks of all workers) and update every block.
  void apply(uint64_t step, double total_grad_norm_sq, StepStats& stats);
  // The same for blocks [first, last) only (a pipeline stage's).
  void apply_blocks(uint64_t step, double total_grad_norm_sq, size_t first, size_t last,
                    StepStats& stats);
  // The micro-batch of global positions [begin, end) of the step (relative to its first).
  Batch batch(uint64_t step, uint64_t begin, uint64_t end);
  // The loss weight of one scored row: 1 / (global batch x targets per sample).
  double loss_scale() const;
  // A whole step on one worker.
  StepStats step(uint64_t step);

  size_t global_batch() const { return global_batch_; }
  // From now on forward_backward takes its micro-batches from a background thread that
  // assembles the next one (this step's next, or the next step's first for the same share)
  // while the current one computes; StepStats::data_seconds is then the time it waited.
  void enable_prefetch() { prefetch_ = std::make_unique<BatchPrefetcher>(data_, seed_); }
  const BatchPrefetcher* prefetcher() const { return prefetch_.get(); }

 private:
  Model& model_;
  Optimizer& opt_;
  const Dataset& data_;
  GlobalSampler sampler_;
  uint64_t seed_;
  size_t global_batch_, micro_batch_;
  std::unique_ptr<BatchPrefetcher> prefetch_;
};

}  // namespace troupe::models
