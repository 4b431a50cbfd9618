// Small control-plane services every node can host: an echo actor (answers an Echo request with
// the same content) and a sink (counts one-way messages; a request returns the count in an
// Echo's sequence). Used by the demo, the tests and the control-plane benchmark.
#pragma once

#include <caf/all.hpp>

namespace troupe::actors {

constexpr uint64_t kEchoActorId = 1;
constexpr uint64_t kSinkActorId = 2;
constexpr uint64_t kCoordinatorActorId =
    10;                                 // the job's coordinator (in `troupe run`/`coordinator`)
constexpr uint64_t kAgentActorId = 20;  // an agent's node supervisor

caf::actor spawn_echo(caf::actor_system& system);
caf::actor spawn_sink(caf::actor_system& system);

}  // namespace troupe::actors
