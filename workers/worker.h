// A worker trains its share of every step on one device. Data parallel: forward and backward over
// its global sample positions, an allreduce of each block's gradient buffer (few large calls),
// an allreduce of the step's loss and stop vote, then the same clipped update on every rank.
// Pipelined (parallel.pipeline_stages other than 1): its stage's part of the 1F1B schedule
// (pipeline_stage.h), the stage's replicas reduce through their own group, then the same update.
// Knows nothing of actors; the agent's device supervisor runs it on its own thread.
//
// Its parts: BlockStates (what it holds), StageBackups, the state transfer at a generation's
// start (elastic::plan_migration executed by state_transfer.h), PipelineStage.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/shared_arena.h"
#include "data/token_data.h"
#include "elastic/generation.h"
#include "elastic/membership.h"
#include "elastic/planner.h"
#include "models/data.h"
#include "models/extension.h"
#include "models/trainer.h"
#include "workers/block_state.h"
#include "workers/checkpoint_writer.h"
#include "workers/exact_sum.h"
#include "workers/faults.h"
#include "workers/stage_backups.h"
#include "workers/state_transfer.h"
#include "workers/step_trace.h"

namespace troupe::workers {

struct WorkerSpec {
  std::string job_name;
  std::string device = "cpu:0";  // the device it runs on (cpu:N, cuda:N)
  bool bf16 = false;             // model.dtype = "bf16": bf16 GEMM inputs (models/devices.h)
  std::string backend = "auto";  // parallel.backend: the data plane (workers/device_plane.h)
  bool reduce_bf16 = false;      // parallel.reduce_dtype = "bf16": gradients summed in bf16
  double peak_tflops = 0;        // observability.peak_tflops (0: the device's own, for MFU)
  std::string agent_name;        // for fault injection and logs
  uint32_t device_index = 0;     // among its agent's devices
  uint64_t seed = 0, steps = 0;
  models::ModelSpec model;
  // Each block's parameter count in the job's model (empty: not known): a worker whose model
  // differs refuses to start (ModelDiffers).
  std::vector<uint64_t> block_params;
  std::string data_kind = "synthetic", data_path;
  // A program's own model or data kind (model.kind, data.kind): its keys' values, and the
  // program's kinds that build them (null: only the built-in kinds).
  std::map<std::string, models::OptionValue> model_options, data_options;
  std::shared_ptr<const models::Extensions> extensions;
  std::vector<std::string> data_mix;     // data.mix: token data sets ...
  std::vector<double> data_mix_weights;  // ... and their weights (empty: data.path alone)
  // Evaluation: every eval_every steps (0: never), the loss over every held-out window once:
  // data.eval_path's windows, or the tail eval_fraction of each training set's.
  int64_t eval_every = 0;
  std::string eval_path;
  double eval_fraction = 0;
  int64_t samples = 20000;
  int64_t global_batch = 64, micro_batch = 64;
  models::OptimizerSpec optimizer;
  int threads = 1;
  int64_t failure_timeout_ms = 3000;
  // Reduce each block's gradient on a second thread as soon as its backward is done, overlapping
  // the reduction with the rest of the backward pass. Off by default: see docs/performance.md.
  bool overlap_reduce = false;
  // Pipeline parallelism: stages (1: pure data parallelism; 0: the planner chooses) and the
  // parameters one worker may hold (0: no limit). See elastic/planner.h.
  int64_t pipeline_stages = 1;
  int64_t max_params_per_worker = 0;
  // A stage without a data-parallel replica copies its state to the next stage's worker every
  // this many steps (0: never); losing it rolls back at most this many steps.
  int64_t stage_backup_steps = 20;
  bool recompute_activations = false;  // pipelines: recompute a micro-batch's forward (less memory)
  // parallel.deterministic: global micro-batches, each computed alone, summed exactly
  // (workers/exact_sum.h): the same bits at any world size, layout and membership history.
  bool deterministic = false;
  // Checkpoints: every checkpoint_every steps (0: none but the last step's) the blocks this worker
  // writes go to checkpoint_dir/step-N/ in the background; when the previous write is still
  // going, skip this one (checkpoint.if_busy = "skip") or wait for it.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool checkpoint_skip_if_busy = false;
  // A resumed job: the first generation's state comes from this checkpoint (its step) instead of
  // the seed; each worker reads the blocks it keeps (all, or a pipeline stage's).
  std::string resume_dir;
  uint64_t resume_step = 0;
  // observability.trace_steps: these steps' spans go to the trace reporter (-1: none).
  int64_t trace_first = -1, trace_last = -1;
  // Initialise the parameters from the seed. A worker that joins a running job (or restarts)
  // receives the state from the members instead and skips it (seconds for large models).
  bool init_state = true;
  // Faults a test injects (tests only; null in the release binary).
  std::shared_ptr<FaultInjector> faults;
};

struct StepInfo {
  uint64_t step = 0;
  double loss = 0;  // global mean loss of the step
  uint64_t position_begin = 0, position_end = 0;
  uint64_t samples = 0, tokens = 0;
  double seconds = 0;
  double busy_seconds = 0;  // of which computing (the rest: waiting on the data plane)
  double data_seconds = 0;  // of busy_seconds, assembling the batches
  double flops = 0;         // the model's training FLOPs this rank computed (its blocks, samples)
  // The held-out loss of the parameters this step started from (eval_tokens 0: not evaluated).
  double eval_loss = 0;
  uint64_t eval_tokens = 0;
  uint64_t epoch_samples = 0;  // the data set's samples an epoch (positions wrap there)
};

struct TrainResult {
  uint64_t next_step = 0;
  bool stopped = false;  // a stop was voted
  // A completed job's held-out loss of its final parameters, over eval_tokens (0: none).
  double eval_loss = 0;
  uint64_t eval_tokens = 0;
};

// What the members vote on at every step boundary: any rank's yes is everyone's, so all of them
// act at the same step.
struct Requests {
  std::function<bool()> stop;               // stop after this step
  std::function<uint64_t()> checkpoint_at;  // a checkpoint at or after this step (0: none wanted)
  // A checkpoint where the job stops, asked in the stop's own message: read after stop(), it
  // is there whenever the stop is (two messages, a checkpoint and then a stop, may reach a member
  // on either side of a vote: the checkpoint a step before the stop, none where it stopped).
  std::function<bool()> checkpoint_at_stop;
};

// Whether a member votes for a checkpoint at the boundary after `step`, the last one it took for
// a request being at `requested_through`: the stop's, or one asked for at or after a step up to
// the next that was not taken yet (after a rollback, not before the step it was asked for: one at
// each redone step otherwise).
bool checkpoint_voted(const Requests& requests, uint64_t requested_through, uint64_t step);

class Worker {
 public:
  using OnStep = std::function<void(const StepInfo&)>;

