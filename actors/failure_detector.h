// The failure detector's decision, with no clock and no threads: the caller passes `now`.
// A watched node that has not been heard from for longer than failure_timeout is expired.
// Endpoint errors bypass this (the transport reports them at once); this catches hangs:
// a SIGSTOPped process, a livelocked one, a network that drops packets silently.
// Silence is counted only while the detector itself runs: a check that comes far later than its
// interval (this very process stopped, a paused VM, a starved scheduler) heard nobody in between
// either, so that gap is not the others' silence (a pause of the whole machine drops no one).
//
// Thread-safety: none; owned by one actor.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <unordered_map>
#include <vector>

namespace troupe::actors {

class FailureDetector {
 public:
  using Clock = std::chrono::steady_clock;

  // interval: how often expire() is called (the heartbeat interval); a gap between two checks
  // longer than the interval plus half the timeout is the detector's own (0: none is).
  explicit FailureDetector(std::chrono::milliseconds failure_timeout,
                           std::chrono::milliseconds interval = std::chrono::milliseconds(0))
      : timeout_(failure_timeout), interval_(interval) {}

  // Starts watching node as if heard at now (a new node gets a full timeout of grace).
  void watch(uint64_t node, Clock::time_point now) {
    last_heard_[node] = now;
    if (!checked_) checked_ = now;  // (the first gap is measured from here)
  }
  // Any sign of life. Ignored for nodes not watched (an expired node stays expired).
  void heard(uint64_t node, Clock::time_point now) {
    auto it = last_heard_.find(node);
    if (it != last_heard_.end() && now > it->second) it->second = now;
  }
  void forget(uint64_t node) { last_heard_.erase(node); }
  bool watching(uint64_t node) const { return last_heard_.count(node) != 0; }

  struct Expired {
    uint64_t node;
    std::chrono::milliseconds silent_for;
  };
  // Nodes silent for longer than the timeout; they are no longer watched afterwards.
  std::vector<Expired> expire(Clock::time_point now) {
    forgive_own_gap(now);
    std::vector<Expired> out;
    for (auto it = last_heard_.begin(); it != last_heard_.end();) {
      auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second);
      if (silent > timeout_) {
        out.push_back({it->first, silent});
        it = last_heard_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  // How long each watched node has been silent (for status displays).
  std::vector<Expired> silences(Clock::time_point now) const {
    std::vector<Expired> out;
    for (const auto& [node, at] : last_heard_)
      out.push_back({node, std::chrono::duration_cast<std::chrono::milliseconds>(now - at)});
    return out;
  }

  std::chrono::milliseconds timeout() const { return timeout_; }
  // Another timeout and interval from now on (the nodes watched stay, with their last-heard times).
  void retime(std::chrono::milliseconds failure_timeout, std::chrono::milliseconds interval) {
    timeout_ = failure_timeout;
    interval_ = interval;
  }

 private:
  // Moves every last-heard time on by the gap since the previous check, less one interval, when
  // the gap is this detector's own (never past now): what was silent before it stays counted,
  // and every check still counts an interval (checks that always come late expire a silent node
  // all the same, later).
  void forgive_own_gap(Clock::time_point now) {
    const std::optional<Clock::time_point> before = checked_;
    checked_ = std::max(checked_.value_or(now), now);
    if (!before || interval_.count() == 0 || now - *before <= interval_ + timeout_ / 2) return;
    const auto forgiven = now - *before - interval_;
    for (auto& [node, at] : last_heard_) at = std::min(now, at + forgiven);
  }

  std::chrono::milliseconds timeout_, interval_;
  std::optional<Clock::time_point> checked_;  // the last check (none yet)
  std::unordered_map<uint64_t, Clock::time_point> last_heard_;
};

}  // namespace troupe::actors
