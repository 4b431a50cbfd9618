#include "models/trainer.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

namespace troupe::models {

Trainer::Trainer(Model& model, Optimizer& opt, const Dataset& data, uint64_t seed,
                 size_t global_batch, size_t micro_batch)
    : model_(model),
      opt_(opt),
      data_(data),
      sampler_(seed, data.size()),
      seed_(seed),
      global_batch_(global_batch),
      micro_batch_(micro_batch) {
  if (global_batch == 0) throw std::invalid_argument("batch.global is zero");
  if (micro_batch == 0) throw std::invalid_argument("batch.micro is zero");
}

StepStats Trainer::forward_backward(uint64_t step, uint64_t begin, uint64_t end,
                                    const std::function<void(size_t)>& block_done) {
  StepStats s;
  model_.zero_grads();
  const uint64_t base = step * global_batch_;
  size_t rows = 0, correct = 0;
  for (uint64_t at = begin; at < end; at += micro_batch_) {
    uint64_t stop = std::min<uint64_t>(end, at + micro_batch_);
    const auto t0 = std::chrono::steady_clock::now();
    Batch b = prefetch_ ? prefetch_->take(base + at, base + stop)
                        : make_batch(data_, sampler_, base + at, base + stop);
    s.data_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (prefetch_) {  // the next: this step's next micro-batch, or the next step's first
      const uint64_t from = stop < end ? base + stop : base + global_batch_ + begin;
      prefetch_->expect(
          from, from + std::min<uint64_t>(micro_batch_, stop < end ? end - stop : end - begin));
    }
    const bool last = stop == end;
    auto r = model_.forward_backward(b, loss_scale(), last ? block_done : nullptr);
    s.forward_seconds += r.forward_seconds;
    s.backward_seconds += r.backward_seconds;
    s.loss += r.loss;
    rows += r.rows;
    correct += r.correct;
  }
  s.samples = size_t(end - begin);
  s.accuracy = rows ? double(correct) / double(rows) : 0;
  return s;
}

void Trainer::apply(uint64_t step, double total_grad_norm_sq, StepStats& stats) {
  apply_blocks(step, total_grad_norm_sq, 0, model_.num_blocks(), stats);
}

void Trainer::apply_blocks(uint64_t step, double total_grad_norm_sq, size_t first, size_t last,
                           StepStats& stats) {
  double scale = clip_factor(total_grad_norm_sq, opt_.spec().clip_norm);
  for (size_t b = first; b < last; ++b) {
    auto& blk = model_.block(b);
    opt_.update(b, blk.params(), blk.grads(), step, scale);
  }
  stats.grad_norm = std::sqrt(total_grad_norm_sq);
  stats.lr = opt_.lr_at(step);
}

Batch Trainer::batch(uint64_t step, uint64_t begin, uint64_t end) {
  const uint64_t base = step * global_batch_;
  return make_batch(data_, sampler_, base + begin, base + end);
}

double Trainer::loss_scale() const {
  return 1.0 / double(global_batch_ * data_.targets_per_sample());
}

StepStats Trainer::step(uint64_t step) {
  StepStats s = forward_backward(step, 0, global_batch_);
  double norm_sq = 0;
  for (size_t b = 0; b < model_.num_blocks(); ++b) norm_sq += grad_norm_sq(model_.block(b).grads());
  apply(step, norm_sq, s);
  return s;
}

}  // namespace troupe::models
