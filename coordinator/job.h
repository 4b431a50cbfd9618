// The job's coordinator: admits agents (job token checked by the bridge), hands them the job
// spec (workers never read TOML), waits for every worker's data-plane address, starts the
// generation with ranks, collects step reports into events.jsonl / metrics.jsonl / ledger.jsonl,
// and ends the job when every worker is done (or fails it with a reason when one is lost).
//
// It is a CAF actor registered with the bridge as kCoordinatorActorId; the `troupe run` and
// `troupe coordinator` commands and embedding programs (examples/embed) start it with
// spawn_coordinator and receive JobProgress / JobFinished in an observer actor of their own.
//
// A program that embeds a job (start_embedded_job) talks to it with actors of its own:
//   - events: an actor sends (subscribe_atom, itself) to the coordinator and then receives a
//     JobEvent for every line of events.jsonl as it is written (steps, members joining, failing
//     and leaving, generations, checkpoints, learning-rate changes, the end);
//   - requests: an actor sends an AdminRequest (status, stop, checkpoint, drain, scale, learning
//     rate) and gets an AdminReply. They are the CLI's own messages (troupe stop, checkpoint,
//     drain, scale, lr), served by the same code with the same answers.
// This header is public (installed): the API of embedding, stable within a minor version.
#pragma once

#include <caf/all.hpp>
#include <memory>
#include <string>

#include "coordinator/config.h"

