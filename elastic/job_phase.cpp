#include "elastic/job_phase.h"

namespace troupe::elastic {

const char* phase_name(JobPhase p) {
  switch (p) {
    case JobPhase::forming:
      return "forming";
    case JobPhase::running:
      return "running";
    case JobPhase::changing:
      return "changing";
    case JobPhase::paused:
      return "paused";
    case JobPhase::stopping:
      return "stopping";
    case JobPhase::finished:
      return "finished";
  }
  return "?";
}

const char* outcome_name(JobOutcome o) {
  switch (o) {
    case JobOutcome::none:
      return "none";
    case JobOutcome::completed:
      return "completed";
    case JobOutcome::stopped:
      return "stopped";
    case JobOutcome::failed:
      return "failed";
  }
  return "?";
}

JobLifecycle::JobLifecycle(JobDeadlines deadlines, Clock::time_point now) : deadlines_(deadlines) {
  set_deadline(now + deadlines_.start_timeout);
}

void JobLifecycle::set_deadline(std::optional<Clock::time_point> at) {
  deadline_ = at;
  ++epoch_;
}

bool JobLifecycle::generation_started() {
  if (finished()) return false;
  phase_ = stop_requested_ ? JobPhase::stopping : JobPhase::running;
  resuming_ = false;
  set_deadline(std::nullopt);
  return true;
}

bool JobLifecycle::change_decided(Clock::time_point now) {
  if (!started() || phase_ == JobPhase::changing) return false;
  // A pause that ends with a decided generation is a change too (the workers must form it).
  phase_ = JobPhase::changing;
  set_deadline(now + deadlines_.change_timeout);
  return true;
}

bool JobLifecycle::pause(Clock::time_point now) {
  if (!started() || phase_ == JobPhase::paused) return false;
  const bool fresh = !resuming_;
  if (fresh) paused_since_ = now;
  resuming_ = true;
  phase_ = JobPhase::paused;
  set_deadline(paused_since_ + deadlines_.rejoin_timeout);
  return fresh;
}

bool JobLifecycle::request_stop() {
  if (finished() || stop_requested_) return false;
  stop_requested_ = true;
  if (phase_ == JobPhase::running) phase_ = JobPhase::stopping;
  return true;
}

bool JobLifecycle::finish(JobOutcome outcome) {
  if (finished()) return false;
  phase_ = JobPhase::finished;
  outcome_ = outcome;
  set_deadline(std::nullopt);
  return true;
}

bool JobLifecycle::expired(uint64_t epoch, Clock::time_point now) const {
  return epoch == epoch_ && deadline_ && now >= *deadline_;
}

}  // namespace troupe::elastic
