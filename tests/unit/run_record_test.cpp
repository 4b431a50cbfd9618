// What a coordinator that takes over a run reads from its events.jsonl (coordinator/run_record.h):
// the generation reached and its size, the steps committed after rollbacks and resumes, the
// learning rates, and whether the run ended; lines cut short by a crash are passed over.
#include "coordinator/run_record.h"

#include <gtest/gtest.h>

namespace troupe::coordinator {
namespace {

TEST(RunRecord, ALostCoordinatorsRunSaysWhereItGot) {
  const std::vector<std::string> lines = {
      R"({"ts":1,"event":"job_started","job":"x","steps":100,"workers":2})",
      R"({"ts":2,"event":"generation_started","generation":1,"world_size":2,"step":0})",
      R"({"ts":3,"event":"step_committed","step":0,"loss":4.1})",
      R"({"ts":4,"event":"step_committed","step":1,"loss":4.0})",
      R"({"ts":5,"event":"lr_changed","lr":0.0005,"step":2,"generation":2})",
      R"({"ts":6,"event":"generation_started","generation":2,"world_size":3,"step":2})",
      R"({"ts":7,"event":"step_committed","step":2,"loss":3.9})",
      R"({"ts":8,"event":"step_comm)",  // (cut short by the crash)
  };
  const RunRecord r = read_run_record(lines);
  EXPECT_TRUE(r.started);
  EXPECT_FALSE(r.ended);
  EXPECT_EQ(r.generation, 2u);
  EXPECT_EQ(r.world_size, 3u);
  EXPECT_EQ(r.committed, 3u);
  ASSERT_EQ(r.lr_from.size(), 1u);
  EXPECT_EQ(r.lr_from.at(2), 0.0005);
}

TEST(RunRecord, RollbacksAndResumesSetTheCommittedStepsBack) {
  std::vector<std::string> lines = {
      R"({"event":"job_started"})",
      R"({"event":"step_committed","step":9})",
      R"({"event":"steps_rolled_back","from":5,"to":10,"generation":3})",
      R"({"event":"step_committed","step":5})",
  };
  EXPECT_EQ(read_run_record(lines).committed, 6u);
  // A resume from a checkpoint at 4 (the run had got to 10 before): 4 and on are redone.
  lines.push_back(R"({"event":"resumed_from_checkpoint","step":4,"checkpoint":"c"})");
  EXPECT_EQ(read_run_record(lines).committed, 4u);
  lines.push_back(R"({"event":"job_finished","steps":20})");
  EXPECT_TRUE(read_run_record(lines).ended);
}

}  // namespace
}  // namespace troupe::coordinator
