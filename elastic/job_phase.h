// The job's life as an explicit state machine, with no clock: the coordinator's actor reports
// what happened and asks what is allowed; the time is passed in. The tests walk every transition.
//
//   forming ──generation_started──▶ running ◀──generation_started── changing
//      │                             │  ▲ (a broken generation re-forms)   ▲
//      │                             │  └──────────┘                       │
//      │                             ├──change_decided─────────────────────┘
//      │                             ├──paused──▶ paused ──generation_started──▶ running
//      │                             └──stop_requested──▶ stopping (a change may still come:
//      │                                                  changing, then stopping again)
//      └──────────── any phase ──finished──▶ finished (completed, stopped or failed)
//
// A stop requested while forming, changing or paused is remembered: the next generation starts
// in `stopping` (the coordinator ends a job still forming, for a stop without a checkpoint, or
// paused without members, 0.5 s after the stop's answer: coordinator/job.cpp,
// stop_before_training). Each phase that waits has a deadline (forming:
// elastic.start_timeout_ms; changing: elastic.change_timeout_ms; paused:
// elastic.rejoin_timeout_ms). The epoch changes whenever a deadline is set, so a timer armed for
// an earlier phase is recognised as stale.
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace troupe::elastic {

enum class JobPhase : uint8_t { forming, running, changing, paused, stopping, finished };
enum class JobOutcome : uint8_t { none, completed, stopped, failed };

const char* phase_name(JobPhase phase);
const char* outcome_name(JobOutcome outcome);

struct JobDeadlines {
  std::chrono::milliseconds start_timeout{120000};  // every worker of the first generation ready
  std::chrono::milliseconds change_timeout{36000};  // a decided change forms its generation
  std::chrono::milliseconds rejoin_timeout{30000};  // a pause ends (then decide_membership fails)
};

class JobLifecycle {
 public:
  using Clock = std::chrono::steady_clock;

  JobLifecycle(JobDeadlines deadlines, Clock::time_point now);

  JobPhase phase() const { return phase_; }
  JobOutcome outcome() const { return outcome_; }
  bool stop_requested() const { return stop_requested_; }
  bool finished() const { return phase_ == JobPhase::finished; }
  // Membership decisions and admin requests (scale, drain) need a first generation.
  bool started() const { return phase_ != JobPhase::forming && !finished(); }
  // Paused since the last generation started: in `paused`, or `changing` out of a pause (a
  // change decided while paused). The pause's start is kept until the next generation starts.
  bool resuming() const { return resuming_; }
  Clock::time_point paused_since() const { return paused_since_; }

  // Transitions. Each returns whether it changed the phase; an event the phase does not take
  // (anything after finished, a generation start twice is fine) changes nothing.
  bool generation_started();
  bool change_decided(Clock::time_point now);  // in changing already: keeps the first deadline
  // Returns true when the job was not paused since the last generation started (a new pause);
  // a change out of a pause that falls below the minimum again pauses with the first pause's
  // start and deadline.
  bool pause(Clock::time_point now);
  bool request_stop();  // false when already requested
  bool finish(JobOutcome outcome);

  // The deadline of the current phase (none in running, stopping, finished) and its epoch.
  std::optional<Clock::time_point> deadline() const { return deadline_; }
  uint64_t epoch() const { return epoch_; }
  // A timer armed at `epoch` fired at `now`: whether the current phase's deadline passed.
  bool expired(uint64_t epoch, Clock::time_point now) const;

 private:
  void set_deadline(std::optional<Clock::time_point> at);

  JobDeadlines deadlines_;
  JobPhase phase_ = JobPhase::forming;
  JobOutcome outcome_ = JobOutcome::none;
  bool stop_requested_ = false;
  bool resuming_ = false;
  Clock::time_point paused_since_{};
  std::optional<Clock::time_point> deadline_;
  uint64_t epoch_ = 0;
};

}  // namespace troupe::elastic
