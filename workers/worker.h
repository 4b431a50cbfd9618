// A worker trains its share of every step on one device: forward and backward over its global
// sample positions, an allreduce of each block's gradient buffer (one call per block: few large
// calls), an allreduce of the step's loss and stop vote, then the same clipped update on every
// rank. Knows nothing of actors; the agent runs it on its own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "elastic/planner.h"
#include "models/data.h"
#include "models/trainer.h"

namespace troupe::workers {

struct WorkerSpec {
  std::string job_name;
  uint64_t seed = 0, steps = 0;
  models::ModelSpec model;
  std::string data_kind = "synthetic", data_path;
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
  // Initialise the parameters from the seed. A worker that joins a running job (or restarts)
  // receives the state from the members instead and skips it (seconds for large models).
  bool init_state = true;
  // Test-only fault injection (TROUPE_TEST_* environment variables of the agent; 0 = off):
  // the state source pauses this long in the middle of each state transfer, the worker throws
  // once when it reaches this step (counting from 1), and every step takes at least this long,
  // so the tests can kill a source mid-transfer, exercise a worker that throws, and act between
  // steps. The numbers computed are unchanged.
  int64_t test_state_delay_ms = 0;
  uint64_t test_throw_at_step = 0;
  int64_t test_step_delay_us = 0;  // paces every step (the tests' scenarios need time to act)
};

// What a state transfer moved, as seen by one rank.
struct StateTransfer {
  bool needed = false;  // this rank lacked blocks it needs (and received them)
  uint64_t bytes = 0;   // received
  uint32_t blocks = 0;  // blocks received
  double seconds = 0;
};

// What a member of a new generation holds: the steps it has applied and the blocks whose state
// (parameters, optimizer moments) it holds as of that step.
struct MemberState {
  uint64_t applied = 0;
  std::vector<uint32_t> held;
  std::vector<uint32_t> snapshot;  // blocks whose state it holds as of applied - 1
  uint64_t backup_step = 0;        // stage backups ...
  std::vector<uint32_t> backup;    // ... of these blocks, as of backup_step
};

struct StepInfo {
  uint64_t step = 0;
  double loss = 0;  // global mean loss of the step
  uint64_t position_begin = 0, position_end = 0;
  uint64_t samples = 0, tokens = 0;
  double seconds = 0;
  double busy_seconds = 0;  // of which computing (the rest: waiting on the data plane)
};

struct TrainResult {
  uint64_t next_step = 0;
  bool stopped = false;  // a stop was voted
};

class Worker {
 public:
  // Builds the model (initialised from the seed; a pipeline worker: its blocks lazily, see
  // design.md "Memory"), optimizer and data. Throws std::invalid_argument.
  explicit Worker(const WorkerSpec& spec);

  // Runs steps [start, spec.steps) with the members of comm; stops early after a step in which any
  // rank's stop_requested() was true. Throws comm::Error when the data plane fails.
  TrainResult run(comm::Communicator& comm, uint64_t start,
                  const std::function<void(const StepInfo&)>& on_step,
                  const std::function<bool()>& stop_requested);

  uint64_t checksum() const;                         // FNV-1a over all parameters
  uint64_t next_step() const { return next_step_; }  // steps applied so far

  // After a membership change: the layout for the new members is planned (plan_for), and every
  // member receives, point to point over the new generation's communicator, the state of each
  // block it will own but does not hold as of start_step, from the lowest-ranked member that
  // does (members[rank] says what each holds). A block held by nobody at start_step is lost
  // (a pipeline stage without a replica): throws StateLost. Everyone then resumes at start_step.
  StateTransfer take_state(comm::Communicator& comm, uint64_t start_step,
                           const std::vector<MemberState>& members);

  // The blocks whose state this worker holds as of next_step(), and as of next_step() - 1 (a
  // pipeline stage keeps its blocks' state from before its last update: a failure can end a
  // step after some stages applied it and before others did, and the next generation then
  // resumes one step earlier).
  std::vector<uint32_t> held_blocks() const;
  std::vector<uint32_t> snapshot_blocks() const;
  std::vector<uint32_t> backup_blocks() const;
  uint64_t backup_step() const { return backup_step_; }
  uint32_t num_blocks() const { return uint32_t(model_->num_blocks()); }
  // The layout of a generation of `world` workers (elastic::plan_pipeline on this model's
  // per-block FLOPs and parameter sizes; the same on every worker). Throws if impossible.
  elastic::Plan plan_for(uint32_t world) const;
  static std::string describe(const elastic::Plan& plan);

 private:
  TrainResult run_pipeline(comm::Communicator& comm, uint64_t start,
                           const std::function<void(const StepInfo&)>& on_step,
                           const std::function<bool()>& stop_requested);
  void test_hooks(uint64_t step);  // the TROUPE_TEST_* fault injection and pacing of a step
  // The blocks rank r owns under plan (all for pure data parallelism; none for a standby).
  std::pair<uint32_t, uint32_t> owned(const elastic::Plan& plan, uint32_t rank) const;

  WorkerSpec spec_;
  std::unique_ptr<models::Dataset> data_;
  std::unique_ptr<models::Model> model_;
  std::unique_ptr<models::Optimizer> opt_;
  std::unique_ptr<models::Trainer> trainer_;
  uint64_t next_step_ = 0;
  static constexpr uint64_t kStale = UINT64_MAX;
  std::vector<uint64_t> held_at_;  // per block: the step its state is current as of, or kStale
  // Per block: held as of step 0 but not yet made from the seed (pipeline workers initialise
  // only the blocks they keep or send: materialize()).
  std::vector<bool> pending_init_;
  std::vector<uint64_t> snap_at_;                  // per block: the step of its snapshot, or kStale
  std::vector<std::vector<models::Tensor>> snap_;  // per block: copies of its state buffers
  std::vector<models::Tensor*> state_buffers(uint32_t block);  // allocates released moments
  std::vector<size_t> state_sizes(uint32_t block);
  void snapshot(uint32_t block);     // copies the block's state as of next_step_
  void materialize(uint32_t block);  // initialises it from the seed if that is pending
  // Stage backups: copies of blocks' state as of backup_step_ (this stage's own, and the
  // previous stage's received), refreshed every stage_backup_steps when a stage has no replica.
  std::vector<std::vector<models::Tensor>> backup_;
  std::vector<bool> backed_up_;
  uint64_t backup_step_ = 0;
  void take_backups(comm::Communicator& comm, const elastic::Plan& plan, uint32_t stage,
                    uint32_t replica);
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
