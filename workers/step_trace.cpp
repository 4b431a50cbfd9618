#include "workers/step_trace.h"

namespace troupe::workers {

void StepTrace::span(uint64_t step, const char* name, const char* category, int64_t start_us,
                     uint32_t thread) {
  if (!tracing(step)) return;
  const int64_t end = now_us();
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, category, start_us, end - start_us, thread, int64_t(step)});
}

void StepTrace::span_of(uint64_t step, const char* name, const char* category, int64_t start_us,
                        double seconds) {
  if (!tracing(step)) return;
  std::lock_guard<std::mutex> lock(mu_);
  events_.push_back({name, category, start_us, int64_t(seconds * 1e6), 0, int64_t(step)});
}

std::vector<actors::TraceEvent> StepTrace::take_if_done(uint64_t next_step, bool run_ended) {
  std::lock_guard<std::mutex> lock(mu_);
  if (taken_ || events_.empty() || (!run_ended && int64_t(next_step) <= last_)) return {};
  taken_ = true;
  return std::move(events_);
}

}  // namespace troupe::workers
