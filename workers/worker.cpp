#include "workers/worker.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "elastic/membership.h"

namespace troupe::workers {
namespace {

// Runs reductions on its own thread, in the order pushed. The communicator is used by one
// thread at a time: the reducer during the backward pass, the worker after finish().
class Reducer {
 public:
  explicit Reducer(std::function<void(size_t)> reduce) : reduce_(std::move(reduce)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Reducer() {
    if (thread_.joinable()) {
      push(kStop);
      thread_.join();
    }
  }
  void push(size_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(block);
    cv_.notify_one();
  }
  // Waits for every pushed reduction; rethrows the first failure.
  void finish() {
    push(kStop);
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr size_t kStop = SIZE_MAX;
  void loop() {
    while (true) {
      size_t b;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        b = queue_.front();
        queue_.pop_front();
      }
      if (b == kStop) return;
      if (error_) continue;  // after a failure, drain without reducing
      try {
        reduce_(b);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
  std::function<void(size_t)> reduce_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace

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
  auto reduce_block = [&](size_t b) {
    auto& g = model_->block(b).grads();
    comm.allreduce(g.data(), g.data(), g.numel(), comm::DataType::f32, comm::ReduceOp::sum);
  };
  for (uint64_t step = start; step < spec_.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    if (spec_.test_throw_at_step > 0 && step + 1 == spec_.test_throw_at_step) {
      spec_.test_throw_at_step = 0;  // once per worker
      throw std::runtime_error("injected fault at step " + std::to_string(step) +
                               " (TROUPE_TEST_THROW_AT_STEP)");
    }
    if (spec_.test_step_delay_us > 0)
      std::this_thread::sleep_for(std::chrono::microseconds(spec_.test_step_delay_us));
    models::StepStats stats;
    if (spec_.overlap_reduce) {
      // Forward + backward; each block's gradient is reduced on the reducer thread as soon as
      // its backward is done (blocks in reverse order, the same order on every rank).
      Reducer reducer(reduce_block);
      stats = trainer_->forward_backward(step, begin, end, [&](size_t b) { reducer.push(b); });
      reducer.finish();
    } else {
      // Forward + backward over this rank's positions (weights 1/B: shares add up), then one
      // allreduce per block's flat gradient buffer.
      stats = trainer_->forward_backward(step, begin, end);
      for (size_t b = model_->num_blocks(); b-- > 0;) reduce_block(b);
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
    next_step_ = step + 1;
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

StateTransfer Worker::take_state_from(comm::Communicator& comm, int source, uint64_t start_step,
                                      const std::vector<uint64_t>& applied_by_rank) {
  StateTransfer t;
  const auto t0 = std::chrono::steady_clock::now();
  const int me = comm.rank();
  // Every buffer of the state, in one order known to both sides.
  std::vector<models::Tensor*> buffers;
  for (size_t b = 0; b < model_->num_blocks(); ++b) {
    buffers.push_back(&model_->block(b).params());
    buffers.push_back(&opt_->m(b));
    if (opt_->has_v()) buffers.push_back(&opt_->v(b));
  }
  auto lacks = [&](int r) { return r != source && applied_by_rank.at(size_t(r)) != start_step; };
  constexpr uint32_t kStateTag = 0x57a7e;
  if (me == source) {
    for (int r = 0; r < comm.size(); ++r) {
      if (!lacks(r)) continue;
      for (size_t i = 0; i < buffers.size(); ++i) {
        comm.send(buffers[i]->data(), buffers[i]->numel() * sizeof(float), r, kStateTag);
        t.bytes += buffers[i]->numel() * sizeof(float);
        if (i == 0 && spec_.test_state_delay_ms > 0)
          std::this_thread::sleep_for(std::chrono::milliseconds(spec_.test_state_delay_ms));
      }
    }
  } else if (lacks(me)) {
    t.needed = true;
    for (auto* buf : buffers) {
      comm.recv(buf->data(), buf->numel() * sizeof(float), source, kStateTag);
      t.bytes += buf->numel() * sizeof(float);
    }
  }
  next_step_ = start_step;
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
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
