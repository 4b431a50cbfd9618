// OTP's restart intensity, with no clock: at most max_restarts restarts within any window;
// one more means the failure escalates to the parent. The caller passes `now`.
//
// Thread-safety: none; owned by one supervisor.
#pragma once

#include <chrono>
#include <deque>

namespace troupe::actors {

class RestartIntensity {
 public:
  using Clock = std::chrono::steady_clock;

  RestartIntensity(int max_restarts, std::chrono::milliseconds window)
      : max_restarts_(max_restarts), window_(window) {}

  // Records a failure at now. True: restart the child. False: the intensity is exceeded,
  // escalate (the failure is not recorded as a restart).
  bool allow_restart(Clock::time_point now) {
    while (!restarts_.empty() && now - restarts_.front() > window_) restarts_.pop_front();
    if (static_cast<int>(restarts_.size()) >= max_restarts_) return false;
    restarts_.push_back(now);
    return true;
  }

  int recent_restarts() const { return static_cast<int>(restarts_.size()); }

 private:
  int max_restarts_;
  std::chrono::milliseconds window_;
  std::deque<Clock::time_point> restarts_;
};

}  // namespace troupe::actors
