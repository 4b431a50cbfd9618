// The device plane (workers/device_plane.h) with real processes and real signals, on the
// stand-in device (TROUPE_TEST_GUARDED_DEVICE: the model's memory is not the host's to read)
// with its stand-in for NCCL (TROUPE_TEST_GUARDED_PLANE: each worker on a "GPU" of its own, its
// gradients summed in place in device memory): the worker's side of NCCL in the training path
// (the choice, the fences before an overlapped reduction, the plane re-formed every generation)
// runs without a GPU. NCCL itself needs one: tests/gpu/.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cmath>

#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;

// A shape and batch no other test uses.
const char* kGpt = R"([job]
name = "device-plane"
seed = 23
steps = 40
[model]
kind = "gpt"
layers = 2
d_model = 40
heads = 5
context = 20
[data]
kind = "text"
path = "/usr/share/common-licenses/GPL-3"
ledger = true
[batch]
global = 18
micro = 9
[optimizer]
kind = "adamw"
lr = 0.003
[parallel]
overlap_reduce = true
[logging]
progress = false
)";
constexpr int kSteps = 40;
constexpr long kBatch = 18;
const std::string kGuarded = "TROUPE_TEST_GUARDED_DEVICE=1";
const std::string kOwnGpus = "TROUPE_TEST_GUARDED_PLANE=1";

struct Reference {
  std::vector<double> losses;
  std::string checksum;
};

Reference run_static(const TempDir& dir, const std::string& name, std::vector<std::string> sets,
                     std::vector<std::string> env) {
  Job job = start_job(dir, name, kGpt, 2, sets, env);
  EXPECT_TRUE(job.proc->wait(120s)) << name << " did not finish";
  EXPECT_EQ(json_field(events_of(job).back(), "identical_parameters"), "true") << name;
  return {committed_losses(job.run_dir), final_checksum(job)};
}

std::string log_of(const TempDir& dir, const std::string& name) {
  return text_of(dir.path() + "/" + name + "/agent-0.log");
}
bool logged(const TempDir& dir, const std::string& name, const std::string& what) {
  return log_of(dir, name).find(what) != std::string::npos;
}
// The first generation's data plane as the run's events say (rank 0's report; "" none).
std::string plane_of(const TempDir& dir, const std::string& name) {
  for (const std::string& e : lines_of(dir.path() + "/" + name + "/events.jsonl"))
    if (json_field(e, "event") == "data_plane" && json_field(e, "generation") == "1")
      return json_field(e, "plane");
  return "";
}

// Summed in place over the device plane (overlapped with the backward pass, each block's
// reduction after its fence) or host-staged: the same sums of the same numbers, the same bits.
TEST(DevicePlane, GradientsSummedInDeviceMemoryAreTheHostStagedBits) {
  TempDir dir;
  Reference cpu = run_static(dir, "cpu", {}, {});
  ASSERT_EQ(cpu.losses.size(), size_t(kSteps));

  const std::string traced = "observability.trace_steps=\"3-4\"";
  Reference plane = run_static(dir, "plane", {traced}, {kGuarded, kOwnGpus});
  EXPECT_EQ(plane.losses, cpu.losses);
  EXPECT_EQ(plane.checksum, cpu.checksum);
  EXPECT_TRUE(
      logged(dir, "plane", "data plane: NCCL: every member on a GPU of its own (a test's stand-in"))
      << log_of(dir, "plane");
  EXPECT_EQ(plane_of(dir, "plane").rfind("NCCL: every member on a GPU of its own", 0), 0u)
      << plane_of(dir, "plane");
  // Every gradient went over it: the trace's reductions are the device plane's.
  const std::string trace = text_of(dir.path() + "/plane/trace.json");
  EXPECT_NE(trace.find("\"allreduce (device plane)\""), std::string::npos) << trace;
  EXPECT_EQ(trace.find("\"allreduce\""), std::string::npos) << trace;

  Reference serial =
      run_static(dir, "plane-serial", {"parallel.overlap_reduce=false"}, {kGuarded, kOwnGpus});
  EXPECT_EQ(serial.losses, cpu.losses);
  EXPECT_EQ(serial.checksum, cpu.checksum);

  // Workers that share one device: host-staged, saying why.
  Reference shared = run_static(dir, "shared", {traced}, {kGuarded});
  EXPECT_EQ(shared.losses, cpu.losses);
  EXPECT_TRUE(
      logged(dir, "shared", "data plane: host-staged over UCX: ranks 0 and 1 share one GPU"))
      << log_of(dir, "shared");
  EXPECT_NE(plane_of(dir, "shared").find("ranks 0 and 1 share one GPU"), std::string::npos);
  EXPECT_NE(text_of(dir.path() + "/shared/trace.json").find("\"allreduce\""), std::string::npos);

  // parallel.backend = "ucx" keeps everyone host-staged.
  Reference ucx = run_static(dir, "ucx", {"parallel.backend=\"ucx\""}, {kGuarded, kOwnGpus});
  EXPECT_EQ(ucx.losses, cpu.losses);
  EXPECT_TRUE(logged(dir, "ucx", "data plane: parallel.backend = \"ucx\""));
  EXPECT_NE(plane_of(dir, "ucx").find("parallel.backend"), std::string::npos);
  EXPECT_EQ(plane_of(dir, "cpu").find("NCCL"), std::string::npos) << "CPU workers: host-staged";
}

