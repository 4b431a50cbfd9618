#include "workers/device_supervisor.h"

#include <spdlog/spdlog.h>

#include "data/shards.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

WorkerSpec worker_spec_of(const actors::JobSpec& s) {
  WorkerSpec w;
  w.job_name = s.job_name;
  w.seed = s.seed;
  w.steps = s.steps;
  w.model.kind = s.model_kind;
  if (w.model.kind == "mlp") {
    w.model.mlp_sizes = {size_t(s.inputs)};
    for (int64_t h : s.hidden) w.model.mlp_sizes.push_back(size_t(h));
    w.model.mlp_sizes.push_back(size_t(s.classes));
  }
  w.model.layers = size_t(s.layers);
  w.model.d_model = size_t(s.d_model);
  w.model.heads = size_t(s.heads);
  w.model.context = size_t(s.context);
  w.model.tied_head = s.tied_head;
  w.bf16 = s.dtype == "bf16";
  w.backend = s.backend.empty() ? "auto" : s.backend;
  w.reduce_bf16 = s.reduce_dtype == "bf16";
  w.block_params = s.block_params;
  w.model_options = s.model_options;
  w.data_options = s.data_options;
  w.data_kind = s.data_kind;
  w.data_path = s.data_path;
  w.data_mix = s.data_mix;
  w.data_mix_weights = s.data_mix_weights;
  w.eval_every = s.eval_every;
  w.eval_path = s.eval_path;
  w.eval_fraction = s.eval_fraction;
  w.samples = s.samples;
  w.global_batch = s.global_batch;
  w.micro_batch = s.micro_batch;
  w.optimizer.kind = s.optimizer;
  w.optimizer.lr = s.lr;
  w.optimizer.momentum = s.momentum;
  w.optimizer.weight_decay = s.weight_decay;
  w.optimizer.clip_norm = s.clip_norm;
  w.optimizer.warmup_steps = size_t(s.warmup_steps);
  w.optimizer.decay_steps = size_t(s.decay_steps);
  w.threads = int(s.threads_per_worker);
  w.failure_timeout_ms = s.failure_timeout_ms;
  w.overlap_reduce = s.overlap_reduce;
  w.pipeline_stages = s.pipeline_stages;
  w.max_params_per_worker = s.max_params_per_worker;
  w.stage_backup_steps = s.stage_backup_steps;
  w.recompute_activations = s.recompute_activations;
  w.deterministic = s.deterministic;
  w.checkpoint_dir = s.checkpoint_dir;
  w.checkpoint_every = s.checkpoint_every;
  w.checkpoint_skip_if_busy = s.checkpoint_skip_if_busy;
  w.resume_dir = s.resume_dir;
  w.resume_step = s.resume_step;
  w.trace_first = s.trace_first;
  w.peak_tflops = s.peak_tflops;
  w.trace_last = s.trace_last;
  // Joining a running job: the state comes from the members (take_state), not the seed.
  w.init_state = s.init_state;
  return w;
}

DeviceSupervisor::DeviceSupervisor(const DeviceContext& ctx, uint32_t device,
                                   const std::string& name)
    : ctx_(ctx),
      board_(*ctx.board),
      id_{ctx.agent_id(), device},
      spec_(ctx.spec),
      intensity_(ctx.max_restarts, ctx.restart_window),
      want_(ctx.first_generation) {
  spec_.device = name;
  spec_.device_index = device;
}

void DeviceSupervisor::run() {
  while (true) {
    try {
      if (!worker_) {
        auto t0 = Clock::now();
        worker_ = std::make_unique<Worker>(spec_);
        spdlog::info("worker {} ({}) built in {:.3f} s", id_.device, spec_.device,
                     std::chrono::duration<double>(Clock::now() - t0).count());
      }
      while (run_generation() == Next::generation) {
      }
      // A write it started and has not reported (a drained worker's, one that stops with the
      // agent): reported, or the others' shards of that step never make a checkpoint.
      worker_->finish_checkpoints();
      return;
    } catch (const std::exception& e) {
      if (board_.shutting_down() || !restart_after(e)) return;
    }
  }
}

DeviceSupervisor::Next DeviceSupervisor::run_generation() {
  rank_ = -1;
  publish();
  auto g = board_.await(want_, rejoins_);
  if (!g && board_.shutting_down()) return Next::done;
  if (!g) {  // the agent joined a coordinator again: publish to it
    want_ = board_.next_generation();
    return Next::generation;
  }
  generation_ = g->generation;
  try {
    if (!connect(*g)) return Next::generation;
    take_state(*g);
    return train(*g);
  } catch (const comm::Error& e) {
    if (board_.shutting_down()) return Next::done;
    spdlog::warn("worker {} (rank {}, generation {}): {}; waiting for the next generation",
                 id_.device, rank_, generation_, e.what());
    last_error_ = e.what();
    ++want_;  // the broken communicator goes; publish for the next generation
    return Next::generation;
  }
}

