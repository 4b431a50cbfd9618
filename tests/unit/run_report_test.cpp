// coordinator::read_run / render_report on a run directory written by hand: what the events say
// (losses, eval, membership, the change's recovery time) and a half-written last line skipped.
#include "coordinator/run_report.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

struct Dir {
  std::string path;
  Dir() {
    std::string t = (fs::temp_directory_path() / "troupe-report-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += what.size()) ++n;
  return n;
}

TEST(RunReport, EventsAndMetricsBecomeSeriesMarksAndRecoveryTimes) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":"job_started","job":"r","steps":10})"
         "\n"
      << R"({"ts":100.5,"event":"generation_started","generation":1,"world_size":2})"
         "\n"
      << R"({"ts":101,"event":"step_committed","step":0,"loss":3.0,"generation":1})"
         "\n"
      << R"({"ts":102,"event":"step_committed","step":1,"loss":2.5,"generation":1})"
         "\n"
      << R"({"ts":102.5,"event":"evaluated","step":1,"loss":2.75})"
         "\n"
      << R"({"ts":103,"event":"member_failed","member":1,"name":"agent-1","reason":"lost"})"
         "\n"
      << R"({"ts":103.5,"event":"generation_started","generation":2,"world_size":1})"
         "\n"
      << R"({"ts":104.25,"event":"step_committed","step":2,"loss":2.0,"generation":2})"
         "\n"
      << R"({"ts":105,"event":"checkpoint_written","step":3,"path":"m"})"
         "\n"
      << R"({"ts":105.5,"event":"step_comm)";  // a running job's half-written line
  std::ofstream(d.path + "/metrics.jsonl")
      << R"({"ts":101,"step":0,"step_seconds":0.5,"idle_fraction":0.25,"samples_per_s":64,)"
      << R"("worker_step_seconds":[0.5,0.4],"worker_compute_seconds":[0.3,null]})"
         "\n";
  RunReport r = read_run(d.path);
  EXPECT_EQ(r.job, "r");
  EXPECT_EQ(r.state, "running");
  EXPECT_EQ(r.steps, 3u);
  ASSERT_EQ(r.loss.size(), 3u);
  EXPECT_EQ(r.loss[2].y, 2.0);
  ASSERT_EQ(r.eval_loss.size(), 1u);
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_DOUBLE_EQ(r.changes[0].recovery_s, 1.25);  // 103 -> 104.25
  // (from the last commit before the failure: its detection included)
  EXPECT_DOUBLE_EQ(r.changes[0].without_commit_s, 2.25);  // 102 -> 104.25
  ASSERT_EQ(r.marks.size(), 2u);
  EXPECT_EQ(r.marks[0].kind, "failure");
  EXPECT_EQ(r.marks[1].kind, "checkpoint");
  ASSERT_EQ(r.worker_compute_ms.size(), 2u);
  EXPECT_EQ(r.worker_compute_ms[1].size(), 0u);  // (null: not reported)

  const std::string html = render_report(r);
  EXPECT_EQ(count(html, "<svg class=\"plot\""), 6u);
  EXPECT_NE(html.find(">eval</text>"), std::string::npos);
  EXPECT_NE(html.find("class=\"mark failure\""), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
}

// A run stopped and resumed in the same directory: the resumed run's agents joining is its
// start, not a change that never recovered (its generations count from 1 again).
TEST(RunReport, AResumedRunsFirstJoinsAreNotAChange) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":"job_started","job":"r","steps":10})"
         "\n"
      << R"({"ts":100.5,"event":"generation_started","generation":1,"world_size":2})"
         "\n"
      << R"({"ts":101,"event":"member_failed","member":1,"name":"agent-1","reason":"lost"})"
         "\n"
      << R"({"ts":101.5,"event":"step_committed","step":0,"loss":3.0,"generation":1})"
         "\n"
      << R"({"ts":102,"event":"member_failed","member":1,"name":"agent-1","reason":"lost"})"
         "\n"
      << R"({"ts":102.5,"event":"generation_started","generation":2,"world_size":1})"
         "\n"
      << R"({"ts":103,"event":"step_committed","step":1,"loss":2.5,"generation":2})"
         "\n"
      << R"({"ts":104,"event":"job_finished","state":"stopped"})"
         "\n"
      << R"({"ts":200,"event":"job_started","job":"r","steps":10})"
         "\n"
      << R"({"ts":200.5,"event":"member_joined","member":0,"name":"agent-0"})"
         "\n"
      << R"({"ts":201,"event":"generation_started","generation":1,"world_size":1})"
         "\n"
      << R"({"ts":201.5,"event":"step_committed","step":2,"loss":2.0,"generation":1})"
         "\n";
  RunReport r = read_run(d.path);
  EXPECT_EQ(r.state, "running");
  EXPECT_EQ(r.steps, 3u);
  ASSERT_EQ(r.changes.size(), 1u);  // (the first failure came before any step: no change)
  EXPECT_DOUBLE_EQ(r.changes[0].recovery_s, 1.0);  // 102 -> 103
  EXPECT_EQ(render_report(r).find("not yet"), std::string::npos);
  // (the 96 s without a coordinator, 104 -> 200, are not the job's: it said 101.5 s)
  EXPECT_DOUBLE_EQ(r.between_runs_s, 96.0);
  EXPECT_NE(render_report(r).find("3 of 10 steps in 5.5 s (and 96 s between its runs)"),
            std::string::npos)
      << render_report(r);
}