// parallel.reduce_dtype = "bf16": each gradient bucket summed in bf16 (half the bytes), host-staged
// or over the device plane alike (the same rounding, the same order: the same bits); the loss
// curve within 2% of the f32 sums' and not theirs (the key acts).
TEST(DevicePlane, GradientsSummedInBf16StayWithinTwoPercentOnEitherPlane) {
  TempDir dir;
  const std::string bf16 = "parallel.reduce_dtype=\"bf16\"";
  Reference f32 = run_static(dir, "f32", {}, {});
  Reference host = run_static(dir, "bf16-host", {bf16}, {});
  Reference plane = run_static(dir, "bf16-plane", {bf16}, {kGuarded, kOwnGpus});
  ASSERT_EQ(host.losses.size(), f32.losses.size());
  EXPECT_EQ(plane.losses, host.losses);
  EXPECT_EQ(plane.checksum, host.checksum);
  EXPECT_NE(host.losses, f32.losses);
  double ema_a = f32.losses[0], ema_b = host.losses[0], worst = 0;
  for (size_t s = 1; s < f32.losses.size(); ++s) {
    ema_a = 0.9 * ema_a + 0.1 * f32.losses[s];
    ema_b = 0.9 * ema_b + 0.1 * host.losses[s];
    worst = std::max(worst, std::abs(ema_b - ema_a) / ema_a);
  }
  EXPECT_LT(worst, 0.02);
}

// A member SIGKILLed mid-run and a joiner: the generation's plane goes with it and the next
// generation of two forms a new one, over which the joiner receives the state; the job computes the
// static run's function (SGD: rounding differences of the 1-member steps do not grow) with every
// sample once.
TEST(DevicePlane, AfterAKillAndAJoinTheNextGenerationFormsItsOwnPlane) {
  TempDir dir;
  // (80 steps of 80 ms: the lone survivor must not finish before the joiner, which takes
  // seconds to start under a sanitizer.)
  constexpr int steps = 80;
  const std::vector<std::string> sgd{"optimizer.kind=\"sgd\"", "optimizer.lr=0.1", "job.steps=80"};
  Reference want = run_static(dir, "static", sgd, {});
  std::vector<std::string> sets = sgd;
  sets.insert(sets.end(), {"elastic.failure_timeout_ms=4000", "elastic.max_restarts=0"});
  Job job = start_job(dir, "elastic", kGpt, 2, sets, {kGuarded, kOwnGpus, pace(80000)});
  wait_steps(job, 8);
  const auto pids = joined_pids(job);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  // The survivor is told to give up generation 1's device collectives (NCCL's may never end).
  EXPECT_NE(wait_event(job, is("generation_abandoned", "generation", "1"), 30s), "");
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 30s), "");
  auto joiner = join_agent(dir, job, "joiner", {kGuarded, kOwnGpus, pace(80000)});
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "3"), 60s), "")
      << "the joiner never took part";
  expect_same_function(job, want.losses, steps, kBatch, 1e-4);
  EXPECT_TRUE(joiner->wait(30s));
  // Generations 1 and 3 each form a plane on both their members; 2 has one member, no plane.
  const std::string logs = text_of(job.run_dir + "/agent-0.log") +
                           text_of(job.run_dir + "/agent-1.log") +
                           text_of(dir.path() + "/joiner.out");
  size_t planes = 0;
  for (size_t at = 0; (at = logs.find("data plane: NCCL", at)) != std::string::npos; ++at) ++planes;
  EXPECT_EQ(planes, 4u) << logs;
  // The joiner's state came over the plane, device to device.
  EXPECT_NE(text_of(dir.path() + "/joiner.out").find("over the device plane"), std::string::npos)
      << text_of(dir.path() + "/joiner.out");
}

