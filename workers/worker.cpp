#include "workers/worker.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>

#include "elastic/membership.h"
#include "models/kernels.h"
#include "workers/tags.h"

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

// Adds the lifetime of the scope to a seconds counter.
class Busy {
 public:
  explicit Busy(double& seconds) : seconds_(seconds), t0_(std::chrono::steady_clock::now()) {}
  ~Busy() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point t0_;
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
  // A pipeline worker builds every block lazily (no memory until written) and backs, initialises
  // and keeps only those of its stage (take_state); a data-parallel one has them all at once.
  const bool pipelined = spec.pipeline_stages != 1;
  {
    std::optional<models::LazyParameters> lazy;
    if (pipelined) lazy.emplace();
    model_ = std::make_unique<models::Model>(m);
    std::vector<size_t> counts;
    for (size_t i = 0; i < model_->num_blocks(); ++i)
      counts.push_back(model_->block(i).param_count());
    opt_ = std::make_unique<models::Optimizer>(spec.optimizer, counts);
  }
  pending_init_.assign(model_->num_blocks(), spec.init_state && pipelined);
  if (spec.init_state && !pipelined) model_->init(spec.seed);
  trainer_ = std::make_unique<models::Trainer>(*model_, *opt_, *data_, spec.seed,
                                               size_t(spec.global_batch), size_t(spec.micro_batch));
  // Every worker of the first generation starts from the same initial state (a pure function of
  // the seed); one that skipped it holds nothing until it receives the state.
  held_at_.assign(model_->num_blocks(), spec.init_state ? 0 : kStale);
  snap_at_.assign(model_->num_blocks(), kStale);
  snap_.resize(model_->num_blocks());
  backup_.resize(model_->num_blocks());
  backed_up_.assign(model_->num_blocks(), false);
  // The shape of each block's output for one sample: one sample through the model.
  models::Batch one = trainer_->batch(0, 0, 1);
  models::Tensor x = one.inputs;
  for (size_t b = 0; b < model_->num_blocks(); ++b) {
    x = model_->block(b).forward(x, 1);
    out_shape_.push_back(x.shape());
  }
  if (!pipelined) model_->zero_grads();  // (lazy gradients read zeros already)
}

void Worker::materialize(uint32_t b) {
  if (!pending_init_[b]) return;
  model_->block(b).init(spec_.seed, b);
  pending_init_[b] = false;
}

elastic::Plan Worker::plan_for(uint32_t world) const {
  std::vector<elastic::BlockCost> costs;
  for (size_t b = 0; b < model_->num_blocks(); ++b) {
    auto& blk = const_cast<models::Model&>(*model_).block(b);
    costs.push_back({blk.flops_per_sample(), uint64_t(blk.param_count()) * sizeof(float), 0});
  }
  elastic::PlanOptions o;
  o.pipeline_stages = uint32_t(spec_.pipeline_stages);
  o.global_batch = uint64_t(spec_.global_batch);
  o.micro_batches = uint32_t(std::max<int64_t>(
      1, (spec_.global_batch + spec_.micro_batch - 1) / std::max<int64_t>(1, spec_.micro_batch)));
  o.max_params_per_worker = uint64_t(spec_.max_params_per_worker) * sizeof(float);
  elastic::Plan p = elastic::plan_pipeline(world, costs, o);
  if (!p.ok)
    throw std::invalid_argument("no pipeline layout for " + std::to_string(world) +
                                " worker(s): " + p.reason);
  return p;
}

std::string Worker::describe(const elastic::Plan& p) {
  std::string s = "dp " + std::to_string(p.dp) + " x pp " + std::to_string(p.pp) + ", stages";
  for (uint32_t st = 0; st < p.pp; ++st)
    s += " [" + std::to_string(p.stage_block_begin(st)) + "," +
         std::to_string(p.stage_block_end(st)) + ")";
  return s;
}

std::pair<uint32_t, uint32_t> Worker::owned(const elastic::Plan& plan, uint32_t rank) const {
  auto where = elastic::placement_of_rank(plan, rank);
  if (where.standby) return {0, 0};
  if (plan.pp == 1) return {0, uint32_t(model_->num_blocks())};
  return {plan.stage_block_begin(where.stage), plan.stage_block_end(where.stage)};
}

std::vector<uint32_t> Worker::snapshot_blocks() const {
  std::vector<uint32_t> out;
  for (uint32_t b = 0; b < snap_at_.size(); ++b)
    if (next_step_ > 0 && snap_at_[b] == next_step_ - 1) out.push_back(b);
  return out;
}