  // Builds the model (initialised from the seed; a pipeline worker: its blocks lazily, see
  // design.md "Memory"), optimizer and data. Throws std::invalid_argument.
  explicit Worker(const WorkerSpec& spec);

  // Runs steps [start, spec.steps) with the members of comm; stops early after a step in which any
  // rank's requests.stop() was true, and checkpoints after a step in which any rank wanted one
  // (requests.checkpoint_at() above the last step it checkpointed for a request). Throws
  // comm::Error when the data plane fails.
  TrainResult run(comm::Communicator& comm, uint64_t start, const OnStep& on_step,
                  const Requests& requests);

  uint64_t checksum() const;                            // FNV-1a over all parameters
  uint64_t checksum(elastic::BlockRange blocks) const;  // ... over those blocks'
  // What run's end left it holding and whose final checksum must equal its own (WorkerDone's
  // group): the whole model (0), or, a pipeline stopped before its last step (no gather), its
  // stage's blocks (1 + the stage) or none (a rank of no stage: kHoldsNoBlocks).
  uint32_t checksum_group() const { return end_group_; }
  static constexpr uint32_t kHoldsNoBlocks = 0xffffffff;  // (actors::kHoldsNoBlocks)
  // Its device's peak FLOP/s (or observability.peak_tflops), the denominator of MFU.
  const models::Peak& peak() const { return peak_; }
  // The job's end: FNV-1a over the blocks its group holds (after a test's injector, if any).
  uint64_t final_checksum();
  // Called on the worker's thread with each finished checkpoint write (its agent reports it) and
  // the generation it was taken in (set_generation's when it started: the report may come in a
  // later one, and the members' shards of one checkpoint must say the same generation).
  using OnCheckpoint = std::function<void(const CheckpointWriter::Written&, uint64_t generation)>;
  void set_checkpoint_reporter(OnCheckpoint f) { on_checkpoint_ = std::move(f); }
  void set_generation(uint64_t generation) { generation_ = generation; }
  // The generation's device plane (workers/device_plane.h): gradients on the device are summed
  // over it in place; null: host-staged over run()'s communicator.
  void set_device_plane(comm::Communicator* device) { device_plane_ = device; }
  models::Compute& compute() { return *device_; }
  // A CPU worker's gradients, in memory the host's other workers map (workers/
  // registered_gradients.h): for the host communicator (UcxCommOptions::registered). Null: none.
  std::shared_ptr<const comm::SharedArena> gradient_arena() const { return gradient_arena_; }
  // Waits for the checkpoint write in flight and reports it (the job's end).
  void finish_checkpoints();
  void check_finite(uint64_t step, double loss, double norm_sq) const;  // throws models::Diverged
  // The step's update (of blocks [first, last): a stage's), at its learning rate.
  void update(uint64_t step, double norm_sq, models::StepStats& stats);
  void update_blocks(uint64_t step, double norm_sq, uint32_t first, uint32_t last,
                     models::StepStats& stats);
  // Called on the worker's thread with its spans of observability.trace_steps, once they are done.
  using OnTrace = std::function<void(std::vector<actors::TraceEvent>)>;
  void set_trace_reporter(OnTrace f) { on_trace_ = std::move(f); }
  uint64_t next_step() const { return next_step_; }  // steps applied so far
  // optimizer.lr from the next step on (a generation's, when the job changed it), and the
  // changes at later steps (a rollback redoes steps where troupe lr acted: it acts there again).
  void set_lr(double lr) { opt_->set_lr(lr); }
  void set_lr_changes(std::map<uint64_t, double> changes) { lr_changes_ = std::move(changes); }

