#include "elastic/restart_policy.h"

#include <algorithm>

namespace troupe::elastic {

RestartDecision decide_restart(const RestartPolicy& p, int64_t restarts, bool clean_exit) {
  RestartDecision d;
  if (clean_exit) return d;
  if (restarts >= p.max_restarts) {
    d.kind = RestartDecision::Kind::give_up;
    d.reason = std::to_string(restarts) + " restart(s) = elastic.max_restarts";
    return d;
  }
  d.kind = RestartDecision::Kind::restart;
  // first, 2 first, 4 first, ... (the shift is bounded so it cannot overflow)
  const int64_t shifted = p.first_backoff.count()
                          << std::min<int64_t>(std::max<int64_t>(0, restarts), 20);
  d.backoff = std::chrono::milliseconds(std::min<int64_t>(p.max_backoff.count(), shifted));
  return d;
}

}  // namespace troupe::elastic