std::vector<uint32_t> Worker::backup_blocks() const {
  std::vector<uint32_t> out;
  for (uint32_t b = 0; b < backed_up_.size(); ++b)
    if (backed_up_[b]) out.push_back(b);
  return out;
}

// Every stage sends its blocks' state to the next stage's worker (cyclically, same replica) and
// keeps a copy of its own: stage 0 sends first, every other stage receives first, so the chain
// of blocking sends always has a receiver ready.
void Worker::take_backups(comm::Communicator& comm, const elastic::Plan& plan, uint32_t stage,
                          uint32_t replica) {
  constexpr comm::Tag kBackupTag = tags::kBackup;
  const uint32_t pp = plan.pp;
  const int to = int(elastic::rank_of(plan, (stage + 1) % pp, replica));
  const int from = int(elastic::rank_of(plan, (stage + pp - 1) % pp, replica));
  const uint32_t prev_stage = (stage + pp - 1) % pp;
  auto copy_of = [&](uint32_t b) -> std::vector<models::Tensor>& {
    auto sizes = state_sizes(b);  // (the previous stage's moments are not allocated here)
    auto& copy = backup_[b];
    if (copy.size() != sizes.size()) copy.assign(sizes.size(), models::Tensor());
    for (size_t i = 0; i < sizes.size(); ++i)
      if (copy[i].numel() != sizes[i]) copy[i] = models::Tensor({sizes[i]});
    return copy;
  };
  std::fill(backed_up_.begin(), backed_up_.end(), false);
  auto send_own = [&] {
    for (uint32_t b = plan.stage_block_begin(stage); b < plan.stage_block_end(stage); ++b)
      for (auto* buf : state_buffers(b)) comm.send(buf->data(), buf->numel() * 4, to, kBackupTag);
  };
  auto recv_prev = [&] {
    for (uint32_t b = plan.stage_block_begin(prev_stage); b < plan.stage_block_end(prev_stage);
         ++b) {
      for (auto& t : copy_of(b)) comm.recv(t.data(), t.numel() * 4, from, kBackupTag);
      backed_up_[b] = true;
    }
  };
  if (stage == 0) {
    send_own();
    recv_prev();
  } else {
    recv_prev();
    send_own();
  }
  for (uint32_t b = plan.stage_block_begin(stage); b < plan.stage_block_end(stage); ++b) {
    auto bufs = state_buffers(b);
    auto& copy = copy_of(b);
    for (size_t i = 0; i < bufs.size(); ++i)
      std::memcpy(copy[i].data(), bufs[i]->data(), bufs[i]->numel() * sizeof(float));
    backed_up_[b] = true;
  }
  backup_step_ = next_step_;
}

std::vector<size_t> Worker::state_sizes(uint32_t b) {
  const size_t n = model_->block(b).param_count();
  return opt_->has_v() ? std::vector<size_t>{n, n, n} : std::vector<size_t>{n, n};
}

std::vector<models::Tensor*> Worker::state_buffers(uint32_t b) {
  opt_->ensure(b);
  std::vector<models::Tensor*> out{&model_->block(b).params(), &opt_->m(b)};
  if (opt_->has_v()) out.push_back(&opt_->v(b));
  return out;
}

void Worker::snapshot(uint32_t b) {
  auto bufs = state_buffers(b);
  auto& snap = snap_[b];
  if (snap.size() != bufs.size()) snap.assign(bufs.size(), models::Tensor());
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (snap[i].numel() != bufs[i]->numel()) snap[i] = models::Tensor({bufs[i]->numel()});
    std::memcpy(snap[i].data(), bufs[i]->data(), bufs[i]->numel() * sizeof(float));
  }
  snap_at_[b] = next_step_;
}

std::vector<uint32_t> Worker::held_blocks() const {
  std::vector<uint32_t> out;
  for (uint32_t b = 0; b < held_at_.size(); ++b)
    if (held_at_[b] == next_step_) out.push_back(b);
  return out;
}

TrainResult Worker::run(comm::Communicator& comm, uint64_t start,
                        const std::function<void(const StepInfo&)>& on_step,
                        const std::function<bool()>& stop_requested) {
  if (spec_.pipeline_stages != 1 && plan_for(uint32_t(comm.size())).pp > 1)
    return run_pipeline(comm, start, on_step, stop_requested);
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
    test_hooks(step);
    models::StepStats stats;
    const auto compute_start = std::chrono::steady_clock::now();
    double busy = 0;
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
      busy =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - compute_start).count();
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
    info.busy_seconds = busy;
    next_step_ = step + 1;
    for (auto& h : held_at_) h = next_step_;
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