  // After a membership change: every member receives, point to point over the new generation's
  // communicator, the state of each block it will own but does not hold as of start_step
  // (elastic::plan_migration over members, by rank: what each holds). A block held by nobody at
  // start_step is lost (a pipeline stage without a replica): throws StateLost. Everyone then
  // resumes at start_step. With `reload` (the job's state was lost with the members that held
  // it), every member first reloads its state as of start_step from that checkpoint's
  // directory, or ("") from the job's seed.
  StateTransfer take_state(comm::Communicator& comm, uint64_t start_step,
                           const std::vector<elastic::Holding>& members,
                           const std::optional<std::string>& reload = std::nullopt);

  // What this worker holds (published for the next generation).
  elastic::Holding holding() const;
  uint32_t num_blocks() const { return uint32_t(model_->num_blocks()); }
  // Each block's parameter count (what WorkerReady says).
  std::vector<uint64_t> block_params() const;
  // The layout of a generation of `world` workers (elastic::plan_pipeline on this model's
  // per-block FLOPs and parameter sizes; the same on every worker). Throws if impossible.
  elastic::Plan plan_for(uint32_t world) const;
  static std::string describe(const elastic::Plan& plan);

 private:
  bool pipelined() const { return spec_.pipeline_stages != 1; }
  void share_gradients();  // gradient_arena_, on a CPU worker
  // Throws std::invalid_argument when its model is not the job's (spec_.block_params).
  void check_model() const;
  uint64_t micro_batches() const { return uint64_t(spec_.global_batch / spec_.micro_batch); }
  TrainResult run_data_parallel(comm::Communicator& comm, uint64_t start, const OnStep& on_step,
                                const Requests& requests);
  TrainResult run_pipeline(comm::Communicator& comm, uint64_t start, const OnStep& on_step,
                           const Requests& requests);
  // parallel.deterministic: this rank's global micro-batches, each computed alone, their
  // gradients summed exactly over everyone; stats.loss is the rank's loss in fixed point.
  models::StepStats forward_backward_exact(comm::Communicator& comm, ExactSum& exact, uint64_t step,
                                           elastic::Share share);
  double global_norm_sq_exact(comm::Communicator& comm, const elastic::Plan& plan, bool reporter);
  // The share of rank r of n data-parallel replicas (whole micro-batches when deterministic).
  elastic::Share share_of(uint32_t r, uint32_t n) const;
  void gather_parameters(comm::Communicator& comm, const elastic::Plan& plan);
  // A pipeline stage's replicas: each of `blocks`' gradients summed over their group, in place on
  // the device plane's (device: null for none) or host-staged over the host's.
  void sum_replicas(elastic::BlockRange blocks, comm::Communicator& host,
                    comm::Communicator* device);
  // At a step boundary: reports a finished checkpoint write; when next_step_ is due (every
  // checkpoint.every_steps) or `requested` (the vote), copies the state of `blocks` (the ones this
  // rank writes) and starts writing it, unless a periodic one is skipped because a member's
  // writer is busy (`any_busy`, the vote of writer_busy_vote()).
  double writer_busy_vote() const;
  void maybe_checkpoint(const std::vector<uint32_t>& blocks, bool requested, bool any_busy);
  void checkpoint_the_end_again(const std::vector<uint32_t>& blocks);
  void before_step(uint64_t step);  // the test's fault injection, if any
  // (flops: the model FLOPs this rank computed in the step.)
  StepInfo step_info(uint64_t step, double loss, elastic::Share share, double seconds, double busy,
                     double flops) const;
  // The traced parts of forward_backward (data, forward, backward, laid end to end from start).
  void trace_compute(uint64_t step, int64_t start_us, const models::StepStats& stats);
  void report_trace(bool run_ended);  // hands a finished trace to the reporter
  // The blocks rank r owns under plan (all for pure data parallelism; none for a standby).
  elastic::BlockRange owned(const elastic::Plan& plan, uint32_t rank) const;

