// A user's own training loop made elastic (examples/own_loop, built against the installed
// package): its own model, optimizer and data, calling troupe::ElasticLoop at step boundaries.
// Real processes of that program join a `model.kind = "external"` job; one is SIGKILLed mid-run,
// another joins and receives the state; the job keeps training to the end, every member ends
// with identical parameters, and the ledger shows every sample of every committed step once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <thread>

#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

const char* kLoopJob = R"([job]
name = "own-loop-test"
steps = 2500
seed = 9
[model]
kind = "external"
[data]
ledger = true
[batch]
global = 384
[optimizer]
lr = 0.005
[elastic]
failure_timeout_ms = 4000
[logging]
progress = false
)";
constexpr int kSteps = 2500;
constexpr long kBatch = 384;

std::string address_of(const Job& job) {
  std::string addr;
  for (int i = 0; i < 1000 && addr.empty(); ++i) {
    std::ifstream(job.run_dir + "/coordinator.addr") >> addr;
    if (addr.empty()) std::this_thread::sleep_for(10ms);
  }
  return addr;
}

// A member: the user's program, joining the job.
std::unique_ptr<coordinator::ChildProcess> member(const TempDir& dir, const Job& job,
                                                  const std::string& addr,
                                                  const std::string& name) {
  const std::string log = dir.path() + "/" + name + ".out";
  return std::make_unique<coordinator::ChildProcess>(coordinator::ChildProcess::Options{
      {OWN_LOOP_BINARY, "--join", addr, "--token-file", job.run_dir + "/job.token", "--name", name,
       "--failure-timeout-ms", "4000"},
      log,
      log,
      {}});
}

int exit_status(coordinator::ChildProcess& p) {
  auto st = p.wait(120s);
  return st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
}

TEST(OwnLoop, AUsersLoopSurvivesAKillAndAJoinWithIdenticalParameters) {
  TempDir dir;
  Job job = start_job(dir, "loop", kLoopJob, 2);
  const std::string addr = address_of(job);
  ASSERT_FALSE(addr.empty()) << text_of(job.out);
  auto a = member(dir, job, addr, "a");
  auto b = member(dir, job, addr, "b");
  wait_steps(job, 100);
  ASSERT_GT(b->pid(), 0);
  ASSERT_EQ(::kill(b->pid(), SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 30s), "");
  auto c = member(dir, job, addr, "c");
  const std::string third = wait_event(job, is("generation_started", "generation", "3"), 60s);
  ASSERT_NE(third, "") << "the joiner never took part";
  EXPECT_EQ(json_field(third, "world_size"), "2");
  EXPECT_EQ(json_field(third, "lacking_state"), "1");  // the joiner received the state
  ASSERT_NE(wait_event(job, is("state_received"), 10s), "");
  const auto committed_at_join = committed_losses(job.run_dir).size();
  EXPECT_LT(committed_at_join, size_t(kSteps)) << "the join came after the end: no premise";

  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st) << "the job did not finish";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const auto events = events_of(job);
  EXPECT_EQ(json_field(events.back(), "event"), "job_finished") << events.back();
  EXPECT_EQ(json_field(events.back(), "state"), "completed") << events.back();
  EXPECT_EQ(json_field(events.back(), "identical_parameters"), "true") << events.back();
  check_ledger(job.run_dir, kSteps, kBatch);
  const auto losses = committed_losses(job.run_dir);
  ASSERT_EQ(losses.size(), size_t(kSteps));
  EXPECT_LT(losses.back(), 0.6 * losses.front()) << "the user's loop did not learn";
  EXPECT_EQ(exit_status(*a), 0) << text_of(dir.path() + "/a.out");
  EXPECT_EQ(exit_status(*c), 0) << text_of(dir.path() + "/c.out");
  EXPECT_NE(text_of(dir.path() + "/c.out").find("ended (exit 0"), std::string::npos);
}

TEST(OwnLoop, AJobOfAnotherKindRefusesTheLoopAndTroupeAgentRefusesTheLoopsJob) {
  TempDir dir;
  // A loop joining a job of a built-in model: refused, saying why.
  Job mlp = start_job(dir, "mlp", "[job]\nsteps = 50\n[logging]\nprogress = false\n", 1,
                      {"cluster.launcher=\"external\""});
  auto loop = member(dir, mlp, address_of(mlp), "loop");
  EXPECT_EQ(exit_status(*loop), 2);
  EXPECT_NE(text_of(dir.path() + "/loop.out").find("a loop of its own joins a job of model.kind"),
            std::string::npos)
      << text_of(dir.path() + "/loop.out");
  mlp.proc->signal(SIGTERM);
  mlp.proc->wait(30s);
  // troupe agent joining a job of model.kind = "external": refused at the join.
  Job external = start_job(dir, "external", kLoopJob, 1);
  ASSERT_FALSE(address_of(external).empty());
  auto agent = join_agent(dir, external, "agent");
  auto st = agent->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  EXPECT_NE(text_of(dir.path() + "/agent.out").find("run their own training loop"),
            std::string::npos)
      << text_of(dir.path() + "/agent.out");
  external.proc->signal(SIGTERM);
  external.proc->wait(30s);
}

}  // namespace
}  // namespace troupe
