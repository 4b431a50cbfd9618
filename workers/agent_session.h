// An agent's membership of a job: its actor system and bridge, the join (token checked by the
// coordinator's bridge), its actor that puts the coordinator's pushes onto a GenerationBoard,
// and the watch for the coordinator's loss. Two things run on it: `troupe agent` (one
// DeviceSupervisor per device, workers/agent.h) and a user's own training loop
// (workers/elastic_loop.h).
//
// Thread-safety: send() and board() from any thread; watch() on one thread.
#pragma once

#include <atomic>
#include <caf/all.hpp>
#include <memory>
#include <string>

#include "actors/control_message.h"
#include "actors/job_protocol.h"
#include "actors/signals.h"
#include "workers/agent.h"
#include "workers/generation_board.h"

namespace troupe::workers {

class AgentSession {
 public:
  // Starts the actor system and joins the job at options.join. error() says why not (the
  // coordinator unreachable, the join refused); the session is then unusable.
  explicit AgentSession(const AgentOptions& options);
  ~AgentSession();  // stops its actors
  AgentSession(const AgentSession&) = delete;
  AgentSession& operator=(const AgentSession&) = delete;

  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  const actors::JobSpec& spec() const { return spec_; }
  GenerationBoard& board() { return *board_; }
  // A message to the coordinator, one way.
  void send(actors::ControlMessage m);

  // Until the coordinator's shutdown or its loss (the board's shut_down either way); signals,
  // when given, ask the coordinator to drain this agent (SIGTERM, SIGINT) or end it (SIGHUP from
  // the launcher's death, a second signal).
  void watch(actors::SignalWatcher* signals);

 private:
  void on_signal(int sig, bool again);

  caf::actor_system_config config_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor bridge_, agent_;
  std::unique_ptr<caf::scoped_actor> self_;
  std::shared_ptr<GenerationBoard> board_;
  std::shared_ptr<std::atomic<uint32_t>> agent_id_;
  std::string name_, error_;
  uint64_t coordinator_ = 0;
  actors::JobSpec spec_;
};

}  // namespace troupe::workers