// A planned change (here troupe lr, twice: the same members) while a member waits on a straggler
// in the device plane's gradient sum, longer than the 200 ms after which NCCL's waits are given
// up once a generation is abandoned: nobody is gone, so the wait goes on and the step commits.
// (The plane's stand-in waits on its operations as NcclCommunicator does.)
TEST(DevicePlane, APlannedChangeLetsAMemberWaitingOnAStragglerFinishItsStep) {
  TempDir dir;
  Job job = start_job(
      dir, "planned", kGpt, 2, {"job.steps=100000"},
      {kGuarded, kOwnGpus, "TROUPE_TEST_SLOW_AGENT=agent-1", "TROUPE_TEST_SLOW_STEP_US=600000"});
  wait_steps(job, 3);
  for (const char* gen : {"2", "3"}) {
    admin(dir, {"lr", "--run-dir", job.run_dir, "0.002"});
    const std::string started = wait_event(job, is("generation_started", "generation", gen), 60s);
    ASSERT_NE(started, "");
    wait_steps(job, std::stoul(json_field(started, "step")) + 3);  // the straggler's steps too
  }
  admin(dir, {"stop", "--run-dir", job.run_dir});  // stopped, not ended by a step count: no race
  const auto rc = job.proc->wait(120s);
  ASSERT_TRUE(rc) << "the job did not finish";
  EXPECT_EQ(*rc, 0);
  EXPECT_EQ(count_events(job, "generation_abandoned"), 0);
  EXPECT_EQ(count_events(job, "worker_failed"), 0);
  const std::string logs =
      text_of(job.run_dir + "/agent-0.log") + text_of(job.run_dir + "/agent-1.log");
  EXPECT_EQ(logs.find("given up"), std::string::npos) << logs;
  EXPECT_EQ(count_events(job, "generation_started"), 3);
}

// A pipeline on the device plane (dp 2 x pp 2: four workers, each on a "GPU" of its own): the
// activations and gradients between the stages go device to device, the replicas' gradients are
// summed in place in their group of the plane; the same bits as the same pipeline on the CPU.
TEST(DevicePlane, APipelinesActivationsAndReplicaSumsGoOverIt) {
  TempDir dir;
  const std::vector<std::string> pp{"parallel.pipeline_stages=2", "model.tied_head=false",
                                    "parallel.overlap_reduce=false", "job.steps=20"};
  auto run = [&](const std::string& name, std::vector<std::string> env) {
    Job job = start_job(dir, name, kGpt, 4, pp, env);
    EXPECT_TRUE(job.proc->wait(180s)) << name << " did not finish";
    EXPECT_EQ(json_field(events_of(job).back(), "identical_parameters"), "true") << name;
    return Reference{committed_losses(job.run_dir), final_checksum(job)};
  };
  Reference cpu = run("pp-cpu", {});
  ASSERT_EQ(cpu.losses.size(), 20u);
  Reference plane = run("pp-plane", {kGuarded, kOwnGpus});
  EXPECT_EQ(plane.losses, cpu.losses);
  EXPECT_EQ(plane.checksum, cpu.checksum);
  EXPECT_EQ(plane_of(dir, "pp-plane").rfind("NCCL: every member on a GPU of its own", 0), 0u)
      << plane_of(dir, "pp-plane");
  std::string logs;
  for (int a = 0; a < 4; ++a)
    logs += text_of(dir.path() + "/pp-plane/agent-" + std::to_string(a) + ".log");
  size_t stages = 0;
  const std::string said = "activations and gradients, the replicas' sums over the device plane";
  for (size_t at = 0; (at = logs.find(said, at)) != std::string::npos; ++at) ++stages;
  EXPECT_EQ(stages, 4u) << logs;
}

// A stage's worker SIGKILLed in a dp 2 x pp 2 pipeline on the plane: the next generation (one
// pipeline and a standby) forms its own plane, the lost stage's blocks come from its replica
// device to device, and the job computes the static run's function.
TEST(DevicePlane, APipelineStageKilledOnItIsRecoveredFromItsReplica) {
  TempDir dir;
  constexpr int steps = 60;
  const std::vector<std::string> sets{
      "parallel.pipeline_stages=2", "model.tied_head=false", "parallel.overlap_reduce=false",
      "optimizer.kind=\"sgd\"",     "optimizer.lr=0.1",      "job.steps=60"};
  Job ref = start_job(dir, "static", kGpt, 4, sets);
  ASSERT_TRUE(ref.proc->wait(180s));
  const std::vector<double> want = committed_losses(ref.run_dir);
  ASSERT_EQ(want.size(), size_t(steps));
  std::vector<std::string> more = sets;
  more.insert(more.end(), {"elastic.failure_timeout_ms=4000", "elastic.max_restarts=0"});
  Job job = start_job(dir, "killed", kGpt, 4, more, {kGuarded, kOwnGpus, pace(60000)});
  wait_steps(job, 8);
  const auto pids = member_pids(dir, job);
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  expect_same_function(job, want, steps, kBatch, 1e-4);
  std::string logs;
  for (int a = 0; a < 4; ++a)
    logs += text_of(dir.path() + "/killed/agent-" + std::to_string(a) + ".log");
  size_t planes = 0;
  for (size_t at = 0; (at = logs.find("data plane: NCCL", at)) != std::string::npos; ++at) ++planes;
  EXPECT_EQ(planes, 7u) << "4 members, then 3" << logs;
  EXPECT_NE(logs.find(" s over the device plane"), std::string::npos)
      << "the lost stage's blocks did not come over the plane: " << logs;
}

}  // namespace
}  // namespace troupe
