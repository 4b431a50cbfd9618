// The local launcher (cluster.launcher = "local", `troupe run`): one agent process per slot,
// started with the job's address and token. An agent that fails (non-zero exit, or a signal) is
// restarted after a backoff, at most elastic.max_restarts times per slot
// (elastic::decide_restart); it joins as a new member. ScaleAgents from the coordinator adds
// slots. A lost agent whose process still lives (stopped, hung: EndLostAgent) is ended with SIGKILL
// and restarted like a crashed one. Every start, restart and give-up is reported to the coordinator
// (LauncherEvent, for events.jsonl). Exits are seen through an ExitWatcher (no polling).
//
// At the job's end, (stop_atom, int64 grace_ms) -> bool: the launcher restarts nothing more,
// waits up to grace_ms for its agents to exit, kills the rest, and answers whether all exited
// by themselves.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "elastic/restart_policy.h"

namespace troupe::coordinator {

struct LauncherOptions {
  std::string program;                  // the troupe executable
  std::vector<std::string> agent_args;  // after `agent`: --join ADDR --token-file F ...
  std::string run_dir;                  // agent-N.log goes here
  int64_t agents = 0;                   // slots to start at once
  int64_t first_slot = 0;               // the first slot's N (agent-N)
  elastic::RestartPolicy restarts;
};

using stop_atom = caf::atom_constant<caf::atom("lstop")>;

// Spawns the launcher (detached: it forks), starts its agents and tells the coordinator where it
// is (launcher_atom).
caf::actor spawn_local_launcher(caf::actor_system& system, LauncherOptions options,
                                caf::actor coordinator);

}  // namespace troupe::coordinator
