// A worker's trace of the steps in observability.trace_steps: spans (name, category, start,
// length, thread) in unix microseconds, kept in memory while the steps run and taken once the
// last of them is done (or the run ends), for the coordinator's trace.json (Chrome trace format,
// viewable in Perfetto). Outside the range nothing is recorded: begin() returns a span that
// does nothing, so the cost when tracing is off is one comparison.
//
// Thread-safety: span() from the worker's thread and its reducer thread; the rest from the
// worker's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "actors/job_protocol.h"

namespace troupe::workers {

class StepTrace {
 public:
  StepTrace(int64_t first, int64_t last) : first_(first), last_(last) {}

  bool tracing(uint64_t step) const {
    return first_ >= 0 && int64_t(step) >= first_ && int64_t(step) <= last_;
  }
  static int64_t now_us() {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  // A span of `step` from start_us to now (recorded only when the step is traced).
  void span(uint64_t step, const char* name, const char* category, int64_t start_us,
            uint32_t thread = 0);
  // One of `seconds` starting at start_us (a part measured inside the models).
  void span_of(uint64_t step, const char* name, const char* category, int64_t start_us,
               double seconds);
  // What was recorded, once: after the last traced step, or at the run's end (empty if none).
  std::vector<actors::TraceEvent> take_if_done(uint64_t next_step, bool run_ended);

 private:
  int64_t first_, last_;
  std::mutex mu_;
  std::vector<actors::TraceEvent> events_;
  bool taken_ = false;
};

}  // namespace troupe::workers
