// A model and a data set Troupe does not ship (examples/custom_model: a convolutional network on
// images of stripes), in the program a user builds against the installed package
// (tests/install/build_examples.sh), trained by that program as a user runs it: every elastic
// feature works on it unchanged. A SIGKILL and a join, troupe scale into a pipelined layout and a
// kill there, a SIGTERM and a resume at another size: the same bits as a static run
// (parallel.deterministic), the ledger exactly once, identical parameters on every member. Its
// checkpoints export with the blocks' names, and an agent of another program is refused at its
// join, naming the kind it lacks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "models/safetensors.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// The example's own keys (model.channels, data.size, ...) set for a step of ~20 ms.
const char* kConvnet = R"([job]
name = "convnet-test"
seed = 5
steps = 240
[model]
kind = "convnet"
channels = 16
depth = 2
[data]
kind = "stripes"
size = 24
samples = 3000
noise = 1.5
ledger = true
[batch]
global = 24
micro = 8
[optimizer]
kind = "adamw"
lr = 0.005
[parallel]
deterministic = true
[elastic]
failure_timeout_ms = 4000
max_restarts = 0
[logging]
progress = false
)";
constexpr int kSteps = 240;
constexpr long kBatch = 24;

// The job's exit status, or -1 when it did not end within the timeout.
int exit_status(Job& job, std::chrono::seconds timeout = 180s) {
  auto st = job.proc->wait(timeout);
  return st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
}

struct Reference {
  std::vector<double> losses;
  std::string checksum;
};

Reference run_static(const TempDir& dir) {
  Job job = start_job(dir, "static", kConvnet, 1);
  EXPECT_EQ(exit_status(job), 0) << text_of(job.out);
  return {committed_losses(job.run_dir), final_checksum(job)};
}

TEST(CustomModel, AKillAndAJoinOnTheUsersModelAndDataChangeNoBit) {
  TempDir dir;
  const Reference want = run_static(dir);
  ASSERT_EQ(want.losses.size(), size_t(kSteps));
  EXPECT_LT(want.losses.back(), 0.8 * want.losses.front()) << "the model does not learn";
  Job job = start_job(dir, "elastic", kConvnet, 2);
  wait_steps(job, 30);
  auto pids = member_pids(dir, job);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 30s), "");
  auto joiner = join_agent(dir, job, "joiner");
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "3"), 60s), "")
      << "the joiner never took part";
  expect_same_function(job, want.losses, kSteps, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
  auto st = joiner->wait(30s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0);
}

TEST(CustomModel, ScaledIntoPipelineStagesAndAKillThereChangeNoBit) {
  TempDir dir;
  const Reference want = run_static(dir);
  // (Paced: unpaced, the job could end before the scale's agents had started on a loaded host,
  // and the wait for four workers ran out.)
  Job job = start_job(dir, "pipelined", kConvnet, 2, {"parallel.pipeline_stages=2"}, {pace(20000)});
  wait_steps(job, 20);
  admin(dir, {"scale", "--run-dir", job.run_dir, "--workers", "4"});
  const std::string four = wait_event(
      job,
      [](const std::string& e) {
        return is("generation_started")(e) && json_field(e, "world_size") == "4";
      },
      60s);
  ASSERT_NE(four, "") << "never scaled to 4 (dp 2 x pp 2)";
  const uint64_t at = std::stoull(json_field(four, "generation"));
  auto pids = member_pids(dir, job);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(::kill(pids[3], SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", std::to_string(at + 1)), 30s),
            "");
  expect_same_function(job, want.losses, kSteps, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
  EXPECT_EQ(count_events(job, "member_failed"), 1);
}

// The header of a safetensors file: the tensors' names and shapes.
std::map<std::string, std::vector<size_t>> tensors_in(const std::string& path) {
  std::map<std::string, std::vector<size_t>> out;
  for (const auto& t : models::safetensors::read(path).tensors) out[t.name] = t.shape;
  return out;
}

TEST(CustomModel, PreemptedResumedAtAnotherSizeAndExported) {
  TempDir dir;
  const Reference want = run_static(dir);
  Job job = start_job(dir, "preempted", kConvnet, 2, {"checkpoint.every_steps=50"});
  wait_steps(job, 60);
  ASSERT_EQ(job.proc->signal(SIGTERM), true);
  ASSERT_EQ(exit_status(job, 60s), 0) << text_of(job.out);
  ASSERT_NE(text_of(job.out).find("resumable"), std::string::npos) << text_of(job.out);
  Job resumed = start_job(dir, "preempted", kConvnet, 1, {}, {}, {"--resume", job.run_dir});
  expect_same_function(resumed, want.losses, kSteps, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);

  const std::string file = dir.path() + "/convnet.safetensors";
  admin(dir, {"export", job.run_dir, "-o", file});
  const auto tensors = tensors_in(file);
  EXPECT_EQ(tensors.at("blocks.0.weight"), (std::vector<size_t>{16, 3, 3, 1}));
  EXPECT_EQ(tensors.at("blocks.1.weight"), (std::vector<size_t>{16, 3, 3, 16}));
  EXPECT_EQ(tensors.at("blocks.3.weight"), (std::vector<size_t>{4, 16}));  // the head
  EXPECT_EQ(tensors.size(), 8u);
}

TEST(CustomModel, AnAgentOfAnotherProgramIsRefusedAtItsJoin) {
  TempDir dir;
  // The program lists its kinds and their keys.
  const std::string kinds = admin(dir, {"kinds"});
  EXPECT_NE(kinds.find("model.channels (integer, default 8, in [1, 1024])"), std::string::npos)
      << kinds;
  EXPECT_NE(kinds.find("data.kind = \"stripes\""), std::string::npos) << kinds;
  Job job = start_job(dir, "external", kConvnet, 1, {"cluster.launcher=\"external\""});
  std::string addr;
  for (int i = 0; i < 500 && addr.empty(); ++i) {
    std::ifstream(job.run_dir + "/coordinator.addr") >> addr;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_FALSE(addr.empty());
  const std::string log = dir.path() + "/plain.out";
  coordinator::ChildProcess plain(
      {{TROUPE_RELEASE_BINARY, "agent", "--join", addr, "--token-file", job.run_dir + "/job.token"},
       log,
       log,
       {}});
  auto st = plain.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  EXPECT_NE(text_of(log).find("model.kind = \"convnet\" is not a kind this program has"),
            std::string::npos)
      << text_of(log);
  // The coordinator refused it at its join and said so (it joined, and its failure failed the
  // job): the job waits on for an agent of its own program, which trains it to the end.
  EXPECT_NE(wait_event(job, is("agent_refused"), 10s).find("is not a kind this program has"),
            std::string::npos);
  EXPECT_EQ(count_events(job, "member_joined"), 0);
  auto own = join_agent(dir, job, "own");
  auto end = job.proc->wait(120s);
  ASSERT_TRUE(end) << "the job did not finish";
  EXPECT_EQ(WEXITSTATUS(*end), 0) << text_of(job.out);
  EXPECT_EQ(count_events(job, "member_failed"), 0);
  EXPECT_NE(text_of(job.out).find("refused agent '"), std::string::npos) << text_of(job.out);
  // (troupe run says how agents join, with the program's own command: troupe agent cannot train
  // its kinds)
  EXPECT_NE(text_of(job.out).find(
                "agents join with: " + std::filesystem::canonical(TROUPE_BINARY).string() +
                " agent --join " + addr),
            std::string::npos)
      << text_of(job.out);
}

}  // namespace
}  // namespace troupe
