// The generations' book: the members of the current generation (by rank), the workers that
// published for the next one (WorkerReady), the members the next one is expected to have once a
// change is decided, and the workers that threw in this generation and are being restarted.
// It answers elastic::decide_membership's question (membership_state) and says when the next
// generation can start (next_members).
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "actors/job_protocol.h"
#include "coordinator/roster.h"
#include "elastic/membership.h"

namespace troupe::coordinator {

class Generations {
 public:
  uint64_t current() const { return generation_; }  // 0 before the first
  // Its size (the recorded one, for a generation taken over from a lost coordinator).
  size_t world() const { return members_.empty() ? taken_over_world_ : members_.size(); }
  // A coordinator taking over a run: its last generation was `generation`, of `world` members
  // (whose reports may still come); the next one is generation + 1.
  void continue_after(uint64_t generation, size_t world) {
    generation_ = generation;
    taken_over_world_ = world;
  }
  const std::vector<actors::WorkerReady>& members() const { return members_; }
  bool is_member(actors::WorkerId w) const;
  bool has_member_on(uint32_t agent) const;

  // A worker published for generation current() + 1; false (and nothing kept) when stale.
  bool publish(actors::WorkerReady ready);
  bool published(actors::WorkerId w) const { return published_.count(w) > 0; }
  size_t published_count() const { return published_.size(); }
  // An agent lost before the first generation: its workers' addresses go (they count no more).
  void forget_agent(uint32_t agent);

  // The next generation's members, once a change is decided (sorted by worker id).
  void expect(std::vector<actors::WorkerId> workers);
  void forget_expected() { expected_.clear(); }
  const std::vector<actors::WorkerId>& expected() const { return expected_; }
  bool is_expected(actors::WorkerId w) const;

  // A member threw in this generation and its agent restarts it (re-admitted in the next one).
  void restarting(actors::WorkerId w) { restarting_.insert(w); }
  bool is_restarting(actors::WorkerId w) const { return restarting_.count(w) > 0; }

  // What decide_membership needs: the current members (alive unless lost or restarting, with
  // their applied steps) and the usable workers waiting to join (published, or restarting).
  elastic::MembershipState membership_state(const Roster& roster) const;

  // The workers the next generation has when every one of `who` has published, by worker id.
  std::optional<std::vector<actors::WorkerReady>> ready(
      const std::vector<actors::WorkerId>& who) const;
  // Every published worker, by worker id (the first generation takes them all).
  std::vector<actors::WorkerReady> all_published() const;
  // The workers in `who` that have not published, as "agent-1/0, ...".
  std::string missing(const std::vector<actors::WorkerId>& who, const Roster& roster) const;

  // Why the current generation broke when every member published again without a membership
  // event (its data plane failed): the first member's own error (not one that says another gave
  // up first: that other's says why), else the first one. nullopt unless every member of the
  // current generation is usable and has published.
  std::optional<std::string> broken_by(const Roster& roster) const;

  // Generation current() + 1 starts with these members (by rank): the book starts afresh.
  void start(std::vector<actors::WorkerReady> members);

 private:
  uint64_t generation_ = 0;
  size_t taken_over_world_ = 0;
  std::vector<actors::WorkerReady> members_;
  std::map<actors::WorkerId, actors::WorkerReady> published_;
  std::vector<actors::WorkerId> expected_;
  std::set<actors::WorkerId> restarting_;
};

}  // namespace troupe::coordinator