// One step of a pipeline stage (1F1B, as Megatron's schedule without interleaving): the stage
// runs min(pp - stage - 1, M) forwards to fill the pipeline, then alternates one forward and one
// backward, then drains the remaining backwards. Activations go to the next stage and gradients
// come back with one sendrecv per exchange, so neighbours never block each other. The blocks'
// forward caches of a micro-batch whose backward has not run are put away (Block::save) before
// the next forward and put back for its backward: at most pp - stage micro-batches in flight.
// With recompute_activations the blocks keep one and the backward of micro-batch i recomputes its
// forward from the saved stage input (the same numbers, one more forward). The last stage scores
// the loss.
TrainResult Worker::run_pipeline(comm::Communicator& comm, uint64_t start,
                                 const std::function<void(const StepInfo&)>& on_step,
                                 const std::function<bool()>& stop_requested) {
  TrainResult result{start, false};
  const elastic::Plan plan = plan_for(uint32_t(comm.size()));
  const uint32_t me = uint32_t(comm.rank());
  const auto where = elastic::placement_of_rank(plan, me);
  const auto [first, last] = owned(plan, me);
  const uint32_t pp = plan.pp, dp = plan.dp, s = where.stage, r = where.replica;
  const bool active = !where.standby;
  const int prev = active && s > 0 ? int(elastic::rank_of(plan, s - 1, r)) : -1;
  const int next = active && s + 1 < pp ? int(elastic::rank_of(plan, s + 1, r)) : -1;
  std::vector<int> group;  // this stage's replicas, in replica order
  if (active)
    for (uint32_t k = 0; k < dp; ++k) group.push_back(int(elastic::rank_of(plan, s, k)));
  constexpr comm::Tag kPipeTag = tags::kPipeline, kReplicaTag = 4;
  const uint64_t B = uint64_t(spec_.global_batch), micro = uint64_t(spec_.micro_batch);
  const elastic::Share share = active ? elastic::data_share(B, r, dp) : elastic::Share{};
  // A block's output for n samples: its one-sample shape with dim 0 scaled (rows of (B, D) or
  // (B*T, C), or the batch of (B, T, C)).
  auto with_batch = [](std::vector<size_t> shape, size_t n) {
    shape.at(0) *= n;
    return shape;
  };
  models::Tensor scratch;
  // A stage without a replica is backed up at the start of every generation too (not only every
  // stage_backup_steps): losing it before the first interval (or after a re-plan) goes back to
  // here instead of failing the job.
  const bool backups = active && dp == 1 && spec_.stage_backup_steps > 0;
  if (backups && start < spec_.steps) take_backups(comm, plan, s, r);
  for (uint64_t step = start; step < spec_.steps; ++step) {
    auto t0 = std::chrono::steady_clock::now();
    test_hooks(step);
    double loss = 0;
    double norm_sq = 0;
    double busy = 0;  // seconds computing (forward, recompute, loss, backward)
    if (active) {
      for (uint32_t b = first; b < last; ++b) model_->block(b).grads().zero();
      std::vector<std::pair<uint64_t, uint64_t>> mbs;  // [begin, end) of each micro-batch
      for (uint64_t at = share.begin; at < share.end; at += micro)
        mbs.push_back({at, std::min(share.end, at + micro)});
      const size_t M = mbs.size();
      auto rows = [&](size_t j) { return size_t(mbs[j].second - mbs[j].first); };
      std::vector<models::Tensor> saved(M);
      std::vector<models::Batch> batches(M);
      int cached = -1;  // the micro-batch whose forward the stage's blocks hold
      // The forward caches of micro-batches in flight (at most pp - s), unless recomputed.
      std::vector<std::vector<models::Block::Saved>> stash(M);
      auto put_away = [&] {  // the blocks' cache of micro-batch `cached`, kept for its backward
        if (cached < 0 || spec_.recompute_activations) return;
        for (uint32_t b = first; b < last; ++b)
          stash[size_t(cached)].push_back(model_->block(b).save());
        cached = -1;
      };
      auto input = [&](size_t j) -> models::Tensor {  // the stage input, for s == 0
        batches[j] = trainer_->batch(step, mbs[j].first, mbs[j].second);
        return batches[j].inputs;
      };
      auto empty_in = [&](size_t j) {
        return models::Tensor(with_batch(out_shape_[first - 1], rows(j)));
      };
      auto empty_out = [&](size_t j) {
        return models::Tensor(with_batch(out_shape_[last - 1], rows(j)));
      };
      auto forward = [&](size_t j, models::Tensor x) {
        put_away();
        Busy timer(busy);
        saved[j] = x;
        for (uint32_t b = first; b < last; ++b) x = model_->block(b).forward(x, rows(j));
        cached = int(j);
        return x;
      };
      // The loss gradient of the model's output for micro-batch j (last stage).
      auto score = [&](size_t j, const models::Tensor& logits) {
        if (batches[j].targets.empty())
          batches[j] = trainer_->batch(step, mbs[j].first, mbs[j].second);
        Busy timer(busy);
        const auto& targets = batches[j].targets;
        const size_t n = targets.size(), classes = logits.numel() / n;
        models::Tensor d({n, classes});
        size_t correct = 0;
        loss += models::kernels::softmax_cross_entropy(d.data(), logits.data(), targets.data(), n,
                                                       classes, trainer_->loss_scale(), &correct);
        return d;
      };
      auto backward = [&](size_t j, models::Tensor dy) {
        if (cached != int(j) && !stash[j].empty()) {
          put_away();
          for (uint32_t b = first; b < last; ++b) model_->block(b).restore(stash[j][b - first]);
          stash[j].clear();
          cached = int(j);
        }
        if (cached != int(j)) forward(j, saved[j]);  // recompute
        Busy timer(busy);
        for (uint32_t b = last; b-- > first;) dy = model_->block(b).backward(dy);
        saved[j] = models::Tensor();
        cached = -1;
        return dy;
      };
      auto bytes = [](const models::Tensor& t) { return t.numel() * sizeof(float); };
      auto recv_forward = [&](size_t j) {
        if (prev < 0) return input(j);
        models::Tensor x = empty_in(j);
        comm.recv(x.data(), bytes(x), prev, kPipeTag);
        return x;
      };
      const size_t warmup = std::min<size_t>(pp - s - 1, M);
      for (size_t j = 0; j < warmup; ++j) {
        models::Tensor y = forward(j, recv_forward(j));
        comm.send(y.data(), bytes(y), next, kPipeTag);
      }
      models::Tensor x = M > warmup ? recv_forward(warmup) : models::Tensor();
      for (size_t i = 0; i + warmup < M; ++i) {
        const size_t j = warmup + i;
        models::Tensor y = forward(j, x);
        models::Tensor dy;
        if (next < 0) {
          dy = score(i, y);  // j == i on the last stage
        } else {
          dy = empty_out(i);
          comm.sendrecv(y.data(), bytes(y), next, dy.data(), bytes(dy), next, kPipeTag);
        }
        models::Tensor dx = backward(i, dy);
        if (j + 1 < M) {
          if (prev < 0) {
            x = input(j + 1);
          } else {
            x = empty_in(j + 1);
            comm.sendrecv(dx.data(), bytes(dx), prev, x.data(), bytes(x), prev, kPipeTag);
          }
        } else if (prev >= 0) {
          comm.send(dx.data(), bytes(dx), prev, kPipeTag);
        }
      }
      for (size_t i = M - warmup; i < M; ++i) {
        models::Tensor dy = empty_out(i);
        comm.recv(dy.data(), bytes(dy), next, kPipeTag);
        models::Tensor dx = backward(i, dy);
        if (prev >= 0) comm.send(dx.data(), bytes(dx), prev, kPipeTag);
      }
      // Data parallelism among the stage's replicas: replica 0 adds the others' gradients in
      // replica order and sends the sum back (every replica ends with the same bits).
      for (uint32_t b = first; b < last && dp > 1; ++b) {
        auto& g = model_->block(b).grads();
        const size_t n = g.numel();
        if (r == 0) {
          if (scratch.numel() < n) scratch = models::Tensor({n});
          for (uint32_t k = 1; k < dp; ++k) {
            comm.recv(scratch.data(), n * sizeof(float), group[k], kReplicaTag);
            float* gd = g.data();
            const float* sd = scratch.data();
            for (size_t e = 0; e < n; ++e) gd[e] += sd[e];
          }
          for (uint32_t k = 1; k < dp; ++k)
            comm.send(g.data(), n * sizeof(float), group[k], kReplicaTag);
        } else {
          comm.send(g.data(), n * sizeof(float), group[0], kReplicaTag);
          comm.recv(g.data(), n * sizeof(float), group[0], kReplicaTag);
        }
      }
      if (r == 0)
        for (uint32_t b = first; b < last; ++b)
          norm_sq += models::grad_norm_sq(model_->block(b).grads());
    }
    // One allreduce over everyone: the loss (last stages), the stop vote and the squared
    // gradient norm (one replica of each stage), so every rank clips by the same global norm.
    double control[3] = {loss, stop_requested() ? 1.0 : 0.0, norm_sq};
    comm.allreduce(control, control, 3, comm::DataType::f64, comm::ReduceOp::sum);
    models::StepStats stats;
    stats.loss = control[0];
    if (active) {
      for (uint32_t b = first; b < last; ++b) snapshot(b);  // the state as of `step`
      trainer_->apply_blocks(step, control[2], first, last, stats);
    }
    StepInfo info;
    info.step = step;
    info.loss = control[0];
    // The samples are counted once, by the first stage of each pipeline.
    const bool counts = active && s == 0;
    info.position_begin = step * B + (counts ? share.begin : 0);
    info.position_end = step * B + (counts ? share.end : 0);
    info.samples = counts ? share.size() : 0;
    info.tokens = info.samples * (spec_.data_kind == "text" ? uint64_t(spec_.model.context) : 1);
    info.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    info.busy_seconds = busy;
    next_step_ = step + 1;
    for (uint32_t b = first; b < last; ++b) held_at_[b] = next_step_;
    if (backups && next_step_ % uint64_t(spec_.stage_backup_steps) == 0)
      take_backups(comm, plan, s, r);
    on_step(info);
    result.next_step = step + 1;
    if (control[1] > 0) {
      result.stopped = true;
      break;
    }
  }
  // At the job's last step everyone ends with every block's parameters (replica 0 of each stage
  // sends its own), so the members' checksums compare whole models; optimizer state stays with
  // the owners. Not when stopped (a membership change, or a stop): that would back the whole
  // model in every worker, which a model split for memory may not fit.
  for (uint32_t st = 0; st < pp && !result.stopped; ++st)
    for (uint32_t b = plan.stage_block_begin(st); b < plan.stage_block_end(st); ++b) {
      auto& p = model_->block(b).params();
      comm.broadcast(p.data(), p.numel(), comm::DataType::f32, int(elastic::rank_of(plan, st, 0)));
    }
  comm.barrier();
  return result;
}

