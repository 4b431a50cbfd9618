// The job protocol between the coordinator, the agents and the admin commands, as C++ values:
// one shape per concept (a worker's id, what it holds, a generation, a report), and the one codec
// (job_codec.cpp) that turns each into its Cap'n Proto body (comm/control.capnp) and back. Code
// above this file never reads or builds those bodies itself.
//
// Inbound messages were validated by comm::FrameValidator, so decoding cannot throw.
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "actors/control_message.h"
#include "elastic/generation.h"

namespace troupe::actors {

// A worker of the job: an agent's device (its index in the agent's device list). The one id of a
// worker everywhere; elastic's decisions take it packed (key()).
struct WorkerId {
  uint32_t agent = 0, device = 0;
  uint64_t key() const { return uint64_t(agent) << 32 | device; }
  static WorkerId from_key(uint64_t k) { return {uint32_t(k >> 32), uint32_t(k)}; }
  std::string name() const { return std::to_string(agent) + "/" + std::to_string(device); }
  bool operator==(const WorkerId& o) const { return key() == o.key(); }
  bool operator<(const WorkerId& o) const { return key() < o.key(); }
};

// agent -> coordinator (request): admit me.
// The control protocol's revision: a coordinator takes agents of its own only (a message
// another build does not know is dropped as malformed, a drain's answer among them). Raised with
// every change to comm/control.capnp that an older build cannot read.
inline constexpr uint32_t kProtocol = 1;

struct Join {
  std::string agent_name, host;
  uint32_t pid = 0;
  std::vector<std::string> devices;  // e.g. "cpu:0"
  bool rejoin = false;  // its coordinator was lost and it holds the job's state: adopt it
  uint32_t protocol = kProtocol;
  std::string host_identity;  // comm::host_identity(): where `pid` names its process
  // What its program trains: "model:NAME" and "data:NAME" of each kind ("model:external" and
  // "data:external" for a loop of its own, troupe::ElasticLoop); empty: not said (older).
  std::vector<std::string> kinds;
};
// Why a coordinator refuses the agent's join for its protocol ("" when it speaks kProtocol).
std::string protocol_refusal(const Join& j);
// The kinds every Troupe program trains, as Join::kinds names them ("model:gpt", ...): a
// program's own are added to them (workers' AgentOptions).
std::vector<std::string> builtin_kinds();
// Why a coordinator of a job of `model_kind` and `data_kind` refuses the agent's join: its
// program cannot train them ("" when it can, or did not say).
std::string kind_refusal(const Join& j, const std::string& model_kind,
                         const std::string& data_kind);

// coordinator -> agent: the answer to Join. Workers never read TOML: this is the job as they
// see it (docs/config.md names each key).
struct JobSpec {
  uint32_t agent_id = 0;
  uint64_t first_generation = 1;  // the generation this agent's workers first publish for
  std::string job_name;
  uint64_t seed = 0, steps = 0;
  // [model]
  std::string model_kind;
  std::vector<int64_t> hidden;
  int64_t inputs = 0, classes = 0, layers = 0, d_model = 0, heads = 0, context = 0;
  bool tied_head = false;
  std::string dtype;  // model.dtype: f32 | bf16
  // Each block's parameter count in the job's model (empty: not known yet): a worker that builds
  // another model (another version of the program, other data) refuses to start.
  std::vector<uint64_t> block_params;
  std::string backend;       // parallel.backend: auto | ucx | nccl (workers/device_plane.h)
  std::string reduce_dtype;  // parallel.reduce_dtype: f32 | bf16 (the gradients' sums)
  // [data]
  std::string data_kind, data_path;
  std::vector<std::string> data_mix;  // data.mix: token data sets and their weights
  std::vector<double> data_mix_weights;
  int64_t eval_every = 0;    // eval.every_steps
  std::string eval_path;     // data.eval_path
  double eval_fraction = 0;  // data.eval_fraction
  // A program's own model and data kinds: their keys' values (models::OptionValue).
  using Options = std::map<std::string, std::variant<int64_t, double, bool, std::string>>;
  Options model_options, data_options;
  int64_t samples = 0;
  // [batch]
  int64_t global_batch = 0, micro_batch = 0;
  // [optimizer]
  std::string optimizer;
  double lr = 0, momentum = 0, weight_decay = 0, clip_norm = 0;
  int64_t warmup_steps = 0, decay_steps = 0;
  // [parallel]
  int64_t threads_per_worker = 1;
  bool overlap_reduce = false;
  int64_t pipeline_stages = 1, max_params_per_worker = 0, stage_backup_steps = 0;
  bool recompute_activations = false;
  bool deterministic = false;
  // [checkpoint]
  std::string checkpoint_dir;  // resolved; "" = no checkpoints
  int64_t checkpoint_every = 0;
  bool checkpoint_skip_if_busy = false;
  std::string resume_dir;                     // the checkpoint to start from ("" = the seed)
  int64_t trace_first = -1, trace_last = -1;  // observability.trace_steps (-1: none)
  double peak_tflops = 0;                     // observability.peak_tflops (0: the device's)
  std::string log_level;                      // logging.level ("": info)
  uint64_t resume_step = 0;
  // [elastic]
  int64_t failure_timeout_ms = 3000;
  int64_t heartbeat_interval_ms = 0;  // (0: the agent's own, from an older coordinator)
  int64_t worker_max_restarts = 3, worker_restart_window_ms = 60000;
  int64_t rejoin_timeout_ms = 0;  // how long its agents wait for a lost coordinator to come back
  // Its workers start from the seed or the checkpoint (the first generation's); else they receive
  // the members' state.
  bool init_state = true;
};

// agent -> coordinator: a worker's data-plane address for a generation, and what it holds.
struct WorkerReady {
  WorkerId worker;
  uint64_t generation = 0;
  std::string address;
  elastic::Holding holding;
  uint32_t num_blocks = 0;
  std::string last_error;              // why its previous generation ended, if the data plane broke
  std::vector<uint64_t> block_params;  // each block's parameter count in the model it built
};

// A member of a generation (by rank).
struct GenerationMember {
  uint32_t rank = 0;
  WorkerId worker;
  std::string address;
  elastic::Holding holding;
};

// coordinator -> agents: a generation starts.
struct GenerationStart {
  uint64_t generation = 0, start_step = 0;
  uint32_t state_source = 0;
  std::vector<GenerationMember> members;  // by rank
  double lr = 0;                          // optimizer.lr from start_step on (0: the job's)
  // The state was lost with the members that held it: every member reloads it as of start_step,
  // from `checkpoint` (a checkpoint's directory), or "" from the job's seed.
  bool reload = false;
  std::string checkpoint;
  std::map<uint64_t, double> lr_changes;  // optimizer.lr from later steps on (a rollback's redo)
};
// "" when g's members hold the ranks 0..n-1 once each and its state source is one of them, else
// why not (a coordinator's bug or another version's: an agent drops such a start, since its
// workers index their peers by rank).
inline std::string invalid_members(const GenerationStart& g) {
  const size_t n = g.members.size();
  std::vector<bool> seen(n);
  for (const auto& m : g.members) {
    if (m.rank >= n || seen[m.rank])
      return "generation " + std::to_string(g.generation) + ": member rank " +
             std::to_string(m.rank) + " twice or outside 0.." + std::to_string(n - 1);
    seen[m.rank] = true;
  }
  if (n > 0 && g.state_source >= n)
    return "generation " + std::to_string(g.generation) + ": state source " +
           std::to_string(g.state_source) + " outside 0.." + std::to_string(n - 1);
  return "";
}

// worker -> coordinator (one way): a step it applied.
struct StepReport {
  uint64_t generation = 0, step = 0;
  uint32_t rank = 0;
  double loss = 0;
  uint64_t samples = 0, tokens = 0;
  uint64_t position_begin = 0, position_end = 0;
  double seconds = 0, busy_seconds = 0;
  double data_seconds = 0;     // of busy_seconds: assembling batches
  double eval_loss = 0;        // the held-out loss at the step's start ...
  uint64_t eval_tokens = 0;    // ... over this many tokens (0: not evaluated)
  double flops = 0;            // the model's training FLOPs this rank computed
  double peak_flops = 0;       // its device's peak FLOP/s (0: unknown) ...
  uint8_t peak_source = 0;     // ... and where it comes from (models::PeakSource)
  uint64_t epoch_samples = 0;  // the data set's samples an epoch (0: unknown)
};

// worker -> coordinator (one way): it took the state at a generation's start (or reports the
// layout, rank 0 of a pipelined job).
struct StateReceived {
  uint64_t generation = 0;
  uint32_t rank = 0, source_rank = 0;
  uint64_t bytes = 0;
  double seconds = 0;
  bool needed = false;
  uint32_t blocks = 0;
  std::string plan;
  std::string data_plane;  // rank 0: the generation's data plane and why (workers/device_plane.h)
};

// "step-00000120": the directory of the checkpoint of a step, in checkpoint.dir.
inline std::string checkpoint_dir_name(uint64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step-%08llu", (unsigned long long)step);
  return name;
}
// "block-00003.trpblk": the shard file of a block, in its checkpoint's directory (the manifest
// names each block's; a check refuses a manifest that names another for a block).
inline std::string shard_file_name(uint32_t block) {
  char name[32];
  std::snprintf(name, sizeof name, "block-%05u.trpblk", block);
  return name;
}

// worker -> coordinator (one way): its shards of a checkpoint are durable (written, fsynced,
// renamed); the coordinator writes the manifest once every block is.
struct CheckpointShard {
  uint32_t block = 0;
  std::string file;  // shard_file_name(block)
  uint64_t bytes = 0, checksum = 0;
};
struct CheckpointWritten {
  uint64_t generation = 0;
  uint32_t rank = 0;
  uint64_t step = 0;
  uint32_t blocks = 0;
  std::string directory;
  std::vector<CheckpointShard> shards;
  double blocking_seconds = 0, write_seconds = 0;
  std::string error;  // "" or why the shards could not be written
};

// worker -> coordinator (one way): finished, with a checksum of its parameters.
struct WorkerDone {
  uint32_t rank = 0;
  uint64_t generation = 0, steps = 0, checksum = 0;
  uint32_t group = 0;        // whose checksums equal it (control.capnp): 0 the whole model
  double eval_loss = 0;      // a completed job's held-out loss of its final parameters ...
  uint64_t eval_tokens = 0;  // ... over these tokens (0: not evaluated)
};
constexpr uint32_t kHoldsNoBlocks = 0xffffffff;  // WorkerDone::group of a rank holding none

// The end of the coordinator's answer to a Join while the first generation forms with all the
// agents the job asked for (cluster.agents): the agent asks again until the job has started.
constexpr const char* kJoinOnceStarted = "join again once it has started";

// agent -> coordinator (one way): a worker cannot go on.
struct WorkerFailed {
  WorkerId worker;
  uint32_t rank = 0;  // (the device index before it had one)
  uint64_t generation = 0;
  std::string reason;
  bool restarting = false;  // its agent restarts it
  bool fatal = false;       // the job cannot go on (a model block held by no member)
};

// coordinator -> agents: the job is over (or this agent was drained).
struct Shutdown {
  std::string reason;
  int32_t exit_code = 0;
};

struct MemberStatus {
  uint32_t rank = 0, agent = 0, pid = 0;
  std::string host, device, name;
  int32_t stage = -1;                            // -1: the whole model
  double step_seconds = 0, compute_seconds = 0;  // its last report in this generation
  int64_t last_report_ms = -1;                   // since that report; -1: none yet
  double data_seconds = 0;                       // of compute_seconds: assembling batches
  int64_t last_heard_ms = -1;  // since the coordinator last heard from its agent; -1: not known
  // training (it reported a step of this generation), starting (not yet: admitted, receiving
  // state, in its first step), paused (the job waits for workers), restarting (its thread threw),
  // lost (its agent), given up (by its agent), idle (a pipeline's rank beyond dp x pp), standby.
  std::string state;
};

// The answer to a status request.
struct JobStatus {
  std::string job_name, state, plan;
  uint64_t generation = 0, step = 0, steps = 0;
  double last_loss = 0;
  std::vector<MemberStatus> members;   // by rank
  std::vector<MemberStatus> standbys;  // live workers that are not members
  uint64_t checkpoint_step = 0;        // the newest complete checkpoint (0: none yet)
  std::string checkpoint_path;         // its manifest
  double model_tflops = 0;             // the last committed step's model TFLOP/s ...
  double mfu = 0;                      // ... its MFU (NaN: a peak is unknown) ...
  std::string peak;                    // ... and the peak it is a fraction of
  std::string data_plane;              // the generation's data plane and why
  double epoch = 0;                    // epochs of the data set trained (0: its size unknown)
};

// Coordinator -> agents control (one-way, no payload beyond what is named).
struct LeaveGeneration {
  uint64_t generation = 0;  // end this generation at the next step boundary
};
// A member of `generation` is gone (lost, failed, or it left the generation unasked): the
// others give up the device collectives of it they wait in, which may never complete (NCCL
// between GPUs need not notice a lost peer). A planned change (LeaveGeneration alone) lets every
// member finish the step it is in.
struct AbandonGeneration {
  uint64_t generation = 0;
};

// worker -> coordinator (one way): its trace of observability.trace_steps (Chrome trace spans).
struct TraceEvent {
  std::string name, category;
  int64_t ts_us = 0, dur_us = 0;
  uint32_t thread = 0;
  int64_t step = -1;
};
struct TraceChunk {
  uint32_t agent = 0, device = 0, rank = 0;
  std::vector<TraceEvent> events;
};

// ---- the codec -------------------------------------------------------------------------------

ControlMessage encode(const Join& m);
ControlMessage encode(const JobSpec& m);
ControlMessage encode(const WorkerReady& m);
ControlMessage encode(const GenerationStart& m);
ControlMessage encode(const StepReport& m);
ControlMessage encode(const StateReceived& m);
ControlMessage encode(const WorkerDone& m);
ControlMessage encode(const CheckpointWritten& m);
ControlMessage encode(const WorkerFailed& m);
ControlMessage encode(const Shutdown& m);
ControlMessage encode(const JobStatus& m);
ControlMessage encode(const LeaveGeneration& m);
ControlMessage encode(const AbandonGeneration& m);
ControlMessage encode(const TraceChunk& m);
ControlMessage make_ack();
// An ack that says what the request does ("draining agent 3 (agent-3)"), for the operator.
ControlMessage make_accepted(const std::string& what);
// The stop of troupe stop, or with a checkpoint where it stops (troupe stop --checkpoint, SIGTERM).
ControlMessage make_stop_at_next_step(bool with_checkpoint = false);
ControlMessage make_status_request();
ControlMessage make_stop_request();
ControlMessage make_drain_request(uint32_t agent);
ControlMessage make_scale_request(uint32_t workers);
// admin -> coordinator: a checkpoint at the next step boundary (and a stop there).
ControlMessage make_checkpoint_request(bool stop);
// admin -> coordinator: optimizer.lr (the schedule's peak) from the next step boundary.
ControlMessage make_learning_rate_request(double lr);
// coordinator -> agents: a checkpoint at the first step boundary at or after `step`.
ControlMessage make_checkpoint_at_step(uint64_t step);

Join decode(proto::Join::Reader r);
JobSpec decode(proto::JobSpec::Reader r);
WorkerReady decode(proto::WorkerReady::Reader r);
GenerationStart decode(proto::GenerationStart::Reader r);
StepReport decode(proto::StepReport::Reader r);
StateReceived decode(proto::StateReceived::Reader r);
WorkerDone decode(proto::WorkerDone::Reader r);
CheckpointWritten decode(proto::CheckpointWritten::Reader r);
WorkerFailed decode(proto::WorkerFailed::Reader r);
Shutdown decode(proto::Shutdown::Reader r);
JobStatus decode(proto::JobStatus::Reader r);
TraceChunk decode(proto::TraceChunk::Reader r);

}  // namespace troupe::actors
