// Optimizers over the blocks' flat buffers, gradient clipping by global norm, and the LR
// schedule. Clipping works when the blocks are spread over several workers: each worker sums
// the squares of its blocks' gradients (grad_norm_sq), the sums are added (an allreduce of one
// number), and every worker scales by the same clip_factor.
#pragma once

#include <string>
#include <vector>

#include "models/compute.h"
#include "models/tensor.h"

namespace troupe::models {

struct OptimizerSpec {
  std::string kind = "adamw";  // sgd | adamw
  double lr = 1e-3;
  double momentum = 0.9;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adamw
  double weight_decay = 0.0;
  double clip_norm = 0.0;  // 0: no clipping
  size_t warmup_steps = 0;
  size_t decay_steps = 0;  // 0: constant after warmup; else cosine down to min_lr_ratio * lr
  double min_lr_ratio = 0.1;
};

class Optimizer {
 public:
  // Throws std::invalid_argument on a bad spec (unknown kind, lr <= 0, ...).
  Optimizer(const OptimizerSpec& spec, const std::vector<size_t>& block_param_counts);

  const OptimizerSpec& spec() const { return spec_; }
  double lr_at(uint64_t step) const;
  // A new peak learning rate (spec().lr) for the steps from now on; the schedule (warmup,
  // decay) goes on around it. Throws std::invalid_argument unless it is positive and finite.
  void set_lr(double lr);
  // One update of block b at (0-based) step; grads are multiplied by grad_scale first.
  void update(size_t b, Tensor& params, const Tensor& grads, uint64_t step, double grad_scale);
  Tensor& m(size_t b) { return m_.at(b); }
  Tensor& v(size_t b) { return v_.at(b); }
  bool has_v() const { return spec_.kind == "adamw"; }
  // A pipeline worker keeps moments only for the blocks it owns: release frees block b's,
  // ensure allocates them again (zeros) before they are received or used.
  void release(size_t b);
  void ensure(size_t b);
  // Moves the moments to `compute`'s device, where the updates run from now on (the model's:
  // Model::to). The CPU until then.
  void to(Compute& compute);

 private:
  OptimizerSpec spec_;
  std::vector<size_t> counts_;
  std::vector<Tensor> m_, v_;
  Compute* compute_ = &cpu_compute();
};

// On the device the gradients are on (Compute::grad_norm_sq).
double grad_norm_sq(const Tensor& grads);
double clip_factor(double total_norm_sq, double max_norm);

}  // namespace troupe::models
