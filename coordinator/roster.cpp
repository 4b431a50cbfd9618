#include "coordinator/roster.h"

#include <algorithm>

namespace troupe::coordinator {

const Agent& Roster::admit(uint64_t node, const actors::Join& j) {
  Agent a;
  a.id = uint32_t(agents_.size());
  a.node = node;
  a.name = j.agent_name;
  a.host = j.host;
  a.host_identity = j.host_identity;
  a.pid = j.pid;
  a.devices = j.devices;
  // A rejoin is an adoption (an agent of a coordinator that took the run over, no child of this
  // one's launcher) unless this very agent was here before: then it is what it was (a launcher's
  // agent whose link was lost and came back was taken for adopted, and one was launched in its
  // place when it was lost again: a job of one agent more than it asked).
  const auto before = std::find_if(agents_.begin(), agents_.end(), [&](const Agent& b) {
    return b.pid == j.pid && b.name == j.agent_name && b.host == j.host &&
           b.host_identity == j.host_identity;
  });
  a.adopted = before != agents_.end() ? before->adopted : j.rejoin;
  agents_.push_back(std::move(a));
  return agents_.back();
}

Agent* Roster::live_at(uint64_t node) {
  for (auto& a : agents_)
    if (a.node == node && a.alive) return &a;
  return nullptr;
}

bool Roster::usable(actors::WorkerId w) const {
  return known(w) && agents_[w.agent].alive && !given_up_.count(w);
}

std::vector<actors::WorkerId> Roster::usable_workers() const {
  std::vector<actors::WorkerId> out;
  for (const auto& a : agents_)
    for (uint32_t d = 0; d < a.devices.size(); ++d)
      if (usable({a.id, d})) out.push_back({a.id, d});
  return out;
}

std::string Roster::name(actors::WorkerId w) const {
  return known(w) ? agents_[w.agent].name + "/" + std::to_string(w.device) : w.name();
}

std::string Roster::device(actors::WorkerId w) const {
  return known(w) ? agents_[w.agent].devices[w.device] : "?";
}

size_t Roster::alive() const {
  return size_t(
      std::count_if(agents_.begin(), agents_.end(), [](const Agent& a) { return a.alive; }));
}

}  // namespace troupe::coordinator
