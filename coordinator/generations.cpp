#include "coordinator/generations.h"

#include <algorithm>
#include <iterator>

#include "comm/error.h"

namespace troupe::coordinator {

using actors::WorkerId;

bool Generations::is_member(WorkerId w) const {
  for (const auto& m : members_)
    if (m.worker == w) return true;
  return false;
}

bool Generations::has_member_on(uint32_t agent) const {
  for (const auto& m : members_)
    if (m.worker.agent == agent) return true;
  return false;
}

bool Generations::publish(actors::WorkerReady r) {
  if (r.generation != generation_ + 1) return false;
  const WorkerId w = r.worker;
  published_[w] = std::move(r);
  return true;
}

void Generations::expect(std::vector<WorkerId> workers) {
  std::sort(workers.begin(), workers.end());
  expected_ = std::move(workers);
}

bool Generations::is_expected(WorkerId w) const {
  return std::find(expected_.begin(), expected_.end(), w) != expected_.end();
}

elastic::MembershipState Generations::membership_state(const Roster& roster) const {
  elastic::MembershipState st;
  st.generation = generation_;
  for (const auto& m : members_)
    st.members.push_back({m.worker.key(), roster.usable(m.worker) && !restarting_.count(m.worker),
                          m.holding.applied});
  // A joiner or standby counts once it has published for the next generation (the members
  // train on while it builds its worker); a restarting one is expected anyway.
  for (WorkerId w : roster.usable_workers())
    if ((!is_member(w) && published(w)) || restarting_.count(w)) st.waiting.push_back(w.key());
  return st;
}

std::optional<std::vector<actors::WorkerReady>> Generations::ready(
    const std::vector<WorkerId>& who) const {
  std::vector<actors::WorkerReady> next;
  for (WorkerId w : who) {
    auto it = published_.find(w);
    if (it == published_.end()) return std::nullopt;
    next.push_back(it->second);
  }
  std::sort(next.begin(), next.end(),
            [](const auto& a, const auto& b) { return a.worker < b.worker; });
  return next;
}

std::vector<actors::WorkerReady> Generations::all_published() const {
  std::vector<actors::WorkerReady> out;
  for (const auto& [w, r] : published_) out.push_back(r);  // (a map: by worker id)
  return out;
}

std::string Generations::missing(const std::vector<WorkerId>& who, const Roster& roster) const {
  std::string out;
  for (WorkerId w : who)
    if (!published(w)) out += (out.empty() ? "" : ", ") + roster.name(w);
  return out;
}

std::optional<std::string> Generations::broken_by(const Roster& roster) const {
  std::string error, echo;  // (a member's own error; one that says another gave up first)
  for (const auto& m : members_) {
    auto it = published_.find(m.worker);
    if (!roster.usable(m.worker) || it == published_.end()) return std::nullopt;
    const std::string& e = it->second.last_error;
    std::string& into = e.find(comm::kGaveUpFirst) == std::string::npos ? error : echo;
    if (into.empty()) into = e;
  }
  return !error.empty() ? error : !echo.empty() ? echo : "no error reported";
}

void Generations::start(std::vector<actors::WorkerReady> members) {
  members_ = std::move(members);
  published_.clear();
  expected_.clear();
  restarting_.clear();
  taken_over_world_ = 0;
  ++generation_;
}

void Generations::forget_agent(uint32_t agent) {
  for (auto it = published_.begin(); it != published_.end();)
    it = it->first.agent == agent ? published_.erase(it) : std::next(it);
}

}  // namespace troupe::coordinator
