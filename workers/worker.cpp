#include "workers/worker.h"

#include <chrono>
#include <stdexcept>

#include "elastic/membership.h"

namespace troupe::workers {

Worker::Worker(const WorkerSpec& spec) : spec_(spec) {
  models::set_compute_threads(spec.threads);
  models::ModelSpec m = spec.model;
  if (spec.data_kind == "text") {
    auto text = std::make_unique<models::CharText>(spec.data_path, m.context);
    m.vocab = text->vocab();
    data_ = std::move(text);
  } else {
    if (m.mlp_sizes.size() < 2) throw std::invalid_argument("the mlp needs inputs and classes");
    data_ = std::make_unique<models::SyntheticClassification>(
        spec.seed, size_t(spec.samples), m.mlp_sizes.front(), m.mlp_sizes.back());
  }
  model_ = std::make_unique<models::Model>(m);
  model_->init(spec.seed);
  std::vector<size_t> counts;
  for (size_t i = 0; i < model_->num_blocks(); ++i)
    counts.push_back(model_->block(i).param_count());
  opt_ = std::make_unique<models::Optimizer>(spec.optimizer, counts);
  trainer_ = std::make_unique<models::Trainer>(*model_, *opt_, *data_, spec.seed,
                                               size_t(spec.global_batch), size_t(spec.micro_batch));
}

TrainResult Worker::run(comm::Communicator& comm, uint64_t start,
                        const std::function<void(const StepInfo&)>& on_step,
                        const std::function<bool()>& stop_requested) {
  TrainResult result{start, false};
  const uint64_t B = uint64_t(spec_.global_batch);
  const elastic::Share share = elastic::data_share(B, uint32_t(comm.rank()), uint32_t(comm.size()));
  const uint64_t begin = share.begin, end = share.end;
  for (uint64_t step = start; step < spec_.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    // Forward + backward over this rank's positions (weights 1/B: shares add up).
    models::StepStats stats = trainer_->forward_backward(step, begin, end);
    // Reduce: one allreduce per block's flat gradient buffer.
    for (size_t b = 0; b < model_->num_blocks(); ++b) {
      auto& g = model_->block(b).grads();
      comm.allreduce(g.data(), g.data(), g.numel(), comm::DataType::f32, comm::ReduceOp::sum);
    }
    double control[2] = {stats.loss, stop_requested() ? 1.0 : 0.0};
    comm.allreduce(control, control, 2, comm::DataType::f64, comm::ReduceOp::sum);
    // Update: the same clipped step everywhere (the gradients are identical after the sum).
    double norm_sq = 0;
    for (size_t b = 0; b < model_->num_blocks(); ++b)
      norm_sq += models::grad_norm_sq(model_->block(b).grads());
    trainer_->apply(step, norm_sq, stats);
    StepInfo info;
    info.step = step;
    info.loss = control[0];
    info.position_begin = step * B + begin;
    info.position_end = step * B + end;
    info.samples = end - begin;
    info.tokens = info.samples * (spec_.data_kind == "text" ? uint64_t(spec_.model.context) : 1);
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    on_step(info);
    result.next_step = step + 1;
    if (control[1] > 0) {
      result.stopped = true;
      break;
    }
  }
  comm.barrier();  // nobody leaves while another still waits on it
  return result;
}

uint64_t Worker::checksum() const {
  uint64_t h = 1469598103934665603ull;
  for (size_t b = 0; b < model_->num_blocks(); ++b) {
    const auto& p = model_->block(b).params();
    auto* bytes = reinterpret_cast<const uint8_t*>(p.data());
    for (size_t i = 0; i < p.numel() * sizeof(float); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  }
  return h;
}

}  // namespace troupe::workers
