#include "workers/worker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <tuple>

#include "comm/checksum.h"
#include "elastic/membership.h"
#include "models/blas_kernels.h"
#include "models/devices.h"
#include "models/kernels.h"
#include "models/peak.h"
#include "models/state.h"
#include "workers/datasets.h"
#include "workers/gradient_sum.h"
#include "workers/host_staging.h"
#include "workers/pipeline_stage.h"
#include "workers/reducer.h"
#include "workers/registered_gradients.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The device worker spec.device computes on (cpu:N, cuda:N), or the stand-in a test's faults
// give. (The command line checked the device before the agent joined.)
std::shared_ptr<models::Compute> open_device(const WorkerSpec& spec) {
  if (spec.faults)
    if (auto d = spec.faults->device_for(spec.agent_name, spec.device_index)) return d;
  return models::open_compute(spec.device, spec.bf16);
}

}  // namespace

Worker::Worker(const WorkerSpec& spec) : spec_(spec), trace_(spec.trace_first, spec.trace_last) {
  models::set_compute_threads(spec.threads);
  const char* alone = std::getenv("TROUPE_BLAS_RESTARTED");
  spdlog::info("worker {}: BLAS {}{}", spec.device, models::blas_summary(),
               alone ? std::string("; OpenBLAS alone chose ") + alone : std::string());
  if (spec_.faults)
    writer_.set_mid_write(
        [this] { spec_.faults->mid_checkpoint_write(spec_.agent_name, spec_.device_index); });
  models::ModelSpec m = spec.model;
  data_ = open_dataset(spec, m);
  eval_ = open_eval_set(spec, *data_);
  // A pipeline worker builds every block lazily (no memory until written) and backs, initialises
  // and keeps only those of its stage (take_state); a data-parallel one has them all at once.
  {
    std::optional<models::LazyParameters> lazy;
    if (pipelined()) lazy.emplace();
    if (spec.faults) spec.faults->model(spec.agent_name, spec.device_index, m);
    model_ = build_model(spec, m, *data_);
    check_model();
    opt_ = std::make_unique<models::Optimizer>(spec.optimizer, model_->block_param_counts());
  }
  device_ = open_device(spec);
  model_->to(*device_);
  opt_->to(*device_);
  share_gradients();
  if (device_->device() != models::Device::cpu || spec.bf16)
    spdlog::info("worker {}: computes on {}", spec.device, device_->describe());
  peak_ = spec.peak_tflops > 0 ? models::given_peak(spec.peak_tflops) : device_->peak(spec.threads);
  spdlog::info("worker {}: peak for MFU: {}", spec.device, peak_.what);
  BlockStates::Origin origin{spec.init_state, spec.seed, spec.resume_dir, spec.resume_step};
  states_ = std::make_unique<BlockStates>(*model_, *opt_, origin, pipelined());
  if (spec.init_state) next_step_ = spec.resume_step;
  backups_ = std::make_unique<StageBackups>(num_blocks());
  trainer_ = std::make_unique<models::Trainer>(*model_, *opt_, *data_, spec.seed,
                                               size_t(spec.global_batch), size_t(spec.micro_batch));
  // (Not for the exact path: it takes one global micro-batch a call, never the range expected.)
  if (!pipelined() && !spec.deterministic) trainer_->enable_prefetch();
  // The shape of each block's output for one sample: one sample through the model (a block that
  // cannot take its input is named here, as in training).
  models::Batch one = trainer_->batch(0, 0, 1);
  models::Tensor x = one.inputs;
  for (size_t b = 0; b < model_->num_blocks(); ++b) {
    x = model_->forward_block(b, x, 1);
    out_shape_.push_back(x.shape());
  }
  if (!pipelined()) model_->zero_grads();  // (lazy gradients read zeros already)
}

