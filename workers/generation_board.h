// What an agent learns from its coordinator, for its device supervisors (one thread per device)
// and its main thread: the newest generation, a stop at the next step, a checkpoint wanted at a
// step boundary, a generation to leave at the next step boundary, and the shutdown (with the exit
// code). The agent's actor writes it;
// the threads wait on it.
//
// Thread-safety: every member function may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>

#include "actors/job_protocol.h"

namespace troupe::workers {

class GenerationBoard {
 public:
  // From the agent's actor.
  void start(actors::GenerationStart g);
  void stop_at_next_step(bool with_checkpoint = false);
  void checkpoint_at_step(uint64_t step);  // keeps the highest asked for
  void leave(uint64_t generation);
  void shut_down(int exit_code, const std::string& reason);  // the first call wins

  // The agent joined a coordinator again (its old one was lost): generations go on from
  // `next_generation` (the new coordinator's numbering; the lost one's are forgotten, and so is
  // a stop it asked for), and every worker publishes again for it (what it published went to the
  // lost one).
  void rejoined(uint64_t next_generation);
  uint64_t rejoins() const { return rejoins_.load(); }
  uint64_t next_generation() const { return next_generation_.load(); }

  // The newest generation, once it is at least `want`; nullopt when the agent shuts down first,
  // or when it rejoined a coordinator since the caller's publication (rejoins() is no longer
  // `rejoins_seen`: publish again, for at least next_generation()). No deadline of its own: the
  // job may pause (below elastic.min_workers) for as long as the coordinator allows; the
  // coordinator's end, or its loss past elastic.rejoin_timeout_ms, ends the wait (shut_down).
  std::optional<actors::GenerationStart> await(uint64_t want, uint64_t rejoins_seen);
  // After a step's vote said stop: another member's agent may have heard why (a stop, or a
  // membership change) before this one did. Waits up to `timeout` for the reason.
  void await_reason(uint64_t generation, std::chrono::milliseconds timeout);
  // Waits up to `timeout` for the shutdown; true when it came.
  bool await_shutdown(std::chrono::milliseconds timeout);
  // After this worker's report of the job's end in `generation`: waits for the shutdown; false
  // when the generation is left first (a member lost before its own report: the others go on in
  // a generation of their own, which writes what the lost one did not). No deadline of its own,
  // as await(): the job may pause below elastic.min_workers for as long as the coordinator
  // allows; its end, or its loss past elastic.rejoin_timeout_ms, ends the wait.
  bool await_end(uint64_t generation);

  bool stop_requested() const { return stop_.load(); }
  // A stop asked with a checkpoint where it stops (set before the stop: a thread that saw the
  // stop sees it too).
  bool checkpoint_at_stop() const { return checkpoint_at_stop_.load(); }
  // The step at or after which a checkpoint is wanted (troupe checkpoint); 0: none asked for.
  uint64_t checkpoint_wanted() const { return checkpoint_at_.load(); }
  bool leaving(uint64_t generation) const { return leave_.load() == generation; }
  // A member of the generation is gone (actors::AbandonGeneration): its device collectives in
  // flight are given up.
  void abandon(uint64_t generation) { abandon_.store(generation); }
  bool abandoned(uint64_t generation) const { return abandon_.load() == generation; }
  bool shutting_down() const;
  uint64_t generation() const;
  int exit_code() const;
  std::string reason() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<actors::GenerationStart> latest_;
  std::atomic<bool> stop_{false}, checkpoint_at_stop_{false};
  std::atomic<uint64_t> leave_{0}, abandon_{0};
  std::atomic<uint64_t> checkpoint_at_{0};
  std::atomic<uint64_t> rejoins_{0}, next_generation_{0};
  bool shutdown_ = false;
  int exit_code_ = 0;
  std::string reason_;
};

}  // namespace troupe::workers
