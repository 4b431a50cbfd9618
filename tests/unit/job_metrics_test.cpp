// coordinator::JobMetrics: run-log lines folded into Prometheus gauges and counters.
#include "coordinator/job_metrics.h"

#include <gtest/gtest.h>

namespace troupe::coordinator {
namespace {

using json = nlohmann::ordered_json;

bool has(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(JobMetrics, StepsChangesAndCheckpointsBecomeGaugesAndCounters) {
  JobMetrics m("my \"job\"");
  m.record({{"ts", 100.0}, {"event", "job_started"}, {"steps", 50}});
  m.record({{"ts", 100.5}, {"event", "member_joined"}, {"member", 0}});
  m.record({{"ts", 100.6}, {"event", "generation_started"}, {"generation", 1}, {"world_size", 2}});
  m.record({{"ts", 101.0},
            {"event", "step_committed"},
            {"step", 0},
            {"loss", 2.5},
            {"generation", 1},
            {"world_size", 2}});
  m.record({{"ts", 101.0},
            {"step", 0},
            {"step_seconds", 0.25},
            {"idle_fraction", 0.1},
            {"samples_per_s", 96.0},
            {"tokens_per_s", 1536.0},
            {"epoch", 0.75},
            {"worker_step_seconds", {0.25, 0.2}},
            {"worker_compute_seconds", {0.2, nullptr}}});
  // A failure at 102, the next generation's first commit at 104.5: recovery 2.5 s.
  m.record({{"ts", 102.0}, {"event", "member_failed"}, {"member", 1}});
  m.record({{"ts", 102.1}, {"event", "worker_failed"}, {"restarting", true}});
  m.record({{"ts", 103.0}, {"event", "generation_started"}, {"generation", 2}, {"world_size", 1}});
  m.record({{"ts", 104.5},
            {"event", "step_committed"},
            {"step", 1},
            {"loss", 2.25},
            {"generation", 2},
            {"world_size", 1}});
  m.record({{"ts", 105.0},
            {"event", "checkpoint_written"},
            {"step", 2},
            {"blocking_seconds", 0.01},
            {"write_seconds", 0.5}});
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_eval_loss NaN"));  // (none yet)
  m.record({{"ts", 105.5}, {"event", "evaluated"}, {"step", 2}, {"loss", 1.75}, {"tokens", 64}});
  m.set_members(1, 1);
  m.set_frames(40, {{"malformed", 3}, {"stale", 1}});
  const std::string t = "\n" + m.exposition();

  EXPECT_TRUE(has(t, "troupe_job_info{name=\"my \\\"job\\\"\"} 1")) << t;
  EXPECT_TRUE(has(t, "troupe_step 2")) << t;
  EXPECT_TRUE(has(t, "troupe_steps 50")) << t;
  EXPECT_TRUE(has(t, "troupe_loss 2.25")) << t;
  EXPECT_TRUE(has(t, "troupe_epoch 0.75")) << t;
  EXPECT_TRUE(has(t, "troupe_last_commit_time_seconds 104.5")) << t;
  EXPECT_TRUE(has(t, "troupe_tokens_per_second 1536")) << t;
  EXPECT_TRUE(has(t, "troupe_worker_step_seconds{rank=\"1\"} 0.2")) << t;
  EXPECT_TRUE(has(t, "troupe_worker_compute_seconds{rank=\"1\"} NaN")) << t;
  EXPECT_TRUE(has(t, "troupe_world_size 1")) << t;
  EXPECT_TRUE(has(t, "troupe_generation 2")) << t;
  EXPECT_TRUE(has(t, "troupe_members{state=\"standby\"} 1")) << t;
  EXPECT_TRUE(has(t, "troupe_recovery_seconds 2.5")) << t;
  EXPECT_TRUE(has(t, "troupe_failures_total 2")) << t;
  EXPECT_TRUE(has(t, "troupe_restarts_total 1")) << t;
  EXPECT_TRUE(has(t, "troupe_joins_total 1")) << t;
  EXPECT_TRUE(has(t, "troupe_checkpoints_total 1")) << t;
  EXPECT_TRUE(has(t, "troupe_checkpoint_write_seconds 0.5")) << t;
  EXPECT_TRUE(has(t, "troupe_eval_loss 1.75")) << t;
  EXPECT_TRUE(has(t, "troupe_eval_step 2")) << t;
  EXPECT_TRUE(has(t, "troupe_control_frames_rejected_total{reason=\"malformed\"} 3")) << t;
  EXPECT_TRUE(has(t, "# TYPE troupe_failures_total counter")) << t;
  EXPECT_TRUE(has(t, "# TYPE troupe_loss gauge")) << t;
}

// Joins before the first commit are the job forming, not a change to recover from.
TEST(JobMetrics, TheFirstMembersAreNotARecovery) {
  JobMetrics m("j");
  // (no loss before the first commit: NaN, as eval_loss's; it was 0)
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_loss NaN")) << m.exposition();
  m.record({{"ts", 1.0}, {"event", "member_joined"}});
  m.record({{"ts", 9.0}, {"event", "step_committed"}, {"step", 0}, {"generation", 1}});
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_recovery_seconds 0"));
}

// A standby's join is no change: the recovery is the drain's (it was measured from the join).
TEST(JobMetrics, AStandbysJoinIsNoRecovery) {
  JobMetrics m("j");
  m.record({{"ts", 1.0}, {"event", "step_committed"}, {"step", 0}, {"generation", 1}});
  m.record({{"ts", 2.0}, {"event", "member_joined"}, {"member", 2}});
  m.record({{"ts", 2.0}, {"event", "member_standby"}, {"member", 2}});
  m.record({{"ts", 9.0}, {"event", "drain_requested"}, {"member", 1}});
  m.record({{"ts", 9.5}, {"event", "step_committed"}, {"step", 1}, {"generation", 2}});
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_recovery_seconds 0.5")) << m.exposition();
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_recovery_without_commit_seconds 8.5"))
      << m.exposition();
}

// Two standbys' joins change nothing; a failure between a join and its standby word is the
// change (its row was dropped with the join's, and the join's time stayed the start).
TEST(ChangeWatch, StandbysJoinsAreTakenBackAndTheNextSignIsTheChange) {
  ChangeWatch w;
  w.sign(0.5, "member_failed");  // (before any commit: the job forming)
  EXPECT_EQ(w.pending(), nullptr);
  EXPECT_FALSE(w.commit(1, 1));
  w.sign(2, "member_joined", 2);
  w.sign(3, "member_joined", 3);
  w.standby(2);
  w.standby(3);
  EXPECT_EQ(w.pending(), nullptr);
  EXPECT_FALSE(w.commit(4, 1));
  w.sign(5, "member_joined", 4);
  w.sign(6, "member_failed");
  w.standby(4);
  ASSERT_NE(w.pending(), nullptr);
  EXPECT_EQ(w.pending()->what, "member_failed");
  w.sign(7, "drain_requested");  // (a later sign of the same change)
  EXPECT_FALSE(w.commit(8, 1)) << "the old generation's commit ends nothing";
  const auto ended = w.commit(9.5, 2);
  ASSERT_TRUE(ended);
  EXPECT_EQ(ended->sign.what, "member_failed");
  EXPECT_DOUBLE_EQ(ended->seconds, 3.5);
  // (without a commit from the old generation's last, at 8)
  EXPECT_DOUBLE_EQ(ended->without_commit_seconds, 1.5);
  // A join that is no standby's is the change.
  w.sign(10, "member_joined", 5);
  ASSERT_TRUE(w.commit(11, 3));
  // Past the bound of joins awaiting their word, a failure is still the change's sign.
  for (int m = 0; m < 100; ++m) w.sign(12, "member_joined", 10 + m);
  w.sign(13, "member_failed");
  for (int m = 0; m < 100; ++m) w.standby(10 + m);
  ASSERT_NE(w.pending(), nullptr);
  EXPECT_EQ(w.pending()->what, "member_failed");
}

// A take-over is a change though this coordinator committed nothing yet (the lost one did), as
// in the report: its recovery was not measured here.
TEST(JobMetrics, ATakeOverIsARecovery) {
  JobMetrics m("j");
  m.record({{"ts", 1.0}, {"event", "coordinator_restarted"}});
  m.record({{"ts", 1.5}, {"event", "member_joined"}, {"member", 0}});
  m.record({{"ts", 3.0}, {"event", "step_committed"}, {"step", 7}, {"generation", 5}});
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_recovery_seconds 2")) << m.exposition();
  // (the lost coordinator's last commit is not this one's to know: from the take-over)
  EXPECT_TRUE(has("\n" + m.exposition(), "troupe_recovery_without_commit_seconds 2"))
      << m.exposition();
}

}  // namespace
}  // namespace troupe::coordinator