// A join above elastic.max_workers (a standby) is no change: the drain that admits it is, with
// its own recovery. (The join was a change "recovered" when the drain's generation committed,
// 7.9 s, and the drain had no row.)
TEST(RunReport, AStandbysJoinIsNoChange) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":"job_started","job":"s","steps":10})"
         "\n"
      << R"({"ts":100.5,"event":"generation_started","generation":1,"world_size":2})"
         "\n"
      << R"({"ts":101,"event":"step_committed","step":0,"loss":3.0,"generation":1})"
         "\n"
      << R"({"ts":102,"event":"member_joined","member":2,"name":"sb"})"
         "\n"
      << R"({"ts":102,"event":"member_standby","member":2,"name":"sb","reason":"above"})"
         "\n"
      << R"({"ts":103,"event":"step_committed","step":1,"loss":2.9,"generation":1})"
         "\n"
      << R"({"ts":109,"event":"drain_requested","member":1,"step":2})"
         "\n"
      << R"({"ts":109.1,"event":"generation_started","generation":2,"world_size":2})"
         "\n"
      << R"({"ts":109.25,"event":"step_committed","step":2,"loss":2.8,"generation":2})"
         "\n";
  RunReport r = read_run(d.path);
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_EQ(r.changes[0].what.rfind("drain_requested", 0), 0u) << r.changes[0].what;
  EXPECT_DOUBLE_EQ(r.changes[0].recovery_s, 0.25);  // 109 -> 109.25
}

// A coordinator that took the run over is a change (its loss, then the agents adopted: the
// recovery to the next commit) and a mark, though it committed nothing yet.
TEST(RunReport, ATakeOverIsAChangeAndAMark) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":"job_started","job":"t","steps":10})"
         "\n"
      << R"({"ts":100.5,"event":"generation_started","generation":1,"world_size":2})"
         "\n"
      << R"({"ts":101,"event":"step_committed","step":0,"loss":3.0,"generation":1})"
         "\n"
      << R"({"ts":110,"event":"job_started","job":"t","steps":10})"
         "\n"
      << R"({"ts":110,"event":"coordinator_restarted","generation":1,"step":1})"
         "\n"
      << R"({"ts":111,"event":"generation_started","generation":2,"world_size":2})"
         "\n"
      << R"({"ts":112,"event":"step_committed","step":1,"loss":2.5,"generation":2})"
         "\n";
  RunReport r = read_run(d.path);
  ASSERT_EQ(r.changes.size(), 1u);
  EXPECT_NE(r.changes[0].what.find("coordinator_restarted"), std::string::npos);
  EXPECT_DOUBLE_EQ(r.changes[0].recovery_s, 2.0);  // 110 -> 112
  // (without a commit from the lost coordinator's last: its downtime included)
  EXPECT_DOUBLE_EQ(r.changes[0].without_commit_s, 11.0);  // 101 -> 112
  ASSERT_EQ(r.marks.size(), 1u);
  EXPECT_EQ(r.marks[0].kind, "resume");
}

TEST(RunReport, AFailedRunSaysWhy) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":"job_started","job":"r","steps":10})"
         "\n"
      << R"({"ts":101,"event":"job_failed","reason":"worker agent-0/0 failed: data <damaged>","step":0})"
         "\n";
  RunReport r = read_run(d.path);
  EXPECT_EQ(r.state, "failed");
  const std::string html = render_report(r);
  EXPECT_NE(html.find("Why it failed: worker agent-0/0 failed: data &lt;damaged&gt;"),
            std::string::npos)
      << html;
}

TEST(RunReport, ADirectoryWithoutEventsIsRefusedNamingTheFile) {
  Dir d;
  try {
    read_run(d.path);
    FAIL() << "read a directory without events.jsonl";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(d.path + "/events.jsonl"), std::string::npos) << e.what();
  }
}

// Fields of other types than the job writes (a file edited or damaged): the line's other fields
// are read, the field is taken as absent, no exception and nothing undefined (steps past 2^64).
TEST(RunReport, FieldsOfTheWrongTypeAreTakenAsAbsent) {
  Dir d;
  std::ofstream(d.path + "/events.jsonl")
      << R"({"ts":100,"event":7,"job":[],"steps":1e300})"
         "\n"
      << R"({"ts":"x","event":"job_started","job":{},"steps":-5})"
         "\n"
      << R"({"ts":101,"event":"step_committed","step":1e300,"generation":"one","loss":"low"})"
         "\n"
      << R"({"ts":102,"event":"step_committed","step":3,"generation":1,"loss":2.5})"
         "\n"
      << R"({"ts":103,"event":"job_finished","state":false})"
         "\n";
  std::ofstream(d.path + "/metrics.jsonl")
      << R"({"step":"2","step_seconds":0.1,"samples_per_s":"fast","worker_step_seconds":[0.1,"x"]})"
         "\n";
  RunReport r;
  ASSERT_NO_THROW(r = read_run(d.path));
  EXPECT_EQ(r.state, "completed");
  EXPECT_NO_THROW(render_report(r));
  // A line with 200,000 ranks' step times (600 KB): the first kMostRanksDrawn drawn, said so.
  std::string many = R"({"step":3,"step_seconds":0.1,"worker_step_seconds":[0)";
  for (int i = 1; i < 200000; ++i) many += ",0";
  std::ofstream(d.path + "/metrics.jsonl") << many << "]}\n";
  r = read_run(d.path);
  EXPECT_EQ(r.worker_step_ms.size(), kMostRanksDrawn);
  const std::string page = render_report(r);
  EXPECT_LT(page.size(), size_t(1) << 20);
  EXPECT_NE(page.find("the first 1024 ranks"), std::string::npos);
}

}  // namespace
}  // namespace troupe::coordinator