void DeviceSupervisor::publish() {
  worker_->set_device_plane(nullptr);
  plane_.reset();  // (NCCL's is aborted: never destroyed collectively with members gone)
  comm::UcxCommOptions co;
  co.timeout = std::chrono::milliseconds(spec_.failure_timeout_ms);
  co.registered = worker_->gradient_arena();
  comm_ = std::make_unique<comm::UcxCommunicator>(want_, co);
  rejoins_ = board_.rejoins();
  id_.agent = ctx_.agent_id();
  elastic::Holding holding = worker_->holding();
  uint32_t blocks = worker_->num_blocks();
  if (spec_.faults)
    spec_.faults->before_ready(spec_.agent_name, spec_.device_index, holding.applied, blocks);
  ctx_.send(actors::encode(actors::WorkerReady{id_, want_, comm_->address(), holding, blocks,
                                               last_error_, worker_->block_params()}));
  last_error_.clear();
}

bool DeviceSupervisor::connect(const actors::GenerationStart& g) {
  std::vector<std::string> addresses(g.members.size());
  for (const auto& m : g.members) {
    addresses[m.rank] = m.address;
    if (m.worker == id_) rank_ = int(m.rank);
  }
  if (rank_ < 0 || g.generation != want_) {
    // A standby, or a newer generation formed already: publish for the next one.
    if (rank_ < 0 && g.generation == want_)
      spdlog::info("worker {}: standby in generation {}", id_.device, g.generation);
    want_ = g.generation + 1;
    return false;
  }
  comm_->connect(rank_, addresses,
                 std::chrono::milliseconds(std::max<int64_t>(10000, spec_.failure_timeout_ms)));
  if (!comm_->shared_memory_allreduce() && g.members.size() > 1)
    spdlog::info("worker {}: allreduce over UCX messages, not shared memory: {}", id_.device,
                 comm_->shared_memory_fallback_reason());
  form_device_plane(g.generation);
  return true;
}

// The generation's device plane (workers/device_plane.h), or why there is none.
void DeviceSupervisor::form_device_plane(uint64_t gen) {
  // A step of several members sums (and a pipeline exchanges) over it; the exact sums of
  // parallel.deterministic go host-staged (the configuration refuses "nccl" with them).
  exact_plane_.clear();
  if (comm_->size() == 1) return;
  if (spec_.deterministic) {
    exact_plane_ = std::string("exact sums (parallel.deterministic: fixed-point integers) over ") +
                   (comm_->shared_memory_allreduce() ? "shared memory" : "UCX") + ", host-staged";
    spdlog::info("worker {}: data plane: {}", id_.device, exact_plane_);
    return;
  }
  PlaneOptions o;
  o.backend = spec_.backend;
  o.cuda_device = spec_.device.rfind("cuda:", 0) == 0 ? std::atoi(spec_.device.c_str() + 5) : 0;
  o.timeout = std::chrono::milliseconds(std::max<int64_t>(10000, spec_.failure_timeout_ms));
  // (Not on a planned change, a LeaveGeneration alone: every member finishes its step.)
  o.abandoned = [this, gen] {
    return board_.abandoned(gen) || board_.generation() > gen || board_.shutting_down();
  };
  if (auto faults = spec_.faults)
    o.link = [this, faults, abandoned = o.abandoned](comm::Communicator& host) {
      return faults->device_link(worker_->compute(), host, abandoned);
    };
  plane_ = DevicePlane::form(*comm_, worker_->compute(), o);
  worker_->set_device_plane(plane_->device());
  spdlog::info("worker {}: data plane: {}", id_.device, plane_->choice().why);
}

void DeviceSupervisor::take_state(const actors::GenerationStart& g) {
  std::vector<elastic::Holding> holdings(g.members.size());
  for (const auto& m : g.members) holdings[m.rank] = m.holding;
  StateTransfer t =
      worker_->take_state(*comm_, g.start_step, holdings,
                          g.reload ? std::optional<std::string>(g.checkpoint) : std::nullopt);
  std::string plan;
  if (spec_.pipeline_stages != 1)
    plan = Worker::describe(worker_->plan_for(uint32_t(g.members.size())));
  const std::string data_plane = rank_ != 0 ? "" : plane_ ? plane_->choice().why : exact_plane_;
  if (t.needed || (rank_ == 0 && (!plan.empty() || !data_plane.empty())))
    ctx_.send(
        actors::encode(actors::StateReceived{g.generation, uint32_t(rank_), g.state_source, t.bytes,
                                             t.seconds, t.needed, t.blocks, plan, data_plane}));
}