void Worker::share_gradients() {
  if (device_->device() != models::Device::cpu) return;  // (summed on the device plane)
  std::string why;
  gradient_arena_ = register_gradients(*model_, {spec_.deterministic, spec_.reduce_bf16}, &why);
  in_place_ = InPlaceBuffers(gradient_arena_);
  if (!gradient_arena_)
    spdlog::warn("worker {}: gradients not in shared memory ({}): the others stage copies of them",
                 spec_.device, why);
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

elastic::BlockRange Worker::owned(const elastic::Plan& plan, uint32_t rank) const {
  // Pure data parallelism (also a pp = 1 plan, whose placement standbys train too): all.
  if (!pipelined() || plan.pp == 1) return {0, num_blocks()};
  auto where = elastic::placement_of_rank(plan, rank);
  if (where.standby) return {0, 0};
  return {plan.stage_block_begin(where.stage), plan.stage_block_end(where.stage)};
}

elastic::Holding Worker::holding() const {
  elastic::Holding h = states_->holding(next_step_);
  backups_->describe(h);
  return h;
}

void Worker::before_step(uint64_t step) {
  if (spec_.faults) spec_.faults->before_step(spec_.agent_name, spec_.device_index, step);
}

StepInfo Worker::step_info(uint64_t step, double loss, elastic::Share share, double seconds,
                           double busy, double flops) const {
  const uint64_t B = uint64_t(spec_.global_batch);
  StepInfo info;
  info.step = step;
  info.loss = loss;
  info.position_begin = step * B + share.begin;
  info.position_end = step * B + share.end;
  info.samples = share.size();
  info.tokens = info.samples * uint64_t(data_->targets_per_sample());
  info.epoch_samples = data_->size();
  info.seconds = seconds;
  info.busy_seconds = busy;
  info.flops = flops;
  return info;
}

TrainResult Worker::run(comm::Communicator& comm, uint64_t start, const OnStep& on_step,
                        const Requests& requests) {
  end_group_ = 0;
  end_blocks_ = {0, num_blocks()};
  if (pipelined() && plan_for(uint32_t(comm.size())).pp > 1)
    return run_pipeline(comm, start, on_step, requests);
  return run_data_parallel(comm, start, on_step, requests);
}

// Forward + backward over this rank's positions (weights 1/B: shares add up), one allreduce per
// block's flat gradient buffer (or each on the reducer thread as soon as its backward is done,
// in reverse block order: the same order on every rank), the loss and the votes, the update.
TrainResult Worker::run_data_parallel(comm::Communicator& comm, uint64_t start,
                                      const OnStep& on_step, const Requests& requests) {
  TrainResult result{start, false};
  const elastic::Share share = share_of(uint32_t(comm.rank()), uint32_t(comm.size()));
  ExactSum exact(*model_, 0, num_blocks(), micro_batches(), &in_place_);
  std::vector<uint32_t> written;  // the blocks this rank writes into checkpoints
  for (uint32_t b = uint32_t(comm.rank()); b < num_blocks(); b += uint32_t(comm.size()))
    written.push_back(b);
  uint64_t at_step = start;             // (for the reductions' trace spans)
  const bool alone = comm.size() == 1;  // (nothing to sum)
  GradientSum sums(*model_, spec_.reduce_bf16, std::chrono::milliseconds(spec_.failure_timeout_ms),
                   &in_place_);
  auto reduce_block = [&](size_t b) {
    const int64_t r0 = StepTrace::now_us();
    const bool on_device = sums.reduce(b, comm, device_plane_);
    trace_.span(at_step, on_device ? "allreduce (device plane)" : "allreduce", "comm", r0,
                spec_.overlap_reduce ? 1 : 0);
  };
  if (start == spec_.steps) checkpoint_the_end_again(written);
  for (uint64_t step = start; step < spec_.steps; ++step) {
    const auto t0 = Clock::now();
    const int64_t t0_us = StepTrace::now_us();
    at_step = step;
    std::pair<double, uint64_t> eval{0, 0};
    if (eval_ && step % uint64_t(spec_.eval_every) == 0) {
      const int64_t e0 = StepTrace::now_us();
      eval = evaluate(comm);
      trace_.span(step, "evaluate", "compute", e0);
    }
    before_step(step);
    models::StepStats stats;
    double busy = 0;
    if (spec_.deterministic) {
      stats = forward_backward_exact(comm, exact, step, share);
      busy = seconds_since(t0);
    } else if (spec_.overlap_reduce && !alone) {
      // Block b's reduction starts once its backward is done (on a device: its fence reached)
      // while the backward of the blocks before it goes on.
      Reducer reducer(reduce_block);
      stats = trainer_->forward_backward(step, share.begin, share.end, [&](size_t b) {
        sums.prepare(b, device_plane_);
        reducer.push(b);
      });
      busy = seconds_since(t0);  // (the reductions overlapped it; what is left is waiting)
      reducer.finish();
      sums.finish();
    } else {
      stats = trainer_->forward_backward(step, share.begin, share.end);
      busy = seconds_since(t0);
      for (size_t b = model_->num_blocks(); b-- > 0 && !alone;) {
        sums.prepare(b, device_plane_);
        reduce_block(b);
      }
      sums.finish();
    }
    trace_compute(step, t0_us, stats);
    const int64_t v0 = StepTrace::now_us();
    double control[4] = {stats.loss, requests.stop() ? 1.0 : 0.0,
                         checkpoint_voted(requests, requested_through_, step) ? 1.0 : 0.0,
                         writer_busy_vote()};
    comm.allreduce(control, control, 4, comm::DataType::f64, comm::ReduceOp::sum);
    trace_.span(step, "vote (loss, stop, checkpoint)", "wait", v0);
    if (spec_.deterministic) control[0] = loss_from_fixed_point(control[0]);
    // Update: the same clipped step everywhere (the gradients are identical after the sum).
    double norm_sq = 0;
    for (size_t b = 0; b < model_->num_blocks(); ++b)
      norm_sq += models::grad_norm_sq(model_->block(b).grads());
    check_finite(step, control[0], norm_sq);
    const int64_t u0 = StepTrace::now_us();
    update(step, norm_sq, stats);
    trace_.span(step, "update", "compute", u0);
    next_step_ = step + 1;
    for (uint32_t b = 0; b < num_blocks(); ++b) states_->hold(b, next_step_);
    maybe_checkpoint(written, control[2] > 0, control[3] > 0);
    StepInfo info = step_info(step, control[0], share, seconds_since(t0), busy,
                              model_->flops_per_sample() * double(share.size()));
    info.data_seconds = stats.data_seconds;
    std::tie(info.eval_loss, info.eval_tokens) = eval;
    on_step(info);
    report_trace(false);
    result.next_step = step + 1;
    if (control[1] > 0) {
      result.stopped = true;
      break;
    }
  }
  // (Completed: its final parameters evaluated too, the ones a user exports.)
  if (eval_ && !result.stopped && result.next_step == spec_.steps)
    std::tie(result.eval_loss, result.eval_tokens) = evaluate(comm);
  comm.barrier();  // nobody leaves while another still waits on it
  report_trace(true);
  return result;
}

std::pair<double, uint64_t> Worker::evaluate(comm::Communicator& comm) {
  const size_t T = eval_->context(), m = size_t(spec_.micro_batch);
  const uint64_t windows = eval_->eval_windows(), groups = (windows + m - 1) / m;
  constexpr double kScale = 65536.0;
  double sums[2] = {0, 0};  // fixed-point loss, tokens: integers
  models::Batch b;
  for (uint64_t g = uint64_t(comm.rank()); g < groups; g += uint64_t(comm.size())) {
    const uint64_t first = g * m, n = std::min<uint64_t>(m, windows - first);
    b.size = size_t(n);
    b.inputs = models::Tensor({b.size, T});
    b.targets.resize(b.size * T);
    for (uint64_t i = 0; i < n; ++i)
      eval_->fill_eval(first + i, b.inputs.data() + i * T, b.targets.data() + i * T);
    const models::ForwardResult r = model_->evaluate(b);
    sums[0] += std::nearbyint(r.loss * double(r.rows) * kScale);
    sums[1] += double(r.rows);
  }
  comm.allreduce(sums, sums, 2, comm::DataType::f64, comm::ReduceOp::sum);
  return {sums[1] > 0 ? sums[0] / kScale / sums[1] : 0.0, uint64_t(sums[1])};
}

void Worker::trace_compute(uint64_t step, int64_t start_us, const models::StepStats& stats) {
  if (!trace_.tracing(step)) return;
  int64_t at = start_us;
  for (auto [name, cat, seconds] : {std::tuple{"data", "data", stats.data_seconds},
                                    std::tuple{"forward", "compute", stats.forward_seconds},
                                    std::tuple{"backward", "compute", stats.backward_seconds}}) {
    trace_.span_of(step, name, cat, at, seconds);
    at += int64_t(seconds * 1e6);
  }
}

void Worker::report_trace(bool run_ended) {
  auto events = trace_.take_if_done(next_step_, run_ended);
  if (!events.empty() && on_trace_) on_trace_(std::move(events));
}

models::StepStats Worker::forward_backward_exact(comm::Communicator& comm, ExactSum& exact,
                                                 uint64_t step, elastic::Share share) {
  models::StepStats stats;
  const uint64_t micro = uint64_t(spec_.micro_batch);
  for (uint64_t at = share.begin; at < share.end; at += micro) {
    if (at != share.begin) exact.keep();
    stats.loss += fixed_point_loss(trainer_->forward_backward(step, at, at + micro).loss);
  }
  exact.reduce(comm, share.size() > 0);
  stats.samples = share.size();
  return stats;
}

elastic::Share Worker::share_of(uint32_t r, uint32_t n) const {
  const uint64_t B = uint64_t(spec_.global_batch);
  return spec_.deterministic ? elastic::micro_batch_share(B, uint64_t(spec_.micro_batch), r, n)
                             : elastic::data_share(B, r, n);
}

// The steps of a pipeline stage: its part of the 1F1B schedule (PipelineStage), its replicas'
// gradients summed in their own group (every replica ends with the same bits), then one
// allreduce over everyone of the loss (from the last stages), the votes and the squared
// gradient norm (from one replica of each stage), so every stage clips by the global norm.
// Standbys take part in that allreduce only.
TrainResult Worker::run_pipeline(comm::Communicator& comm, uint64_t start, const OnStep& on_step,
                                 const Requests& requests) {
  TrainResult result{start, false};
  const elastic::Plan plan = plan_for(uint32_t(comm.size()));
  const uint32_t me = uint32_t(comm.rank());
  const auto where = elastic::placement_of_rank(plan, me);
  const auto mine = owned(plan, me);
  const uint32_t s = where.stage, r = where.replica;
  const bool active = !where.standby;
  auto replicas = comm.split(active ? int(s) : -1, int(r));  // (collective: every member)
  // The device plane's groups too (collective on it): the replicas' gradients summed in place.
  std::unique_ptr<comm::Communicator> device_replicas;
  if (device_plane_) device_replicas = device_plane_->split(active ? int(s) : -1, int(r));
  StageLayout layout{plan.pp, s, mine.begin, mine.end, -1, -1, spec_.recompute_activations};
  if (active && s > 0) layout.prev = int(elastic::rank_of(plan, s - 1, r));
  if (active && s + 1 < plan.pp) layout.next = int(elastic::rank_of(plan, s + 1, r));
  PipelineStage stage(*model_, *trainer_, out_shape_, layout);
  stage.set_device_plane(device_plane_);
  if (device_plane_ && active)
    spdlog::info("worker {}: stage {} of {}: activations and gradients{} over the device plane",
                 spec_.device, s, plan.pp, plan.dp > 1 ? ", the replicas' sums" : "");
  const elastic::Share share = active ? share_of(r, plan.dp) : elastic::Share{};
  double stage_flops = 0;  // per sample, this stage's blocks
  for (uint32_t b = mine.begin; b < mine.end; ++b)
    stage_flops += model_->block(b).flops_per_sample();
  std::vector<uint32_t> written;  // this stage's blocks, spread over its replicas
  for (uint32_t b = mine.begin; active && b < mine.end; ++b)
    if (b % plan.dp == r) written.push_back(b);
  std::unique_ptr<ExactSum> exact;
  if (active && spec_.deterministic)
    exact = std::make_unique<ExactSum>(*model_, mine.begin, mine.end, micro_batches(), &in_place_);
  // A stage without a replica is backed up as every generation starts too: losing it before the
  // first interval (or after a re-plan) goes back to here instead of failing the job.
  const bool backups = active && plan.dp == 1 && spec_.stage_backup_steps > 0;
  if (backups && start < spec_.steps) backups_->take(comm, plan, s, r, *states_, next_step_);
  if (start == spec_.steps) checkpoint_the_end_again(written);
  for (uint64_t step = start; step < spec_.steps; ++step) {
    const auto t0 = Clock::now();
    before_step(step);
    StageStepResult res;
    double norm_sq = 0;
    if (active) {
      for (uint32_t b = mine.begin; b < mine.end; ++b)
        device_->zero(model_->block(b).grads().data(), model_->block(b).grads().bytes());
      const int64_t p0 = StepTrace::now_us();
      res = stage.run(comm, step, share, uint64_t(spec_.micro_batch),
                      exact ? std::function<void()>([&] { exact->keep(); }) : nullptr);
      trace_.span(step, "pipeline stage (1F1B)", "compute", p0);
      if (exact) exact->reduce(*replicas, false);  // (every micro-batch was kept)
      if (plan.dp > 1 && !exact) sum_replicas(mine, *replicas, device_replicas.get());
      if (r == 0)
        for (uint32_t b = mine.begin; b < mine.end; ++b)
          norm_sq += models::grad_norm_sq(model_->block(b).grads());
    }
    if (spec_.deterministic) norm_sq = global_norm_sq_exact(comm, plan, active && r == 0);
    double control[5] = {spec_.deterministic ? res.loss_fixed : res.loss,
                         requests.stop() ? 1.0 : 0.0, spec_.deterministic ? 0.0 : norm_sq,
                         checkpoint_voted(requests, requested_through_, step) ? 1.0 : 0.0,
                         writer_busy_vote()};
    comm.allreduce(control, control, 5, comm::DataType::f64, comm::ReduceOp::sum);
    if (spec_.deterministic)
      control[0] = loss_from_fixed_point(control[0]);
    else
      norm_sq = control[2];
    models::StepStats stats;
    stats.loss = control[0];
    check_finite(step, stats.loss, norm_sq);
    for (uint32_t b = mine.begin; b < mine.end; ++b) states_->snapshot(b, step);
    const int64_t u0 = StepTrace::now_us();
    if (active) update_blocks(step, norm_sq, mine.begin, mine.end, stats);
    trace_.span(step, "update", "compute", u0);
    next_step_ = step + 1;
    for (uint32_t b = mine.begin; b < mine.end; ++b) states_->hold(b, next_step_);
    // (and as a generation ends for a change: a drained stage's next one starts here)
    if (backups && (next_step_ % uint64_t(spec_.stage_backup_steps) == 0 || control[1] > 0))
      backups_->take(comm, plan, s, r, *states_, next_step_);
    maybe_checkpoint(written, control[3] > 0, control[4] > 0);
    // The samples are counted once, by the first stage of each pipeline.
    const elastic::Share counted = active && s == 0 ? share : elastic::Share{};
    on_step(step_info(step, control[0], counted, seconds_since(t0), res.busy,
                      stage_flops * double(share.size())));
    report_trace(false);
    result.next_step = step + 1;
    if (control[1] > 0) {
      result.stopped = true;
      break;
    }
  }
  if (!result.stopped) {
    gather_parameters(comm, plan);
  } else {  // (each holds its stage's blocks only: the replicas of a stage compare)
    end_group_ = active ? 1 + s : kHoldsNoBlocks;
    end_blocks_ = mine;
  }
  comm.barrier();
  report_trace(true);
  return result;
}

void Worker::sum_replicas(elastic::BlockRange blocks, comm::Communicator& host,
                          comm::Communicator* device) {
  if (device) device_->synchronize();  // (NCCL has its own stream)
  for (uint32_t b = blocks.begin; b < blocks.end; ++b) {
    models::Tensor& grads = model_->block(b).grads();
    if (device && grads.device() != models::Device::cpu) {
      device->allreduce(grads.data(), grads.data(), grads.numel(), comm::DataType::f32,
                        comm::ReduceOp::sum);
      continue;
    }
    HostStaged g(grads);
    host.allreduce(g.data(), g.data(), g.count(), comm::DataType::f32, comm::ReduceOp::sum);
    g.store();
  }
}

void Worker::take_checkpoint_result(bool wait) {
  if (wait) writer_.wait();
  auto done = writer_.take_finished();
  if (!done) return;
  for (auto& s : done->buffers) staging_[s.block] = std::move(s.bytes);
  done->buffers.clear();
  if (on_checkpoint_) on_checkpoint_(*done, writing_generation_);
}

bool checkpoint_voted(const Requests& requests, uint64_t requested_through, uint64_t step) {
  if (requests.checkpoint_at_stop && requests.checkpoint_at_stop()) return true;
  const uint64_t wanted = requests.checkpoint_at ? requests.checkpoint_at() : 0;
  return wanted > requested_through && wanted <= step + 1;
}

// 1 when this rank's last checkpoint is still being written and periodic ones are skipped then
// (checkpoint.if_busy = "skip"): every rank skips when any is busy, or the others' shards of the
// step make no checkpoint.
double Worker::writer_busy_vote() const {
  return spec_.checkpoint_skip_if_busy && writer_.busy() ? 1.0 : 0.0;
}

void Worker::maybe_checkpoint(const std::vector<uint32_t>& blocks, bool requested, bool any_busy) {
  take_checkpoint_result(false);
  if (requested) requested_through_ = next_step_;  // (also on a rank that writes no block)
  const uint64_t every = uint64_t(spec_.checkpoint_every);
  // (The job's last step too, never skipped, with every_steps = 0 as well: a finished job's
  // parameters, what export reads and what the training was for.)
  const bool last = next_step_ == spec_.steps;
  const bool due = requested || last || (every > 0 && next_step_ % every == 0);
  if (!due || spec_.checkpoint_dir.empty() || blocks.empty() || last_checkpoint_ == next_step_)
    return;
  if (any_busy && spec_.checkpoint_skip_if_busy && !requested && !last) {
    spdlog::warn("checkpoint at step {} skipped: the one before is still being written{}",
                 next_step_, writer_.busy() ? "" : " by another member");
    return;
  }
  take_checkpoint_result(true);
  const auto t0 = Clock::now();
  std::vector<CheckpointWriter::Shard> shards;
  const models::BlockState at{next_step_, next_step_ * uint64_t(spec_.global_batch)};
  for (uint32_t b : blocks) {
    shards.push_back({b, std::move(staging_[b])});
    models::save_block_state_into(shards.back().bytes, model_->block(b), b, *opt_, at);
  }
  trace_.span_of(next_step_ - 1, "checkpoint copy", "state",
                 StepTrace::now_us() - int64_t(seconds_since(t0) * 1e6), seconds_since(t0));
  writer_.start(next_step_, spec_.checkpoint_dir + "/" + checkpoint_dir_name(next_step_),
                std::move(shards), seconds_since(t0));
  writing_generation_ = generation_;
  last_checkpoint_ = next_step_;
}

// A generation formed after the job's last step (a member lost while it wrote its shards of the
// last checkpoint, or one joining then): nothing is left to train, and the members write the last
// step's checkpoint again as this generation spreads the blocks (the one before may lack the
// lost member's shards; a complete one is written again alike).
void Worker::checkpoint_the_end_again(const std::vector<uint32_t>& blocks) {
  last_checkpoint_ = 0;
  maybe_checkpoint(blocks, false, false);
}

void Worker::finish_checkpoints() { take_checkpoint_result(true); }

void Worker::update(uint64_t step, double norm_sq, models::StepStats& stats) {
  update_blocks(step, norm_sq, 0, num_blocks(), stats);
}

void Worker::update_blocks(uint64_t step, double norm_sq, uint32_t first, uint32_t last,
                           models::StepStats& stats) {
  if (auto it = lr_changes_.upper_bound(step); it != lr_changes_.begin())
    opt_->set_lr(std::prev(it)->second);
  trainer_->apply_blocks(step, norm_sq, first, last, stats);
}

// Before a step's update, on every rank alike (the loss and norm are the global ones): a
// non-finite loss or gradient norm is a diverged training, not an update.
void Worker::check_finite(uint64_t step, double loss, double norm_sq) const {
  if (std::isfinite(loss) && std::isfinite(norm_sq)) return;
  const bool by_loss = !std::isfinite(loss);
  throw models::Diverged(
      "the training diverged at step " + std::to_string(step) + ": its " +
      (by_loss ? "loss" : "gradient norm") + " is " +
      (std::isnan(by_loss ? loss : norm_sq) ? "nan" : "infinite") +
      " (its update was not applied; the parameters and checkpoints are those before it: a "
      "smaller optimizer.lr or an optimizer.clip_norm may help)");
}

// The squared gradient norm summed block by block in block order, as a data-parallel worker sums
// it: each block's from one replica of its stage (the others add zeros: exact), gathered by an
// allreduce over everyone (standbys too), then added up the same way on every rank.
double Worker::global_norm_sq_exact(comm::Communicator& comm, const elastic::Plan& plan,
                                    bool reporter) {
  std::vector<double> per_block(num_blocks(), 0.0);
  const auto mine = owned(plan, uint32_t(comm.rank()));
  for (uint32_t b = mine.begin; b < mine.end && reporter; ++b)
    per_block[b] = models::grad_norm_sq(model_->block(b).grads());
  comm.allreduce(per_block.data(), per_block.data(), per_block.size(), comm::DataType::f64,
                 comm::ReduceOp::sum);
  double total = 0;
  for (double v : per_block) total += v;
  return total;
}

// At the job's last step everyone ends with every block's parameters (replica 0 of each stage
// sends its own), so the members' checksums compare whole models; optimizer state stays with
// the owners. Not when stopped (a membership change, or a stop): that would back the whole model
// in every worker, which a model split for memory may not fit.
void Worker::gather_parameters(comm::Communicator& comm, const elastic::Plan& plan) {
  for (uint32_t st = 0; st < plan.pp; ++st)
    for (uint32_t b = plan.stage_block_begin(st); b < plan.stage_block_end(st); ++b) {
      HostStaged p(model_->block(b).params());
      comm.broadcast(p.data(), p.count(), comm::DataType::f32, int(elastic::rank_of(plan, st, 0)));
      p.store();
    }
}

StateTransfer Worker::take_state(comm::Communicator& comm, uint64_t start_step,
                                 const std::vector<elastic::Holding>& members,
                                 const std::optional<std::string>& reload) {
  if (start_step < next_step_) {  // (a rollback: the steps after it are redone, their
    if (last_checkpoint_ != UINT64_MAX && last_checkpoint_ > start_step)  // checkpoints too)
      last_checkpoint_ = UINT64_MAX;
    requested_through_ = std::min(requested_through_, start_step);
  }
  // A worker's first generation (a restarted one, a standby taken in): a request for a step the
  // job has passed was served before it (its agent's board still holds it: not again).
  if (generation_ == 0) requested_through_ = std::max(requested_through_, start_step);
  if (reload) {  // (what it held is newer than the checkpoint, or nothing)
    spdlog::warn("worker {}: the job's state was lost; reloading it from {}", spec_.device,
                 reload->empty() ? "the job's seed" : *reload);
    states_->reload(*reload, start_step, pipelined());
    backups_ = std::make_unique<StageBackups>(num_blocks());
    next_step_ = start_step;
    last_checkpoint_ = start_step;  // (that state is the checkpoint: not written again)
  }
  const uint32_t n = uint32_t(comm.size()), me = uint32_t(comm.rank());
  const elastic::Plan plan = pipelined() ? plan_for(n) : elastic::Plan{};
  std::vector<elastic::BlockRange> ownership(n);
  for (uint32_t r = 0; r < n; ++r) ownership[r] = owned(plan, r);
  std::vector<uint64_t> bytes(num_blocks());
  for (uint32_t b = 0; b < num_blocks(); ++b) bytes[b] = states_->bytes(b);
  // Every member plans from what the coordinator relayed; a copy it says this worker holds and
  // this worker lacks would be sent, kept or restored from memory that is not that state. The
  // worker fails (its agent restarts it holding nothing, and it receives the state).
  elastic::Holding said = members.at(me);
  if (spec_.faults)
    spec_.faults->relayed_applied(spec_.agent_name, spec_.device_index, said.applied);
  const std::string claimed = elastic::claims_beyond(said, holding());
  if (!claimed.empty())
    throw std::runtime_error("the generation's start says this worker holds " + claimed +
                             ", which it does not (its state is as of step " +
                             std::to_string(next_step_) + ")");
  const elastic::Migration mig = elastic::plan_migration(members, start_step, ownership, bytes);
  if (!mig.ok) throw StateLost(mig.reason);
  // What it keeps: the blocks it owns and holds live as of the start.
  for (uint32_t b = ownership[me].begin; b < ownership[me].end; ++b)
    if (elastic::copy_at(members.at(me), b, start_step) == elastic::Copy::live) {
      states_->materialize(b);
      states_->hold(b, start_step);
    }
  std::function<void()> mid_send;
  if (spec_.faults)
    mid_send = [this] { spec_.faults->mid_state_transfer(spec_.agent_name, spec_.device_index); };
  const int64_t s0 = StepTrace::now_us();
  StateTransfer t =
      execute_migration(comm, mig, start_step, *states_, *backups_, mid_send, device_plane_);
  trace_.span(start_step, "state transfer", "state", s0);
  if (t.needed)
    spdlog::info("worker {}: received {} block(s), {} bytes, in {:.3f} s over the {} plane",
                 spec_.device, t.blocks, t.bytes, t.seconds,
                 device_plane_ ? "device" : "host-staged");
  // A pipeline worker keeps parameters, gradients and optimizer moments for its own blocks only.
  if (pipelined() && plan.pp > 1)
    for (uint32_t b = 0; b < num_blocks(); ++b)
      if (!ownership[me].contains(b)) states_->release(b);
  next_step_ = start_step;
  return t;
}

uint64_t Worker::final_checksum() {
  if (spec_.faults && num_blocks() > 0) {
    HostStaged p(model_->block(0).params());
    spec_.faults->before_checksum(spec_.agent_name, spec_.device_index, p.data(), p.count());
    p.store();
  }
  return checksum({end_blocks_.begin, std::min(end_blocks_.end, num_blocks())});
}

std::vector<uint64_t> Worker::block_params() const {
  const std::vector<size_t> counts = model_->block_param_counts();
  return {counts.begin(), counts.end()};
}

// (Before the first state transfer or reduction: a block of another size there ends in a
// transfer error far from its cause, after every reform the job retries.)
void Worker::check_model() const {
  if (spec_.block_params.empty()) return;
  const std::string diff = elastic::model_difference(block_params(), "this worker's model",
                                                     spec_.block_params, "the job's model");
  if (!diff.empty())
    throw std::invalid_argument("it built another model than the job's: " + diff + " (" +
                                elastic::kSameModelEverywhere + ")");
}

uint64_t Worker::checksum() const { return checksum({0, num_blocks()}); }

uint64_t Worker::checksum(elastic::BlockRange blocks) const {
  uint64_t h = 1469598103934665603ull;
  for (uint32_t b = blocks.begin; b < blocks.end; ++b) {
    HostStaged p(static_cast<const models::Tensor&>(model_->block(b).params()));
    h = comm::fnv1a(reinterpret_cast<const uint8_t*>(p.data()), p.bytes(), h);
  }
  return h;
}

}  // namespace troupe::workers
