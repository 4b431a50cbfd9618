#include "models/optim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace troupe::models {

Optimizer::Optimizer(const OptimizerSpec& spec, const std::vector<size_t>& counts)
    : spec_(spec), counts_(counts) {
  if (spec.kind != "sgd" && spec.kind != "adamw") {
    throw std::invalid_argument("optimizer.kind '" + spec.kind + "' is not sgd or adamw");
  }
  if (!(spec.lr > 0)) throw std::invalid_argument("optimizer.lr must be positive");
  if (spec.clip_norm < 0) throw std::invalid_argument("optimizer.clip_norm must not be negative");
  const bool lazy = LazyParameters::active();  // (a pipeline worker: only its stage's get used)
  for (size_t n : counts) {
    m_.push_back(lazy ? Tensor::lazy({n}) : Tensor({n}));
    if (has_v()) v_.push_back(lazy ? Tensor::lazy({n}) : Tensor({n}));
  }
}

void Optimizer::release(size_t b) {
  m_.at(b) = Tensor();
  if (has_v()) v_.at(b) = Tensor();
}

void Optimizer::ensure(size_t b) {
  if (!m_.at(b).defined()) m_[b] = compute_->tensor({counts_.at(b)});
  if (has_v() && !v_.at(b).defined()) v_[b] = compute_->tensor({counts_.at(b)});
}

void Optimizer::to(Compute& compute) {
  for (auto& t : m_) compute.move_storage(t);
  for (auto& t : v_) compute.move_storage(t);
  compute_ = &compute;
}

void Optimizer::set_lr(double lr) {
  if (!(lr > 0) || !std::isfinite(lr))
    throw std::invalid_argument("the learning rate must be positive and finite");
  spec_.lr = lr;
}

double Optimizer::lr_at(uint64_t step) const {
  const double lr = spec_.lr;
  if (step < spec_.warmup_steps) return lr * double(step + 1) / double(spec_.warmup_steps);
  if (spec_.decay_steps == 0) return lr;
  double progress = double(step - spec_.warmup_steps) / double(spec_.decay_steps);
  if (progress > 1) progress = 1;
  double min_lr = lr * spec_.min_lr_ratio;
  return min_lr + 0.5 * (1 + std::cos(M_PI * progress)) * (lr - min_lr);
}

void Optimizer::update(size_t b, Tensor& params, const Tensor& grads, uint64_t step,
                       double grad_scale) {
  const size_t n = params.numel();
  const float lr = float(lr_at(step));
  const float wd = float(spec_.weight_decay), scale = float(grad_scale);
  if (spec_.kind == "sgd") {
    compute_->sgd(params.data(), grads.data(), m_.at(b).data(), n, lr, float(spec_.momentum), wd,
                  scale);
    return;
  }
  const double t = double(step + 1);
  AdamWStep s{lr,
              float(spec_.beta1),
              float(spec_.beta2),
              float(spec_.eps),
              wd,
              float(1.0 / (1.0 - std::pow(spec_.beta1, t))),
              float(1.0 / (1.0 - std::pow(spec_.beta2, t))),
              scale};
  compute_->adamw(params.data(), grads.data(), m_.at(b).data(), v_.at(b).data(), n, s);
}

double grad_norm_sq(const Tensor& grads) {
  if (!grads.defined()) return 0;
  return grads.storage()->compute().grad_norm_sq(grads.data(), grads.numel());
}

double clip_factor(double total_norm_sq, double max_norm) {
  if (max_norm <= 0) return 1.0;
  double norm = std::sqrt(total_norm_sq);
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace troupe::models
