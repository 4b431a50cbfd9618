// What a coordinator that takes over a run reads from its events.jsonl (coordinator/run_record.h):
// the generation reached and its size, the steps committed after rollbacks and resumes, the
// learning rates, and whether the run ended; lines cut short by a crash are passed over.
#include "coordinator/run_record.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "coordinator/events.h"

namespace troupe::coordinator {
namespace {

// A run directory whose events.jsonl ends in a line cut short (its coordinator killed mid-write):
// the next run log (a resume) cuts it off and its first event is a line of its own.
TEST(RunRecord, AResumedRunLogCutsOffThePartialLineItFinds) {
  const std::string dir = ::testing::TempDir() + "run-log-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/events.jsonl")
      << "{\"ts\":1,\"event\":\"job_started\"}\n{\"ts\":2,\"event\":\"step_comm";
  std::ofstream(dir + "/metrics.jsonl") << "{\"step\":1";  // (no whole line at all)
  {
    RunLog log(dir, false);
    log.event("job_resumed", Json().integer("step", 1));
  }
  std::stringstream events, metrics;
  events << std::ifstream(dir + "/events.jsonl").rdbuf();
  metrics << std::ifstream(dir + "/metrics.jsonl").rdbuf();
  EXPECT_EQ(events.str().find("step_comm"), std::string::npos) << events.str();
  EXPECT_EQ(events.str().rfind("{\"ts\":1,\"event\":\"job_started\"}\n{\"ts\":", 0), 0u)
      << events.str();
  EXPECT_NE(events.str().find("\"event\":\"job_resumed\""), std::string::npos);
  EXPECT_EQ(metrics.str(), "");
  std::filesystem::remove_all(dir);
}

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

// A run stopped, resumed (its generations numbered afresh), and that resume's coordinator lost: the
// run did not end (the first run's job_finished is not the resume's), and its generation is the
// resume's; a take-over of it numbers on, and its own loss before any generation keeps that.
TEST(RunRecord, TheNewestRunOfTheDirectorySaysWhetherItEnded) {
  std::vector<std::string> lines = {
      R"({"event":"job_started"})",
      R"({"event":"generation_started","generation":1,"world_size":2,"step":0})",
      R"({"event":"generation_started","generation":5,"world_size":2,"step":30})",
      R"({"event":"step_committed","step":40})",
      R"({"event":"job_finished","steps":41})",
  };
  EXPECT_TRUE(read_run_record(lines).ended);
  lines.push_back(R"({"event":"job_started"})");
  lines.push_back(R"({"event":"resumed_from_checkpoint","step":41,"checkpoint":"c"})");
  RunRecord r = read_run_record(lines);
  EXPECT_FALSE(r.ended);
  EXPECT_EQ(r.generation, 0u);
  lines.push_back(R"({"event":"generation_started","generation":1,"world_size":2,"step":41})");
  lines.push_back(R"({"event":"step_committed","step":45})");
  r = read_run_record(lines);
  EXPECT_FALSE(r.ended);
  EXPECT_EQ(r.generation, 1u);
  EXPECT_EQ(r.world_size, 2u);
  EXPECT_EQ(r.committed, 46u);
  lines.push_back(R"({"event":"job_started"})");
  lines.push_back(R"({"event":"coordinator_restarted","generation":1,"step":46,"checkpoint":""})");
  r = read_run_record(lines);
  EXPECT_FALSE(r.ended);
  EXPECT_EQ(r.generation, 1u);
  EXPECT_EQ(r.world_size, 2u);
  lines.push_back(R"({"event":"job_finished","steps":50})");
  EXPECT_TRUE(read_run_record(lines).ended);
}

// The learning rates by step as the coordinator scheduled them: a change at 100 kept through a
// rollback to 50 (the redo meets it again), replaced by one asked for at 70.
TEST(RunRecord, ALearningRateAskedForReplacesTheChangesAfterItsStep) {
  std::vector<std::string> lines = {
      R"({"event":"lr_changed","lr":0.01,"step":100,"generation":2})",
      R"({"event":"steps_rolled_back","from":50,"to":110,"generation":3})",
  };
  EXPECT_EQ(read_run_record(lines).lr_from, (std::map<uint64_t, double>{{100, 0.01}}));
  lines.push_back(R"({"event":"lr_changed","lr":0.02,"step":70,"generation":4})");
  EXPECT_EQ(read_run_record(lines).lr_from, (std::map<uint64_t, double>{{70, 0.02}}));
}

// The agents a take-over may wait for: every member_joined of the directory's runs, once (an
// adopted agent joins again under its pid); one of an older Troupe names no host identity.
TEST(RunRecord, EveryAgentThatJoinedIsRecordedOnce) {
  const std::vector<std::string> lines = {
      R"({"event":"job_started"})",
      R"({"event":"member_joined","member":0,"pid":101,"host_identity":"h/b/1"})",
      R"({"event":"member_joined","member":1,"pid":102})",
      R"({"event":"job_started"})",
      R"({"event":"member_joined","member":0,"pid":101,"host_identity":"h/b/1"})",
      R"({"event":"member_joined","member":1,"pid":"103","host_identity":"h/b/1"})",
  };
  const auto agents = read_run_record(lines).agents;
  EXPECT_EQ(agents, (std::vector<AgentProcess>{{"h/b/1", 101}, {"", 102}}));
  // A run that ended shut its agents down: a later run's take-over waits for none of them.
  const std::vector<std::string> ended = {
      R"({"event":"member_joined","member":0,"pid":101,"host_identity":"h/b/1"})",
      R"({"event":"job_finished","steps":10})",
      R"({"event":"job_started"})",
      R"({"event":"member_joined","member":0,"pid":104,"host_identity":"h/b/1"})",
  };
  EXPECT_EQ(read_run_record(ended).agents, (std::vector<AgentProcess>{{"h/b/1", 104}}));
}

// The wait ends when each agent is back or gone; only a process of this host can be seen gone.
TEST(RunRecord, ATakeOverWaitsOnlyForAgentsThatMayComeBack) {
  const std::string here = "h/b/1";
  const std::vector<AgentProcess> run = {{here, 101}, {here, 102}};
  auto gone = [](std::set<uint32_t> dead) {
    return [dead](uint32_t pid) { return dead.count(pid) > 0; };
  };
  EXPECT_TRUE(may_come_back(run, {}, here, gone({101})));
  EXPECT_FALSE(may_come_back(run, {}, here, gone({101, 102})));
  EXPECT_FALSE(may_come_back(run, {{here, 102}}, here, gone({101})));
  EXPECT_FALSE(may_come_back({}, {}, here, gone({})));
  // Another host's pid, or one of an agent that did not say its host, says nothing here.
  EXPECT_TRUE(may_come_back({{"other/b/1", 101}}, {}, here, gone({101})));
  EXPECT_TRUE(may_come_back({{"", 101}}, {}, here, gone({101})));
  EXPECT_FALSE(may_come_back({{"", 101}}, {{"", 101}}, here, gone({})));
  // An identity without its boot id or pid namespace (unreadable there) tells no host apart.
  for (const std::string partial : {"h//1", "h/b/0", "h/b/", "h"})
    EXPECT_TRUE(may_come_back({{partial, 101}}, {}, partial, gone({101}))) << partial;
}

}  // namespace
}  // namespace troupe::coordinator