namespace troupe::coordinator {

class JobMetrics;

struct JobProgress {
  uint64_t step = 0;   // committed steps so far
  uint64_t steps = 0;  // job.steps
  double loss = 0;     // of the last committed step
  double samples_per_s = 0;
  double tokens_per_s = 0;
  uint64_t generation = 0;
  uint64_t world_size = 0;
  double epoch = 0;  // epochs of the data set trained (0: its size unknown)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobProgress& x) {
  return f(caf::meta::type_name("job_progress"), x.step, x.steps, x.loss, x.samples_per_s,
           x.tokens_per_s, x.generation, x.world_size, x.epoch);
}

struct JobFinished {
  int exit_code = 0;
  std::string reason;  // one line
  std::string state;   // completed | stopped | failed
  uint64_t steps = 0;  // committed
  double loss = 0;     // of the last committed step
  // Stopped with a checkpoint where it stopped: its manifest (resumable: its directory is
  // step-<steps>); failed, or stopped without one: its newest checkpoint's, if it has one (a resume
  // goes on from there, the steps after it again).
  std::string checkpoint;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobFinished& x) {
  return f(caf::meta::type_name("job_finished"), x.exit_code, x.reason, x.state, x.steps, x.loss,
           x.checkpoint);
}

// The coordinator -> the observer: a change of the job's membership, as a line for people
// (`troupe run` prints it as it happens): joins, losses, drains, restarts, new generations,
// pauses.
struct JobNotice {
  std::string text;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobNotice& x) {
  return f(caf::meta::type_name("job_notice"), x.text);
}

// The coordinator -> a subscriber: one line of events.jsonl as it was written (`json`), its
// "event" and its "step" (-1 when it has none).
struct JobEvent {
  std::string event;
  int64_t step = -1;
  std::string json;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, JobEvent& x) {
  return f(caf::meta::type_name("job_event"), x.event, x.step, x.json);
}

// An actor -> the coordinator: (subscribe_atom, the actor) for every JobEvent from now on, until
// the actor ends.
using subscribe_atom = caf::atom_constant<caf::atom("jsubscr")>;

// An actor -> the coordinator: what the CLI asks for, answered with an AdminReply.
struct AdminRequest {
  enum class Kind : uint8_t {
    status,
    stop,
    checkpoint,
    checkpoint_and_stop,
    drain,
    scale,
    learning_rate
  };
  Kind kind = Kind::status;
  double value = 0;  // drain: the agent id; scale: the workers; learning_rate: optimizer.lr
  static AdminRequest stop() { return {Kind::stop, 0}; }
  static AdminRequest checkpoint(bool and_stop = false) {
    return {and_stop ? Kind::checkpoint_and_stop : Kind::checkpoint, 0};
  }
  static AdminRequest drain(uint32_t agent) { return {Kind::drain, double(agent)}; }
  static AdminRequest scale(uint32_t workers) { return {Kind::scale, double(workers)}; }
  // optimizer.lr (the schedule's peak) from the next step boundary, on every member.
  static AdminRequest learning_rate(double lr) { return {Kind::learning_rate, lr}; }
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdminRequest& x) {
  return f(caf::meta::type_name("admin_request"), x.kind, x.value);
}
struct AdminReply {
  bool ok = false;
  std::string error;  // why not, when !ok
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, AdminReply& x) {
  return f(caf::meta::type_name("admin_reply"), x.ok, x.error);
}

// The local launcher (the process that runs `troupe run`) -> the coordinator: something happened
// to an agent process it owns (agent_restarted, agent_gave_up, agent_started), for events.jsonl.
struct LauncherEvent {
  std::string event;
  int64_t slot = 0, attempt = 0, pid = 0;
  std::string detail;
  int64_t backoff_ms = 0;  // agent_restarted: how long the launcher waited after the exit
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, LauncherEvent& x) {
  return f(caf::meta::type_name("launcher_event"), x.event, x.slot, x.attempt, x.pid, x.detail,
           x.backoff_ms);
}

// The coordinator -> the observer (the local launcher): start this many more agents
// (`troupe scale` above the current size).
struct ScaleAgents {
  int64_t count = 0;
  std::string why = "scale";  // (agent_started's detail: "scale", "take-over", ...)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ScaleAgents& x) {
  return f(caf::meta::type_name("scale_agents"), x.count, x.why);
}

// The coordinator -> the local launcher: the agent in this slot (while it is this pid) was
// drained: when it exits, however it exits, it is not started again. pid 0: the slot whose
// restart waits out its backoff (no process runs) is not restarted.
struct RetireAgent {
  int64_t slot = 0, pid = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RetireAgent& x) {
  return f(caf::meta::type_name("retire_agent"), x.slot, x.pid);
}

// The coordinator -> the local launcher, 2 x elastic.failure_timeout_ms + 10 s after the agent in
// this slot (while it is this pid) was lost (missed heartbeats, cut as hung): if its process still
// lives (stopped, hung), it is ended (SIGKILL) and restarted as a crashed one would be; `why`
// names the loss in its restart's event.
struct EndLostAgent {
  int64_t slot = 0, pid = 0;
  std::string why;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, EndLostAgent& x) {
  return f(caf::meta::type_name("end_lost_agent"), x.slot, x.pid, x.why);
}

// The launcher -> the coordinator, once: where to send ScaleAgents (`troupe scale` above the
// current size). Without one, such requests are refused by cluster.launcher = "external".
using launcher_atom = caf::atom_constant<caf::atom("jlauncher")>;

// The process running the coordinator got SIGINT or SIGTERM (the signal's number): the first
// stops the job at the next step boundary (as `troupe stop`), a second one at once (the job
// fails naming the signal). Before the first generation, the first one fails the job.
using interrupt_atom = caf::atom_constant<caf::atom("jinterr")>;

// The actor system settings of a process that runs a coordinator: actors::configure_system plus
// the job's observer messages.
void configure_job_system(caf::actor_system_config& cfg);

// Spawns the coordinator (detached) and registers it with the bridge. The run directory must
// exist. observer gets JobProgress after each committed step and one JobFinished.
// metrics: the endpoint's (observability.metrics_listen), fed from the run logs; null: none.
caf::actor spawn_coordinator(caf::actor_system& system, caf::actor bridge, const JobConfig& config,
                             const std::string& run_dir, caf::actor observer,
                             std::shared_ptr<JobMetrics> metrics = nullptr);

// A job inside a program's own actor system: its coordinator, listening for agents at
// `address` (config.listen; port 0 picks one) with the job's token. The run directory must
// exist. observer: as spawn_coordinator's. Agents join with workers::run_agent
// (workers/agent.h), in this process or others. The config is checked as a file is (it may
// have been changed after parse_config; throws ConfigError naming the key); its checkpoints go
// to checkpoint.dir, by default RUN_DIR/checkpoints; RUN_DIR/config.toml gets the effective
// config unless a job ran there (troupe export and troupe status read it).
struct EmbeddedJob {
  caf::actor coordinator, bridge;
  std::string address, job_id, token;
};
EmbeddedJob start_embedded_job(caf::actor_system& system, const JobConfig& config,
                               const std::string& run_dir, caf::actor observer);
// Ends the job's actors (after its JobFinished, or to abandon it).
void stop_embedded_job(EmbeddedJob& job);

// Writes `token` for job_id to DIR/job.token readable only by its owner.
void write_token_file(const std::string& path, const std::string& job_id, const std::string& token);
std::string new_token();

}  // namespace troupe::coordinator