DeviceSupervisor::Next DeviceSupervisor::train(const actors::GenerationStart& g) {
  const uint64_t gen = g.generation;
  if (g.lr > 0) worker_->set_lr(g.lr);  // (the same on every member, from the start step)
  worker_->set_lr_changes(g.lr_changes);
  auto on_step = [&](const StepInfo& s) {
    ctx_.send(actors::encode(actors::StepReport{
        gen, s.step, uint32_t(rank_), s.loss, s.samples, s.tokens, s.position_begin, s.position_end,
        s.seconds, s.busy_seconds, s.data_seconds, s.eval_loss, s.eval_tokens, s.flops,
        worker_->peak().flops, uint8_t(worker_->peak().source), s.epoch_samples}));
  };
  Requests requests{[&] { return board_.stop_requested() || board_.leaving(gen); },
                    [&] { return board_.checkpoint_wanted(); },
                    [&] { return board_.checkpoint_at_stop(); }};
  worker_->set_generation(gen);
  worker_->set_checkpoint_reporter(
      [this, rank = uint32_t(rank_)](const CheckpointWriter::Written& w, uint64_t taken_in) {
        report_checkpoint(taken_in, rank, w);
      });
  worker_->set_trace_reporter([&](std::vector<actors::TraceEvent> events) {
    ctx_.send(actors::encode(
        actors::TraceChunk{id_.agent, id_.device, uint32_t(rank_), std::move(events)}));
  });
  TrainResult result = worker_->run(*comm_, g.start_step, on_step, requests);
  if (comm_->size() > 1)
    spdlog::info("worker {}: generation {}: {} allreduces read the members' gradients in place",
                 id_.device, gen, comm_->registered_allreduces());
  // The step's vote said stop: another member's agent may have heard why (a stop or a
  // membership change) before this one did. Wait for the reason before acting.
  if (result.stopped)
    board_.await_reason(gen, std::chrono::milliseconds(spec_.failure_timeout_ms + 5000));
  if (board_.shutting_down()) return Next::done;  // drained, or the job ended without it
  if (result.stopped && !board_.stop_requested() && board_.leaving(gen)) {
    ++want_;  // the membership changes: on to the next generation
    return Next::generation;
  }
  // The job's end: the last checkpoint's write finishes (a job stopped with a checkpoint, the
  // coordinator asked for it with the stop, is left resumable).
  worker_->finish_checkpoints();
  ctx_.send(actors::encode(actors::WorkerDone{uint32_t(rank_), gen, result.next_step,
                                              worker_->final_checksum(), worker_->checksum_group(),
                                              result.eval_loss, result.eval_tokens}));
  static_assert(Worker::kHoldsNoBlocks == actors::kHoldsNoBlocks);
  // Until the job ends: a member lost before its own report (while it wrote its shards of the
  // last checkpoint) makes a generation of the others, formed after the last step.
  if (board_.await_end(gen)) return Next::done;
  ++want_;
  return Next::generation;
}

void DeviceSupervisor::report_checkpoint(uint64_t gen, uint32_t rank,
                                         const CheckpointWriter::Written& w) {
  if (!w.error.empty())
    spdlog::error("worker {}: checkpoint at step {} not written: {}", id_.device, w.step, w.error);
  actors::CheckpointWritten m{gen,
                              rank,
                              w.step,
                              worker_->num_blocks(),
                              w.directory,
                              {},
                              w.blocking_seconds,
                              w.write_seconds,
                              w.error};
  for (const auto& s : w.shards) m.shards.push_back({s.block, s.file, s.bytes, s.checksum});
  ctx_.send(actors::encode(m));
}

bool DeviceSupervisor::restart_after(const std::exception& e) {
  // Tell the other members now (they would otherwise wait out the failure timeout).
  if (plane_ && plane_->device()) plane_->device()->abort();
  if (comm_) {
    comm_->abort();
    try {
      comm_->barrier();
    } catch (const std::exception&) {
    }
  }
  // A lost block (a stage without a replica) cannot be repaired by a restart, nor a data plane
  // the members cannot use (parallel.backend = "nccl" with members sharing a GPU), nor a data
  // set damaged after it was prepared or a sample it cannot give (the same is read again), nor
  // a model whose init is not repeatable, nor a step that diverged.
  const bool fatal =
      dynamic_cast<const StateLost*>(&e) != nullptr || dynamic_cast<const PlaneRefused*>(&e) ||
      dynamic_cast<const data::DamagedData*>(&e) || dynamic_cast<const models::SampleError*>(&e) ||
      dynamic_cast<const models::ModelDefect*>(&e) || dynamic_cast<const models::Diverged*>(&e);
  const bool restart = !fatal && worker_ && intensity_.allow_restart(Clock::now());
  spdlog::error("worker {} (rank {}) failed: {}{}", id_.device, rank_, e.what(),
                restart ? "; restarting it" : "");
  ctx_.send(actors::encode(actors::WorkerFailed{id_, rank_ < 0 ? id_.device : uint32_t(rank_),
                                                generation_, e.what(), restart, fatal}));
  if (!restart) return false;
  worker_.reset();
  spec_.init_state = false;  // the restarted worker takes the members' state
  want_ = board_.generation() + 1;
  return true;
}

}  // namespace troupe::workers
