// What `troupe scale` and `troupe drain` do to a running job, as pure functions over the live
// agents: refuse with the reason, ask the launcher for more agents, or drain which agents.
// Shrinking drains standbys first, then members, newest first, and never goes below the target
// (an agent with more workers than the gap is skipped for a smaller one).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::elastic {

struct LiveAgent {
  uint32_t id = 0;
  uint32_t workers = 0;  // its usable workers
  bool member = false;   // some of its workers are members of the current generation
};

struct ScaleLimits {
  uint32_t min_workers = 1;  // elastic.min_workers, and a fixed pipeline's stages
  uint32_t max_workers = 0;  // elastic.max_workers (0: none)
  bool can_launch = false;   // the local launcher starts agents
  std::string launcher;      // cluster.launcher, for the refusal
  // How workers are added without the launcher, for the refusal (a loop of its own: another
  // member of that program; `troupe agent` cannot train it).
  std::string joined_by = "`troupe agent --join`";
  uint32_t workers_per_agent = 1;
  // The local launcher starts every agent on this machine: at most this many workers (0: no
  // bound), and the machine's cores for the refusal.
  uint32_t machine_workers = 0;
  uint32_t machine_cores = 0;
};

struct ScaleDecision {
  enum class Kind : uint8_t { refuse, invalid, launch, drain, nothing } kind = Kind::nothing;
  std::string reason;             // refuse / invalid: why, for the operator; nothing: the size
  uint32_t agents_to_launch = 0;  // launch
  std::vector<uint32_t> drain;    // drain: agent ids, in the order chosen
};

// agents: the live agents in join order; starting: the workers of agents the launcher started
// that have not joined yet (they count as the job's: a scale asked again before they join
// launches no more; one below them is refused until they have joined). nothing: reason says the
// size.
ScaleDecision decide_scale(uint32_t target, const std::vector<LiveAgent>& agents,
                           const ScaleLimits& limits, uint32_t starting = 0);

// `troupe drain --agent id`: drain {id}, or invalid (no such live agent), or refuse (too few left).
ScaleDecision decide_drain(uint32_t id, const std::vector<LiveAgent>& agents,
                           const ScaleLimits& limits);

uint32_t usable_workers(const std::vector<LiveAgent>& agents);

}  // namespace troupe::elastic
