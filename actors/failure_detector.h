// The failure detector's decision, with no clock and no threads: the caller passes `now`.
// A watched node that has not been heard from for longer than failure_timeout is expired.
// Endpoint errors bypass this (the transport reports them at once); this catches hangs:
// a SIGSTOPped process, a livelocked one, a network that drops packets silently.
//
// Thread-safety: none; owned by one actor.
#pragma once

#include <chrono>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace troupe::actors {

class FailureDetector {
 public:
  using Clock = std::chrono::steady_clock;

  explicit FailureDetector(std::chrono::milliseconds failure_timeout) : timeout_(failure_timeout) {}

  // Starts watching node as if heard at now (a new node gets a full timeout of grace).
  void watch(uint64_t node, Clock::time_point now) { last_heard_[node] = now; }
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

 private:
  std::chrono::milliseconds timeout_;
  std::unordered_map<uint64_t, Clock::time_point> last_heard_;
};

}  // namespace troupe::actors
