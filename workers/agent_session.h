// An agent's membership of a job: its actor system and bridge, the join (token checked by the
// coordinator's bridge), its actor that puts the coordinator's pushes onto a GenerationBoard,
// and the watch for the coordinator's loss. Two things run on it: `troupe agent` (one
// DeviceSupervisor per device, workers/agent.h) and a user's own training loop
// (workers/elastic_loop.h).
//
// Thread-safety: send(), agent_id() and board() from any thread; watch() on one thread.
#pragma once

#include <atomic>
#include <caf/all.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "actors/control_message.h"
#include "actors/job_protocol.h"
#include "actors/signals.h"
#include "workers/agent.h"
#include "workers/generation_board.h"

namespace troupe::workers {

// What the agent's program trains, as its Join says (actors::Join::kinds): options.kinds, else
// the built-in kinds and those of options.extensions.
std::vector<std::string> trained_kinds(const AgentOptions& options);

class AgentSession {
 public:
  // Starts the actor system and joins the job at options.join. error() says why not (the
  // coordinator unreachable, the join refused); the session is then unusable.
  explicit AgentSession(const AgentOptions& options);
  ~AgentSession();  // stops its actors
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;

  const std::string& error() const { return error_; }
  // The coordinator refused this program for its job (its protocol, or kinds it cannot train):
  // it never can join it (troupe agent: exit 2).
  bool refused() const { return refused_join_; }
  const std::string& name() const { return name_; }
  const actors::JobSpec& spec() const { return spec_; }  // as the first join answered
  // Its id: the first join's, then the one a coordinator that took the run over gave it.
  uint32_t agent_id() const { return agent_id_->load(); }
  GenerationBoard& board() { return *board_; }
  // A message to the coordinator, one way.
  void send(actors::ControlMessage m);

  // Until the coordinator's shutdown (the board's shut_down). When the coordinator is lost (or,
  // for a launched agent, its process: SIGHUP) the workers end the generation at the next step
  // boundary and keep their state, and the agent waits up to elastic.rejoin_timeout_ms for a
  // coordinator that takes the run over (`troupe run --resume RUN_DIR`; it says where in the
  // run directory's coordinator.addr): it joins it as an agent to adopt, sends again its recent
  // step reports and checkpoint shard reports (those sent while the lost coordinator could not
  // hear them complete a checkpoint still), and its workers publish to it
  // (GenerationBoard::rejoined). Past the timeout it shuts down with 1, saying why. Signals,
  // when given, ask the coordinator to drain this agent (SIGTERM, SIGINT); a second one ends it
  // at once. One taken before the coordinator was lost is asked again of the one that took the
  // run over, once its first generation has started.
  // Returns the signals it took.
  int watch(actors::SignalWatcher* signals);
  // Asks the coordinator to drain this agent (as `troupe drain` does): "" when it will, at the
  // next step boundary (its Shutdown, exit 0, follows); else why not, and whether it refused
  // (an answer) rather than did not answer within 10 s.
  std::string ask_drain(bool* refused = nullptr);

 private:
  using Clock = std::chrono::steady_clock;
  std::string link_lost(const std::string& what, Clock::duration stalled,
                        Clock::time_point stalled_at) const;
  static constexpr size_t kKeptReports = 4096;
  static constexpr size_t kKeptShardReports = 64;
  void on_signal(int sig, bool again);
  void ask_leave(int sig);
  void ask_leave_again();
  void await_stop();
  void leave_at_once();
  void keep_report(const actors::ControlMessage& m);
  void lost(const std::string& why);
  std::string address_now() const;
  void try_rejoin();

  AgentOptions options_;
  caf::actor_system_config config_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor bridge_, agent_;
  std::unique_ptr<caf::scoped_actor> self_;
  std::shared_ptr<GenerationBoard> board_;
  std::shared_ptr<std::atomic<uint32_t>> agent_id_;
  std::string name_, error_, address_;
  bool refused_join_ = false;
  std::atomic<uint64_t> coordinator_{0};  // (send() reads it on the workers' threads)
  actors::JobSpec spec_;
  std::mutex reports_mu_;
  std::deque<actors::ControlMessage> reports_, shard_reports_;  // (step, checkpoint shards)
  std::optional<Clock::time_point> lost_since_;  // the coordinator was lost (watch's thread)
  std::string lost_reason_, rejoin_error_;       // (why the last try to rejoin failed)
  Clock::time_point next_try_{};
  // A signal whose drain the coordinator refused: the job's own stop is awaited until `until`,
  // `at_most` (watch's thread).
  static constexpr std::chrono::seconds kStopGrace{5};
  struct Refused {
    int signal;
    std::string error;
    Clock::time_point until, at_most;
  };
  std::optional<Refused> refused_;
  int signalled_ = 0;         // the signal that asked this agent to leave (watch's thread)
  bool leave_again_ = false;  // ... taken before a take-over: asked of the new coordinator
};

}  // namespace troupe::workers
