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
  if (!m_.at(b).defined()) m_[b] = Tensor(std::vector<size_t>{counts_.at(b)});
  if (has_v() && !v_.at(b).defined()) v_[b] = Tensor(std::vector<size_t>{counts_.at(b)});
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
  float* p = params.data();
  const float* g = grads.data();
  float* m = m_.at(b).data();
  const float lr = float(lr_at(step));
  const float wd = float(spec_.weight_decay), scale = float(grad_scale);
  if (spec_.kind == "sgd") {
    const float mu = float(spec_.momentum);
    for (size_t i = 0; i < n; ++i) {
      float gi = g[i] * scale + wd * p[i];
      m[i] = mu * m[i] + gi;
      p[i] -= lr * m[i];
    }
    return;
  }
  float* v = v_.at(b).data();
  const float b1 = float(spec_.beta1), b2 = float(spec_.beta2), eps = float(spec_.eps);
  const double t = double(step + 1);
  const float c1 = float(1.0 / (1.0 - std::pow(spec_.beta1, t)));
  const float c2 = float(1.0 / (1.0 - std::pow(spec_.beta2, t)));
  for (size_t i = 0; i < n; ++i) {
    float gi = g[i] * scale;
    m[i] = b1 * m[i] + (1 - b1) * gi;
    v[i] = b2 * v[i] + (1 - b2) * gi * gi;
    float mhat = m[i] * c1, vhat = v[i] * c2;
    p[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * p[i]);
  }
}

double grad_norm_sq(const Tensor& grads) {
  // Float partial sums over chunks (vectorised), added in double: the result does not depend on
  // the thread count or the machine, only on the data.
  const float* g = grads.data();
  const size_t n = grads.numel(), chunk = 1024;
  double total = 0;
  for (size_t at = 0; at < n; at += chunk) {
    size_t end = std::min(n, at + chunk);
    float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = at;
    for (; i + 8 <= end; i += 8)
      for (int l = 0; l < 8; ++l) lanes[l] += g[i + l] * g[i + l];
    for (; i < end; ++i) lanes[0] += g[i] * g[i];
    float s = 0;
    for (float v : lanes) s += v;
    total += s;
  }
  return total;
}

double clip_factor(double total_norm_sq, double max_norm) {
  if (max_norm <= 0) return 1.0;
  double norm = std::sqrt(total_norm_sq);
  return norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

}  // namespace troupe::models
