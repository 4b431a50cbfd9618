// Your own training loop, made elastic: your model code, your optimizer, your data; Troupe keeps
// the membership, the data assignment, the state of members that join, and the exactly-once
// ledger. As TorchFT's manager does for PyTorch, the loop calls Troupe at step boundaries:
//
//   troupe::ElasticLoop loop({"127.0.0.1:4000", "run/job.token"}, {save_state, load_state});
//   while (auto step = loop.next_step()) {          // the step, this member's rank and samples
//     compute_gradients(step->begin, step->end);    // global sample positions [begin, end)
//     if (!loop.allreduce(grads.data(), grads.size())) continue;  // a member was lost: redo
//     if (loop.commit(my_loss)) apply_update();     // everyone agreed the step happened
//   }
//   return loop.exit_code();
//
// The job is a `troupe run` / `troupe coordinator` of a config with model.kind = "external"
// (docs/config.md): it says job.steps, batch.global and the elastic settings; the members are
// processes of your program, started by hand or by a scheduler (cluster.launcher =
// "external"), that may die, join and leave at any time:
//   - next_step() waits until this member trains a step in a generation with the others, and
//     holds the job's state as of that step: a member that lacks it (a joiner; one that missed
//     the last commit) receives it from one that has it (LoopState::save on that one,
//     LoopState::load on this one) before next_step() returns.
//   - allreduce() sums over the step's members; false when a member was lost: the step is
//     discarded (do not update) and next_step() forms the next generation and gives the step
//     again.
//   - shared_floats(n) gives a gradient buffer in memory the members of this host map: its
//     allreduce() reads the others' buffers in place instead of copying (same result bits).
//   - commit(loss) ends the step: the step's loss when every member agreed on it (apply your
//     update then, before the next call), nullopt when the step is discarded. A loss that sums
//     to nan or infinity fails the job ("the training diverged at step N"), as a built-in
//     model's does: nullopt, and next_step() ends. `loss` is this
//     member's part (its samples' loss / batch.global): the step's loss is their sum, as the
//     run's metrics record it.
// Each step's global batch is [step * B, (step + 1) * B) of positions; a member's share moves
// with the membership, and every position of every committed step is used once (ledger.jsonl).
// At the job's end every member reports a checksum of its saved state: job_finished says
// whether they are identical.
//
// Thread-safety: one thread calls everything. Your update must be a deterministic function of
// the state and the summed gradients (every member applies the same one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe {

struct LoopOptions {
  LoopOptions() = default;
  // LoopOptions{address, token_file} (what `troupe run` prints), warning-free under -Wextra.
  LoopOptions(std::string join, std::string token_file, std::string name = "")
      : join(std::move(join)), token_file(std::move(token_file)), name(std::move(name)) {}
  std::string join;        // the coordinator's HOST:PORT (RUN_DIR/coordinator.addr)
  std::string token_file;  // the job's token file (RUN_DIR/job.token)
  std::string name;        // in the job's events and logs; default host:pid
  // The control plane's heartbeats, and how long a coordinator not heard from is lost: 0, the
  // job's elastic.heartbeat_interval_ms and failure_timeout_ms once joined (200 and 3000 ms
  // until then); set, these. The data plane waits the job's elastic.failure_timeout_ms for
  // another member's progress, as every member does.
  int64_t heartbeat_interval_ms = 0;
  int64_t failure_timeout_ms = 0;
  // Room for shared_floats() and shared_doubles(): address space only, the memory is taken as it
  // is written.
  size_t shared_bytes = size_t(1) << 30;
};

// The state every member keeps identical (parameters, optimizer moments, counters): as bytes,
// for a member that lacks it and for the final checksum. load() gets what save() returned on
// another member at the same step.
struct LoopState {
  std::function<std::vector<uint8_t>()> save;
  std::function<void(const std::vector<uint8_t>&)> load;
};

// What the job's config says.
struct LoopJob {
  std::string name;
  uint64_t seed = 0, steps = 0;
  uint64_t global_batch = 0, micro_batch = 0;
  double lr = 0;  // optimizer.lr (the loop may use it, or its own)
};

struct LoopStep {
  uint64_t step = 0;  // the same on every member
  uint64_t generation = 0;
  uint32_t rank = 0, world_size = 0;
  uint64_t begin = 0, end = 0;  // this member's global sample positions
  bool state_received = false;  // load() ran just before this step
  double lr = 0;  // optimizer.lr now: the job's, or what `troupe lr` (or an actor) set since
};

class ElasticLoop {
 public:
  // Joins the job; throws std::runtime_error saying why it cannot (the coordinator unreachable,
  // the token refused, a job whose model is not "external").
  ElasticLoop(const LoopOptions& options, LoopState state);
  // Ends this member: the others go on without it, as after a member lost (member_failed: its
  // link went); its state is not lost while another member holds it.
  ~ElasticLoop();
  ElasticLoop(const ElasticLoop&) = delete;
  ElasticLoop& operator=(const ElasticLoop&) = delete;

  const LoopJob& job() const;
  // The next step to train; nullopt when the job has ended for this member (done, stopped,
  // drained, the coordinator lost): exit_code() and reason() say how.
  std::optional<LoopStep> next_step();
  // Sums count values over the step's members, in place. false: the generation broke.
  bool allreduce(float* data, size_t count);
  bool allreduce(double* data, size_t count);
  // `count` zeros in memory the members on this host map, for your gradients: allreduce() of such
  // a buffer (or of a part of it) reads the other members' straight from theirs instead of
  // copying it twice (registered buffers: comm/shared_arena.h; from 256 KiB on Intel CPUs, 2 MiB
  // on AMD), with the same result bits, when every member of the host passes one. It lives as
  // long as the loop. Ask before the first next_step() (later: read in place from the next
  // generation on). Throws std::runtime_error saying why when the system refuses shared memory or
  // LoopOptions::shared_bytes has no room left.
  float* shared_floats(size_t count);
  double* shared_doubles(size_t count);
  // How many of this member's allreduce() calls so far read the others' buffers in place.
  uint64_t in_place_allreduces() const;
  // The step's end: its loss (the members' parts summed), and apply the update now; nullopt:
  // discard the step.
  std::optional<double> commit(double loss);
  // Asks to leave the job at the next step boundary (a drain, as `troupe drain` of this member):
  // "" when the coordinator will: next_step() then ends (exit_code() 0, reason() "drained") and
  // the others go on without a loss; else why not (it would leave fewer than elastic.min_workers,
  // the job is not running, the coordinator did not answer within 10 s): train on, or end the
  // loop (a loss). Any thread.
  std::string leave();
  int exit_code() const;  // 0: the job completed, stopped or let this member leave
  std::string reason() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe
