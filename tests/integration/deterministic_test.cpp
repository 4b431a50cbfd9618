// parallel.deterministic with real processes and real signals: the per-step losses and the final
// parameters are the same bits at 1, 2 and 3 workers, in dp x pp pipelines, across a SIGKILL
// and a join, and across `troupe scale` — on an AdamW GPT whose default-mode runs drift apart
// (checked too, so the equalities cannot hold by accident).
#include <gtest/gtest.h>
#include <signal.h>

#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// A shape and batch no other test uses: 5 global micro-batches of 6 (uneven over 2, 3, 4
// workers), weight decay and clipping on (the clipped norm must be the same bits too).
const char* kGpt = R"([job]
name = "deterministic"
seed = 11
steps = 160
[model]
kind = "gpt"
layers = 2
d_model = 48
heads = 4
context = 24
[data]
kind = "text"
path = "/usr/share/common-licenses/GPL-3"
ledger = true
[batch]
global = 30
micro = 6
[optimizer]
kind = "adamw"
lr = 0.003
weight_decay = 0.05
clip_norm = 0.5
[parallel]
deterministic = true
[logging]
progress = false
)";
constexpr int kSteps = 160;
constexpr long kBatch = 30;

Job start(const TempDir& dir, const std::string& name, int agents,
          std::vector<std::string> sets = {}, std::vector<std::string> env = {}) {
  return start_job(dir, name, kGpt, agents, sets, env);
}

struct Reference {
  std::vector<double> losses;
  std::string checksum;
};

Reference run_static(const TempDir& dir, const std::string& name, int agents,
                     std::vector<std::string> sets = {}, std::vector<std::string> env = {}) {
  Job job = start(dir, name, agents, sets, env);
  EXPECT_TRUE(job.proc->wait(180s)) << name << " did not finish";
  EXPECT_EQ(json_field(events_of(job).back(), "identical_parameters"), "true");
  return {committed_losses(job.run_dir), final_checksum(job)};
}

TEST(Deterministic, OneTwoThreeWorkersAndPipelinesComputeTheSameBits) {
  TempDir dir;
  Reference one = run_static(dir, "one", 1);
  ASSERT_EQ(one.losses.size(), size_t(kSteps));
  ASSERT_FALSE(one.checksum.empty());
  struct Layout {
    const char* name;
    int agents;
    std::vector<std::string> sets;
  };
  const Layout layouts[] = {{"two", 2, {}},
                            {"three", 3, {}},
                            {"pp2", 2, {"parallel.pipeline_stages=2"}},
                            {"dp2xpp2", 4, {"parallel.pipeline_stages=2"}}};
  for (const auto& l : layouts) {
    Reference got = run_static(dir, l.name, l.agents, l.sets);
    ASSERT_EQ(got.losses.size(), one.losses.size()) << l.name;
    for (size_t i = 0; i < got.losses.size(); ++i)
      ASSERT_EQ(got.losses[i], one.losses[i]) << l.name << ": step " << i << " (bitwise)";
    EXPECT_EQ(got.checksum, one.checksum) << l.name;
  }
  // Without the mode the same job at 3 workers sums in another order and drifts: the test
  // above would notice a mode that changed nothing.
  Reference plain = run_static(dir, "plain", 3, {"parallel.deterministic=false"});
  EXPECT_NE(plain.losses, one.losses);
  EXPECT_NE(plain.checksum, one.checksum);
}

TEST(Deterministic, AKillAndAJoinChangeNoBit) {
  TempDir dir;
  Reference want = run_static(dir, "static", 1);
  Job job = start(dir, "elastic", 3, {"elastic.failure_timeout_ms=4000", "elastic.max_restarts=0"},
                  {pace(40000)});
  wait_steps(job, 20);
  auto pids = member_pids(dir, job);
  ASSERT_EQ(pids.size(), 3u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 30s), "");
  auto joiner = join_agent(dir, job, "joiner", {pace(40000)});
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "3"), 60s), "")
      << "the joiner never took part";
  expect_same_function(job, want.losses, kSteps, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
  EXPECT_EQ(count_events(job, "member_failed"), 1);
  // Every generation of several says its data plane, as the default mode's do (none was said).
  const std::string plane = wait_event(job, is("data_plane", "generation", "3"), 1s);
  EXPECT_NE(plane.find("exact sums (parallel.deterministic: fixed-point integers) over "),
            std::string::npos)
      << plane;
  EXPECT_GE(count_events(job, "data_plane"), 3);
  auto jst = joiner->wait(30s);
  ASSERT_TRUE(jst);
  EXPECT_EQ(WEXITSTATUS(*jst), 0);
}

TEST(Deterministic, ScalingWithTroupeScaleChangesNoBit) {
  TempDir dir;
  Reference want = run_static(dir, "static", 1);
  // (Paced at 80 ms a step: under ASan a scaled-up agent takes ~40 steps of 40 ms to start, and
  // the job must still be running when the second scale is asked for.)
  Job job = start(dir, "scale", 2, {}, {pace(80000)});
  wait_steps(job, 20);
  admin(dir, {"scale", "--run-dir", job.run_dir, "--workers", "3"});
  ASSERT_NE(wait_event(job, is("generation_started", "world_size", "3")), "") << "never grew";
  admin(dir, {"scale", "--run-dir", job.run_dir, "--workers", "1"});
  ASSERT_NE(wait_event(job, is("generation_started", "world_size", "1")), "") << "never shrank";
  expect_same_function(job, want.losses, kSteps, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
}

// Workers on a device the host cannot read (TROUPE_TEST_GUARDED_DEVICE: every tensor of the
// model behind PROT_NONE outside its Compute's calls) take every host-staged path a GPU worker
// takes: gradient reduction (exact and plain), state transfer to a joiner after a SIGKILL,
// activations and gradients between pipeline stages, stage backups, checkpoints, checksums. A
// path that read device memory directly would fault; each computes the CPU's bits.
TEST(Deterministic, WorkersOnADeviceTheHostCannotReadComputeTheCpusBits) {
  TempDir dir;
  constexpr int steps = 60;
  const std::vector<std::string> run{"job.steps=60", "checkpoint.every_steps=25"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), run.begin(), run.end());
    return more;
  };
  const std::string guarded = "TROUPE_TEST_GUARDED_DEVICE=1";
  Reference want = run_static(dir, "cpu", 1, run);
  ASSERT_EQ(want.losses.size(), size_t(steps));

  Job job =
      start(dir, "guarded", 2, with({"elastic.failure_timeout_ms=4000", "elastic.max_restarts=0"}),
            {guarded, pace(40000)});
  wait_steps(job, 15);
  const auto pids = joined_pids(job);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 30s), "");
  auto joiner = join_agent(dir, job, "joiner", {guarded, pace(40000)});
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "3"), 60s), "")
      << "the joiner never took part";
  expect_same_function(job, want.losses, steps, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
  EXPECT_NE(text_of(job.run_dir + "/agent-0.log").find("computes on guarded host memory"),
            std::string::npos)
      << "the workers were not on the stand-in device";
  ASSERT_TRUE(joiner->wait(30s));

  Reference pp =
      run_static(dir, "guarded-pp", 2,
                 with({"parallel.pipeline_stages=2", "parallel.stage_backup_steps=10"}), {guarded});
  EXPECT_EQ(pp.losses, want.losses);
  EXPECT_EQ(pp.checksum, want.checksum);

  // The default mode's plain allreduce, against the same job on the CPU.
  Reference plain_cpu = run_static(dir, "plain-cpu", 2, with({"parallel.deterministic=false"}));
  Reference plain =
      run_static(dir, "plain-guarded", 2, with({"parallel.deterministic=false"}), {guarded});
  EXPECT_EQ(plain.losses, plain_cpu.losses);
  EXPECT_EQ(plain.checksum, plain_cpu.checksum);
}

}  // namespace
}  // namespace troupe
