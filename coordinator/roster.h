// Admission (the rendezvous's book): the agents that joined, with their workers, and which
// workers may take part. An agent's id is its join order; a worker is (agent id, device index):
// actors::WorkerId, the one id space (ranks exist only within a generation).
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "actors/job_protocol.h"

namespace troupe::coordinator {

struct Agent {
  uint32_t id = 0;
  uint64_t node = 0;  // its control-plane node
  std::string name, host;
  std::string host_identity;  // comm::host_identity() of its host ("": not said)
  uint32_t pid = 0;
  std::vector<std::string> devices;
  bool alive = true;     // false once lost or drained
  bool standby = false;  // logged as a standby (above elastic.max_workers)
  bool adopted = false;  // came back to a coordinator that took the run over (no launcher's child)
};

class Roster {
 public:
  // Admits an agent that joined from `node`; it gets the next id.
  const Agent& admit(uint64_t node, const actors::Join& join);

  size_t size() const { return agents_.size(); }
  size_t alive() const;  // (not lost, not drained)
  const std::vector<Agent>& agents() const { return agents_; }
  Agent& at(uint32_t id) { return agents_.at(id); }
  const Agent& at(uint32_t id) const { return agents_.at(id); }
  bool known(actors::WorkerId w) const {
    return w.agent < agents_.size() && w.device < agents_[w.agent].devices.size();
  }
  // The live agent at `node`, or nullptr.
  Agent* live_at(uint64_t node);

  // A worker may take part: it is known, its agent is alive (not lost, not drained) and its
  // agent did not give up on it.
  bool usable(actors::WorkerId w) const;
  void give_up(actors::WorkerId w) { given_up_.insert(w); }
  bool given_up(actors::WorkerId w) const { return given_up_.count(w) > 0; }
  std::vector<actors::WorkerId> usable_workers() const;

  // "agent-1/0" (for messages); "cpu:0" (the device it runs on).
  std::string name(actors::WorkerId w) const;
  std::string device(actors::WorkerId w) const;

 private:
  std::vector<Agent> agents_;
  std::set<actors::WorkerId> given_up_;
};

}  // namespace troupe::coordinator
