// A user's own training loop made elastic (examples/own_loop, built against the installed
// package): its own model, optimizer and data, calling troupe::ElasticLoop at step boundaries.
// Real processes of that program join a `model.kind = "external"` job; one is SIGKILLed mid-run,
// another joins and receives the state; the job keeps training to the end, every member ends
// with identical parameters, and the ledger shows every sample of every committed step once.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
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

// A member: the user's program, joining the job (with `flags` of its own, and `env`).
std::unique_ptr<coordinator::ChildProcess> member(const TempDir& dir, const Job& job,
                                                  const std::string& addr, const std::string& name,
                                                  const std::vector<std::string>& flags = {},
                                                  const std::vector<std::string>& env = {}) {
  const std::string log = dir.path() + "/" + name + ".out";
  std::vector<std::string> argv = {OWN_LOOP_BINARY,
                                   "--join",
                                   addr,
                                   "--token-file",
                                   job.run_dir + "/job.token",
                                   "--name",
                                   name,
                                   "--failure-timeout-ms",
                                   "4000"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return std::make_unique<coordinator::ChildProcess>(
      coordinator::ChildProcess::Options{argv, log, log, env});
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
  // (the job's end is not a lost coordinator: no member waits for one to take the run over)
  for (const char* m : {"/a.out", "/c.out"})
    EXPECT_EQ(text_of(dir.path() + m).find("to take the run over"), std::string::npos)
        << text_of(dir.path() + m);
}

// What a member's last line says: "... state H, N sums read in place".
std::pair<std::string, long> state_and_in_place(const std::string& out) {
  const std::string text = text_of(out);
  const size_t at = text.rfind(", state ");
  if (at == std::string::npos) return {"", -1};
  const size_t comma = text.find(", ", at + 8);
  if (comma == std::string::npos) return {"", -1};
  return {text.substr(at + 8, comma - at - 8), std::atol(text.c_str() + comma + 2)};
}

struct LoopRun {
  std::vector<double> losses;
  std::vector<std::string> states;
  std::vector<long> in_place;
};

// Three members of a 2048 wide network (300 KB of gradients: read in place from 256 KiB with
// TROUPE_PEER_LINES=intel, on any CPU), their gradients in the loop's shared memory or in their
// own.
LoopRun train_three(const TempDir& dir, const std::string& name, bool own_memory) {
  const char* config = R"([job]
name = "own-loop-shared"
steps = 24
seed = 23
[model]
kind = "external"
[batch]
global = 48
micro = 16
[optimizer]
lr = 0.002
[logging]
progress = false
)";
  Job job = start_job(dir, name, config, 3);
  const std::string addr = address_of(job);
  EXPECT_FALSE(addr.empty()) << text_of(job.out);
  std::vector<std::string> flags = {"--hidden", "2048"};
  if (own_memory) flags.push_back("--own-memory");
  std::vector<std::unique_ptr<coordinator::ChildProcess>> members;
  for (const char* m : {"a", "b", "c"})
    members.push_back(member(dir, job, addr, name + m, flags, {"TROUPE_PEER_LINES=intel"}));
  auto st = job.proc->wait(120s);
  EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << text_of(job.out);
  LoopRun run{committed_losses(job.run_dir), {}, {}};
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string out = dir.path() + "/" + name + "abc"[i] + ".out";
    EXPECT_EQ(exit_status(*members[i]), 0) << text_of(out);
    auto [state, in_place] = state_and_in_place(out);
    EXPECT_NE(state, "") << text_of(out);
    // (a clean run warns of nothing: the coordinator's exit after the job's end is no loss)
    EXPECT_EQ(text_of(out).find("[warning]"), std::string::npos) << text_of(out);
    // (its data plane waits the job's elastic.failure_timeout_ms, 3 s, as every member's: not
    // the 4 s of its own --failure-timeout-ms, its coordinator's heartbeats)
    EXPECT_NE(text_of(out).find("its data plane waits 3000 ms"), std::string::npos) << text_of(out);
    run.states.push_back(state);
    run.in_place.push_back(in_place);
  }
  return run;
}

// The gradients in the loop's shared memory (ElasticLoop::shared_floats) are summed in place, the
// members reading one another's, with the bits of the sums that copy them (--own-memory): three
// members, so the order of the additions counts; the same losses and the same parameters.
TEST(OwnLoop, GradientsInSharedMemoryAreSummedInPlaceWithTheBitsOfCopiedOnes) {
  TempDir dir;
  const LoopRun shared = train_three(dir, "shared", false);
  const LoopRun own = train_three(dir, "own", true);
  ASSERT_EQ(shared.losses.size(), 24u);
  EXPECT_EQ(shared.losses, own.losses);  // (bitwise: the loss printed to 17 digits)
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(shared.states[i], shared.states[0]) << "members differ";
    EXPECT_EQ(own.states[i], shared.states[0]) << "in place and copied differ";
    EXPECT_GE(shared.in_place[i], 24) << "a member's gradient sums were not read in place";
    EXPECT_EQ(own.in_place[i], 0);
  }
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
  EXPECT_NE(wait_event(mlp, is("agent_refused", "name", "loop"), 10s), "");
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
  // (troupe run says how its members join: not troupe agent's line, which would be refused)
  const std::string said = text_of(external.out);
  EXPECT_NE(said.find("your program's members join it (troupe::ElasticLoop"), std::string::npos)
      << said;
  EXPECT_EQ(said.find("troupe agent --join"), std::string::npos) << said;
  // Refused at its join: the coordinator says so, and waits on for its own members (the agent
  // joined, and its failure failed the job).
  const std::string refused = wait_event(external, is("agent_refused", "name", "agent"), 10s);
  EXPECT_NE(refused.find("troupe agent cannot train it"), std::string::npos) << refused;
  EXPECT_EQ(count_events(external, "member_joined"), 0);
  auto a = member(dir, external, address_of(external), "a");
  wait_steps(external, 20);
  EXPECT_EQ(count_events(external, "member_failed"), 0);
  // Troupe checkpoints none of the loop's state: a checkpoint is refused (it was accepted and
  // never came), so is a stop with one, and a scale names how members are added.
  const std::string run = external.run_dir;
  EXPECT_NE(admin(dir, {"checkpoint", "--run-dir", run}, 2).find("it keeps its own checkpoints"),
            std::string::npos);
  EXPECT_NE(admin(dir, {"stop", "--run-dir", run, "--checkpoint"}, 2)
                .find("troupe stop without --checkpoint stops it"),
            std::string::npos);
  EXPECT_NE(admin(dir, {"scale", "--run-dir", run, "--workers", "2"}, 2)
                .find("another member of your program (troupe::ElasticLoop)"),
            std::string::npos);
  admin(dir, {"stop", "--run-dir", run});
  auto end = external.proc->wait(60s);
  ASSERT_TRUE(end) << "the stop did not end the job";
  EXPECT_EQ(WEXITSTATUS(*end), 0) << text_of(external.out);
  EXPECT_EQ(text_of(external.out).find("it wrote no checkpoint"), std::string::npos)
      << text_of(external.out);
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints"))
      << "an empty checkpoints/ of a loop's run";
  EXPECT_EQ(exit_status(*a), 0) << text_of(dir.path() + "/a.out");
}

}  // namespace
}  // namespace troupe
