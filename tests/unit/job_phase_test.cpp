// The job's phases without processes or clocks: every transition, the stop that waits for the
// next generation, and the deadlines (a timer of an earlier phase is stale).
#include "elastic/job_phase.h"

#include <gtest/gtest.h>

namespace troupe::elastic {
namespace {

using namespace std::chrono_literals;
using Clock = JobLifecycle::Clock;

const JobDeadlines kDeadlines{100ms, 50ms, 30ms};

TEST(JobPhase, AJobFormsRunsAndCompletes) {
  const Clock::time_point t0{};
  JobLifecycle job(kDeadlines, t0);
  EXPECT_EQ(job.phase(), JobPhase::forming);
  EXPECT_FALSE(job.started());
  EXPECT_EQ(job.deadline(), t0 + 100ms);
  EXPECT_TRUE(job.generation_started());
  EXPECT_EQ(job.phase(), JobPhase::running);
  EXPECT_TRUE(job.started());
  EXPECT_FALSE(job.deadline().has_value());
  EXPECT_TRUE(job.finish(JobOutcome::completed));
  EXPECT_EQ(job.phase(), JobPhase::finished);
  EXPECT_EQ(job.outcome(), JobOutcome::completed);
  EXPECT_STREQ(outcome_name(job.outcome()), "completed");
}

TEST(JobPhase, FormingCannotChangeMembershipOrPause) {
  JobLifecycle job(kDeadlines, {});
  EXPECT_FALSE(job.change_decided({}));
  EXPECT_FALSE(job.pause({}));
  EXPECT_EQ(job.phase(), JobPhase::forming);
}

TEST(JobPhase, FormingPastTheStartTimeoutExpires) {
  const Clock::time_point t0{};
  JobLifecycle job(kDeadlines, t0);
  const uint64_t e = job.epoch();
  EXPECT_FALSE(job.expired(e, t0 + 99ms));
  EXPECT_TRUE(job.expired(e, t0 + 100ms));
  job.generation_started();
  EXPECT_FALSE(job.expired(e, t0 + 200ms)) << "the forming timer is stale once running";
}

TEST(JobPhase, AChangeHasADeadlineAndEndsWithTheNextGeneration) {
  const Clock::time_point t0{};
  JobLifecycle job(kDeadlines, t0);
  job.generation_started();
  EXPECT_TRUE(job.change_decided(t0 + 10ms));
  EXPECT_EQ(job.phase(), JobPhase::changing);
  const uint64_t e = job.epoch();
  // A second decision during the change keeps the first deadline.
  EXPECT_FALSE(job.change_decided(t0 + 40ms));
  EXPECT_EQ(job.epoch(), e);
  EXPECT_TRUE(job.expired(e, t0 + 60ms));
  job.generation_started();
  EXPECT_EQ(job.phase(), JobPhase::running);
  EXPECT_FALSE(job.expired(e, t0 + 60ms));
}

TEST(JobPhase, ABrokenGenerationReformsFromRunning) {
  JobLifecycle job(kDeadlines, {});
  job.generation_started();
  EXPECT_TRUE(job.generation_started());
  EXPECT_EQ(job.phase(), JobPhase::running);
}

TEST(JobPhase, APauseKeepsItsSinceAndDeadlineUntilWorkersReturn) {
  const Clock::time_point t0{};
  JobLifecycle job(kDeadlines, t0);
  job.generation_started();
  EXPECT_TRUE(job.pause(t0 + 5ms));
  EXPECT_EQ(job.phase(), JobPhase::paused);
  EXPECT_FALSE(job.pause(t0 + 20ms));  // already paused: the first moment counts
  EXPECT_EQ(job.paused_since(), t0 + 5ms);
  EXPECT_EQ(job.deadline(), t0 + 35ms);
  // Workers come back: the change to the next generation has a deadline of its own.
  EXPECT_TRUE(job.change_decided(t0 + 25ms));
  EXPECT_EQ(job.phase(), JobPhase::changing);
  EXPECT_EQ(job.deadline(), t0 + 75ms);
  job.generation_started();
  EXPECT_EQ(job.phase(), JobPhase::running);
}

TEST(JobPhase, AChangeCanPauseWhenTooFewAreLeft) {
  JobLifecycle job(kDeadlines, {});
  job.generation_started();
  job.change_decided({});
  EXPECT_TRUE(job.pause({}));
  EXPECT_EQ(job.phase(), JobPhase::paused);
}

TEST(JobPhase, AChangeOutOfAPauseThatFallsShortAgainKeepsThePausesClock) {
  const Clock::time_point t0{};
  JobLifecycle job(kDeadlines, t0);
  job.generation_started();
  EXPECT_FALSE(job.resuming());
  EXPECT_TRUE(job.pause(t0 + 5ms));
  EXPECT_TRUE(job.resuming());
  job.change_decided(t0 + 10ms);  // a worker came back ...
  EXPECT_TRUE(job.resuming());
  EXPECT_FALSE(job.pause(t0 + 20ms)) << "... and was lost again: not a new pause";
  EXPECT_EQ(job.phase(), JobPhase::paused);
  EXPECT_EQ(job.paused_since(), t0 + 5ms);
  EXPECT_EQ(job.deadline(), t0 + 35ms);
  job.change_decided(t0 + 25ms);
  job.generation_started();
  EXPECT_FALSE(job.resuming());
}

TEST(JobPhase, AStopRequestedDuringAChangeStopsTheNextGeneration) {
  JobLifecycle job(kDeadlines, {});
  job.generation_started();
  job.change_decided({});
  EXPECT_TRUE(job.request_stop());
  EXPECT_EQ(job.phase(), JobPhase::changing);
  EXPECT_FALSE(job.request_stop());  // once
  job.generation_started();
  EXPECT_EQ(job.phase(), JobPhase::stopping);
  // Stopping still follows membership changes.
  EXPECT_TRUE(job.change_decided({}));
  job.generation_started();
  EXPECT_EQ(job.phase(), JobPhase::stopping);
  job.finish(JobOutcome::stopped);
  EXPECT_EQ(job.outcome(), JobOutcome::stopped);
}

TEST(JobPhase, AStopWhileFormingWaitsForTheFirstGeneration) {
  JobLifecycle job(kDeadlines, {});
  EXPECT_TRUE(job.request_stop());
  EXPECT_EQ(job.phase(), JobPhase::forming);
  job.generation_started();
  EXPECT_EQ(job.phase(), JobPhase::stopping);
}

TEST(JobPhase, FinishedTakesNothingMore) {
  JobLifecycle job(kDeadlines, {});
  EXPECT_TRUE(job.finish(JobOutcome::failed));
  EXPECT_FALSE(job.finish(JobOutcome::completed));
  EXPECT_EQ(job.outcome(), JobOutcome::failed);
  EXPECT_FALSE(job.generation_started());
  EXPECT_FALSE(job.change_decided({}));
  EXPECT_FALSE(job.pause({}));
  EXPECT_FALSE(job.request_stop());
  EXPECT_FALSE(job.started());
  EXPECT_FALSE(job.deadline().has_value());
  EXPECT_STREQ(phase_name(job.phase()), "finished");
}

}  // namespace
}  // namespace troupe::elastic
