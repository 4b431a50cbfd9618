// A supervisor in the OTP sense (one_for_one): it starts its children, monitors them, restarts a
// child that fails (exits with a non-normal reason) up to max_restarts times within window, and
// past that escalates: it stops the other children and exits with an error naming the child,
// so that its own parent (which monitors or links it) sees the failure.
//
// A child that exits normally is done and is not restarted.
//
// Events for an observer (optional): ChildRestarted{name, count} after each restart.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace troupe::actors {

struct ChildSpec {
  std::string name;
  // Spawns the child; called again for every restart.
  std::function<caf::actor(caf::actor_system&)> start;
};

struct SupervisorOptions {
  int max_restarts = 3;
  std::chrono::milliseconds window{5000};
};

struct ChildRestarted {
  std::string name;
  int restarts = 0;  // restarts of this child so far
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ChildRestarted& x) {
  return f(caf::meta::type_name("child_restarted"), x.name, x.restarts, x.reason);
}

// The supervisor's exit reason on escalation has category atom("troupe_sup").
caf::actor spawn_supervisor(caf::actor_system& system, std::vector<ChildSpec> children,
                            SupervisorOptions options, caf::actor observer = {});

// Ask a supervisor for the current actor of a child: (child_atom, name) -> actor.
using child_atom = caf::atom_constant<caf::atom("child")>;

}  // namespace troupe::actors
