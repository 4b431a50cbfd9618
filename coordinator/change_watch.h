// Recovery from a membership change, as `troupe report` and troupe_recovery_seconds measure it:
// from the change's first sign after a commit (a member failed, joined or left; a drain or a
// scale asked for; a take-over) to the first commit of a newer generation. A join that turns out
// a standby's (above elastic.max_workers) changes nothing: its member_standby takes the sign
// back, and the change begins at the next sign, if any. Also what training lost: the time
// without a commit that ends there, from the commit before it (the old generation's last; a
// failure's detection, e.g. a hang's cut after elastic.failure_timeout_ms, included; across a
// take-over, the lost coordinator's last, where its events are read). Pure: events in, times
// out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::coordinator {

struct ChangeSign {
  double t = 0;
  std::string what;         // the event, described
  double join_member = -1;  // the member whose join it is (-1: not a join)
};

// A change ended by a commit: its first sign; seconds from that sign to the commit, and from the
// commit before (the sign's own time when none is known: a take-over's, from its own events).
struct ChangeEnded {
  ChangeSign sign;
  double seconds = 0, without_commit_seconds = 0;
};

class ChangeWatch {
 public:
  // A sign at t; counted only after a commit unless `always` (a take-over: the lost coordinator
  // committed what this one has not).
  void sign(double t, std::string what, double join_member = -1, bool always = false) {
    if (!always && commits_ == 0) return;
    // (after a sign that no standby takes back, later ones change nothing)
    const bool settled = std::any_of(signs_.begin(), signs_.end(),
                                     [](const ChangeSign& s) { return s.join_member < 0; });
    if (settled || (join_member >= 0 && signs_.size() >= kMostSigns)) return;
    signs_.push_back({t, std::move(what), join_member});
  }
  // A line of events.jsonl at t: a sign of a change, a standby's word, or nothing. `member` its
  // "member" field (-1: none); `what` how a change it begins is described.
  void event(const std::string& name, double t, double member, std::string what) {
    static const char* const kSigns[] = {"member_failed", "worker_failed",   "member_joined",
                                         "member_left",   "drain_requested", "scale_requested"};
    if (name == "member_standby") return standby(member);
    if (name == "coordinator_restarted") return sign(t, std::move(what), -1, /*always=*/true);
    if (std::find(std::begin(kSigns), std::end(kSigns), name) != std::end(kSigns))
      sign(t, std::move(what), name == "member_joined" ? member : -1);
  }
  // That member's join was a standby's: no sign of a change.
  void standby(double member) {
    signs_.erase(std::remove_if(signs_.begin(), signs_.end(),
                                [&](const ChangeSign& s) { return s.join_member == member; }),
                 signs_.end());
  }
  // A commit of generation `generation` at t: the change it ends, if one was pending and the
  // generation is newer.
  std::optional<ChangeEnded> commit(double t, double generation) {
    std::optional<ChangeEnded> ended;
    if (!signs_.empty() && generation > last_generation_) {
      const double since = committed_ever_ ? last_commit_t_ : signs_.front().t;
      ended = ChangeEnded{signs_.front(), t - signs_.front().t, t - since};
      signs_.clear();
    }
    ++commits_;
    committed_ever_ = true;
    last_commit_t_ = t;
    last_generation_ = generation;
    return ended;
  }
  // The pending change's first sign; nullptr when none is pending.
  const ChangeSign* pending() const { return signs_.empty() ? nullptr : &signs_.front(); }
  // A resumed run's start: its generations count from 1 again, its first joins are no change.
  // (The last commit is kept: a take-over's time without one began before it.)
  void restart() {
    const double last = last_commit_t_;
    const bool ever = committed_ever_;
    *this = ChangeWatch();
    last_commit_t_ = last;
    committed_ever_ = ever;
  }

 private:
  static constexpr size_t kMostSigns = 64;  // (joins awaiting their standby word, bounded)
  std::vector<ChangeSign> signs_;
  uint64_t commits_ = 0;
  double last_generation_ = 0;
  double last_commit_t_ = 0;     // the newest commit's time
  bool committed_ever_ = false;  // (before a restart too)
};

}  // namespace troupe::coordinator