  WorkerSpec spec_;
  std::unique_ptr<models::Dataset> data_;
  std::shared_ptr<const data::TokenData> eval_;  // held-out windows (null: no evaluation)
  // The held-out loss of the current parameters and the tokens scored (data parallel only):
  // groups of batch.micro windows, group g on rank g mod world, each computed alone; each
  // group's loss sum in fixed point (2^-16 nats), added exactly (integers in a double allreduce
  // stay exact below 2^53): the same bits at any world size.
  std::pair<double, uint64_t> evaluate(comm::Communicator& comm);
  // The device the model lives and computes on (before the model: it outlives its tensors).
  std::shared_ptr<models::Compute> device_;
  comm::Communicator* device_plane_ = nullptr;  // this generation's (null: host-staged)
  std::shared_ptr<comm::SharedArena> gradient_arena_;
  InPlaceBuffers in_place_;  // what else a step sums in place, in gradient_arena_
  models::Peak peak_;
  std::unique_ptr<models::Model> model_;
  std::unique_ptr<models::Optimizer> opt_;
  std::unique_ptr<models::Trainer> trainer_;
  std::unique_ptr<BlockStates> states_;
  std::unique_ptr<StageBackups> backups_;
  uint64_t next_step_ = 0;
  uint32_t end_group_ = 0;                         // checksum_group()
  elastic::BlockRange end_blocks_{0, UINT32_MAX};  // what final_checksum covers (run sets it)
  CheckpointWriter writer_;
  OnCheckpoint on_checkpoint_;
  uint64_t generation_ = 0, writing_generation_ = 0;  // now, and of the write in flight
  StepTrace trace_;
  OnTrace on_trace_;
  std::map<uint32_t, std::vector<uint8_t>> staging_;  // checkpoint copies, kept for the next one
  void take_checkpoint_result(bool wait);             // reports a finished write, keeps its buffers
  std::map<uint64_t, double> lr_changes_;             // optimizer.lr from these steps on
  uint64_t last_checkpoint_ = UINT64_MAX;             // the step of the last checkpoint started
  uint64_t requested_through_ = 0;  // the step of the last checkpoint taken for a request
  // Per block: the shape of its output for one sample (dim 0 scales with the samples), for the
  // receiving side of a stage boundary.
  std::vector<std::vector<size_t>> out_shape_;
};

// A block of the model is held by no member: the generation cannot go on from that step.
class StateLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace troupe::workers
