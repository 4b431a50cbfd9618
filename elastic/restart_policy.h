// When the local launcher restarts an agent process that ended, as a pure function: an agent
// that exits 0 is done (drained, or the job finished); one that failed (non-zero, or killed by a
// signal) is restarted after a backoff that doubles from first_backoff up to max_backoff, at most
// max_restarts times per slot (elastic.max_restarts); past that the slot gives up.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::elastic {

struct RestartPolicy {
  int64_t max_restarts = 3;
  std::chrono::milliseconds first_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
};

struct RestartDecision {
  enum class Kind : uint8_t { done, restart, give_up } kind = Kind::done;
  std::chrono::milliseconds backoff{0};  // for restart: wait this long first
  std::string reason;                    // for give_up
};

// restarts: how many times this slot was restarted already. clean_exit: the process exited 0.
RestartDecision decide_restart(const RestartPolicy& policy, int64_t restarts, bool clean_exit);

}  // namespace troupe::elastic