void Worker::test_hooks(uint64_t step) {
  if (spec_.test_throw_at_step > 0 && step + 1 == spec_.test_throw_at_step) {
    spec_.test_throw_at_step = 0;  // once per worker
    throw std::runtime_error("injected fault at step " + std::to_string(step) +
                             " (TROUPE_TEST_THROW_AT_STEP)");
  }
  if (spec_.test_step_delay_us > 0)
    std::this_thread::sleep_for(std::chrono::microseconds(spec_.test_step_delay_us));
}

StateTransfer Worker::take_state(comm::Communicator& comm, uint64_t start_step,
                                 const std::vector<MemberState>& members) {
  StateTransfer t;
  const auto t0 = std::chrono::steady_clock::now();
  const int me = comm.rank(), n = comm.size();
  const elastic::Plan plan = spec_.pipeline_stages == 1 ? elastic::Plan{} : plan_for(uint32_t(n));
  auto owns = [&](int r, uint32_t b) {
    // Pure data parallelism (also a pp = 1 plan, whose placement standbys train too): all.
    if (spec_.pipeline_stages == 1 || plan.pp == 1) return true;
    auto [first, last] = owned(plan, uint32_t(r));
    return b >= first && b < last;
  };
  auto in = [](const std::vector<uint32_t>& v, uint32_t b) {
    return std::find(v.begin(), v.end(), b) != v.end();
  };
  auto live = [&](int r, uint32_t b) {  // r holds b as of start_step in its live buffers
    const MemberState& m = members.at(size_t(r));
    return m.applied == start_step && in(m.held, b);
  };
  auto snapped = [&](int r, uint32_t b) {  // ... in its snapshot
    const MemberState& m = members.at(size_t(r));
    return m.applied == start_step + 1 && in(m.snapshot, b);
  };
  auto backed = [&](int r, uint32_t b) {  // ... in its stage backups
    const MemberState& m = members.at(size_t(r));
    return m.backup_step == start_step && in(m.backup, b);
  };
  // The copy of block b's state as of start_step this worker holds (live, snapshot or backup).
  auto own_copy = [&](uint32_t b, size_t i) -> float* {
    if (live(me, b)) {
      materialize(b);  // (held as of step 0: made from the seed when first needed)
      return state_buffers(b)[i]->data();
    }
    if (snapped(me, b)) return snap_[b][i].data();
    return backup_[b][i].data();
  };
  auto restore = [&](uint32_t b) {  // this worker's copy becomes its live state
    auto bufs = state_buffers(b);
    for (size_t i = 0; i < bufs.size(); ++i)
      std::memcpy(bufs[i]->data(), own_copy(b, i), bufs[i]->numel() * sizeof(float));
    held_at_[b] = start_step;
    pending_init_[b] = false;
  };
  constexpr comm::Tag kStateTag = tags::kState;
  // Every member computes the same list: for each block, who restores it from its own copy and
  // who receives it from the lowest-ranked holder.
  struct Move {
    uint32_t block;
    int from, to;
  };
  std::vector<Move> moves;
  for (uint32_t b = 0; b < model_->num_blocks(); ++b) {
    int source = -1;
    for (int r = 0; r < n && source < 0; ++r)
      if (live(r, b) || snapped(r, b) || backed(r, b)) source = r;
    for (int r = 0; r < n; ++r) {
      if (!owns(r, b) || live(r, b)) continue;
      if (snapped(r, b) || backed(r, b)) {  // rolls back to its own copy
        if (r == me) restore(b);
        continue;
      }
      if (source < 0)
        throw StateLost("block " + std::to_string(b) + " is held by no member at step " +
                        std::to_string(start_step) +
                        " (its pipeline stage had no replica and no backup)");
      moves.push_back({b, source, r});
    }
    if (owns(me, b) && live(me, b)) {
      materialize(b);
      held_at_[b] = start_step;
    }
  }
  // One batch per (source, receiver) pair, every buffer in flight at once, the pairs in the same
  // order everywhere: the first unfinished batch always has both ends at it, so blocking calls
  // cannot deadlock.
  std::vector<std::pair<int, int>> pairs;
  for (auto& mv : moves)
    if (std::find(pairs.begin(), pairs.end(), std::make_pair(mv.from, mv.to)) == pairs.end())
      pairs.push_back({mv.from, mv.to});
  for (auto [from, to] : pairs) {
    if (me != from && me != to) continue;
    std::vector<comm::Span> spans;
    std::vector<uint32_t> received;
    for (auto& mv : moves) {
      if (mv.from != from || mv.to != to) continue;
      auto bufs = state_buffers(mv.block);
      for (size_t i = 0; i < bufs.size(); ++i) {
        const size_t bytes = bufs[i]->numel() * sizeof(float);
        spans.push_back({me == from ? own_copy(mv.block, i) : bufs[i]->data(), bytes});
      }
      if (me == to) {
        ++t.blocks;
        received.push_back(mv.block);
      }
    }
    if (me == from) {
      size_t first = 0;
      if (spec_.test_state_delay_ms > 0 && !spans.empty()) {  // a transfer caught in the middle
        comm.send(spans[0].data, spans[0].bytes, to, kStateTag);
        std::this_thread::sleep_for(std::chrono::milliseconds(spec_.test_state_delay_ms));
        first = 1;
      }
      comm.send_many(std::vector<comm::Span>(spans.begin() + long(first), spans.end()), to,
                     kStateTag);
    } else {
      comm.recv_many(spans, from, kStateTag);
      t.needed = true;
      for (auto& sp : spans) t.bytes += sp.bytes;
      // Held only once all of it is here (a transfer that fails half way leaves it stale).
      for (uint32_t b : received) {
        held_at_[b] = start_step;
        pending_init_[b] = false;
      }
    }
  }
  // A pipeline worker keeps parameters, gradients and optimizer moments for its own blocks only.
  if (spec_.pipeline_stages != 1 && plan.pp > 1)
    for (uint32_t b = 0; b < model_->num_blocks(); ++b)
      if (!owns(me, b)) {
        opt_->release(b);
        model_->block(b).discard();  // (lazy buffers: their memory goes back)
        pending_init_[b] = false;
        held_at_[b] = kStale;
        snap_at_[b] = kStale;
        snap_[b].clear();
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
