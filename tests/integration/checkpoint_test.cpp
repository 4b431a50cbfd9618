// Checkpoints with real processes and real signals: a whole job SIGKILLed mid-run resumes from
// its newest checkpoint at another world size; checkpoints reshard between pipeline layouts; bad
// checkpoints (a flipped byte, a missing manifest, a truncated shard, another model's) are
// refused naming the file and the reason, and the newest valid one is used. The job runs in
// parallel.deterministic mode, so "the same function" is checked bitwise: losses and the final
// parameters equal a run that was never interrupted, and the ledger shows every sample of every
// committed step once across the restart.
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/job_protocol.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using namespace testing;

const char* kGpt = R"([job]
name = "checkpoints"
seed = 3
steps = 120
[model]
kind = "gpt"
layers = 2
d_model = 32
heads = 4
context = 16
[data]
kind = "text"
path = "/usr/share/common-licenses/GPL-3"
ledger = true
[batch]
global = 24
micro = 4
[optimizer]
kind = "adamw"
lr = 0.003
[parallel]
deterministic = true
[checkpoint]
every_steps = 20
[logging]
progress = false
)";
constexpr long kBatch = 24;

std::string last_line(const std::string& path) {
  auto lines = lines_of(path);
  return lines.empty() ? "" : lines.back();
}

struct Reference {
  std::vector<double> losses;
  std::string checksum;
};

// The same job, never interrupted, on one worker.
Reference reference(const TempDir& dir, int steps) {
  Job job = start_job(dir, "reference-" + std::to_string(steps), kGpt, 1,
                      {"job.steps=" + std::to_string(steps), "checkpoint.every_steps=0"});
  EXPECT_TRUE(job.proc->wait(120s));
  return {committed_losses(job.run_dir), final_checksum(job)};
}

int resumed_from(const Job& job) {
  for (const auto& e : events_of(job))
    if (json_field(e, "event") == "resumed_from_checkpoint")
      return std::stoi(json_field(e, "step"));
  return -1;
}

TEST(Checkpoints, TheWholeJobKilledResumesFromItsCheckpointAtAnotherSize) {
  TempDir dir;
  Reference want = reference(dir, 120);
  Job job = start_job(dir, "killed", kGpt, 3, {}, {pace(30000)});
  wait_steps(job, 50);
  std::vector<int> pids = joined_pids(job);
  ASSERT_EQ(pids.size(), 3u);
  pids.push_back(job.proc->pid());
  for (int pid : pids) ::kill(pid, SIGKILL);
  ASSERT_TRUE(job.proc->wait(10s));
  ASSERT_TRUE(fs::exists(job.run_dir + "/checkpoints/step-00000040/manifest.json"));

  Job resumed = start_job(dir, "killed", kGpt, 2, {}, {}, {"--resume", job.run_dir});
  expect_same_function(resumed, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);
  EXPECT_GE(resumed_from(resumed), 40);
  // checkpoint.keep (3): the oldest went.
  EXPECT_FALSE(fs::exists(job.run_dir + "/checkpoints/step-00000020"));
  EXPECT_TRUE(fs::exists(job.run_dir + "/checkpoints/step-00000120/manifest.json"));
}

// Every process of a run SIGKILLed: a resume with more steps, under another job.name, is taken
// and trains to them (it was refused as a take-over whose agents "train to the run's own steps",
// or whose job.token "is job 'checkpoints'", though none was alive); fewer steps than the run
// committed are refused.
TEST(Checkpoints, TheWholeJobKilledResumesToAnotherNumberOfSteps) {
  TempDir dir;
  Job job = start_job(dir, "longer", kGpt, 2, {"job.steps=60"}, {pace(30000)});
  wait_steps(job, 45);
  std::vector<int> pids = joined_pids(job);
  ASSERT_EQ(pids.size(), 2u);
  pids.push_back(job.proc->pid());
  for (int pid : pids) ::kill(pid, SIGKILL);
  ASSERT_TRUE(job.proc->wait(10s));
  // status says what a take-over will do: no agent is left to adopt (it said only how to take
  // the run over, and the take-over only that the agents alive go on from their own state).
  const std::string said = admin(dir, {"status", "--run-dir", job.run_dir}, 1);
  EXPECT_NE(said.find("(no agent of it is alive here: it goes on from its checkpoint of step 40, "
                      "steps 40.."),
            std::string::npos)
      << said;
  // Its step is the steps it committed (it was the last event's index: one fewer, or 0).
  const std::string json = admin(dir, {"status", "--run-dir", job.run_dir, "--json"}, 1);
  EXPECT_EQ(json_field(json, "step"), std::to_string(committed_losses(job.run_dir).size())) << json;
  // So does its report (it said "running").
  const std::string report = admin(dir, {"report", job.run_dir, "-o", dir.path() + "/dead.html"});
  EXPECT_NE(report.find("(not running, and it did not finish, "), std::string::npos) << report;

  Job fewer = start_job(dir, "longer", kGpt, 2, {"job.steps=30"}, {}, {"--resume", job.run_dir});
  auto st = fewer.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2) << text_of(fewer.out);
  EXPECT_NE(text_of(fewer.out).find("job.steps = 30, but the run has committed 4"),
            std::string::npos)
      << text_of(fewer.out);
  // (its advice names the checkpoint it may start from, before step 30, not a pattern)
  EXPECT_NE(text_of(fewer.out).find("start a new run from its checkpoint of step 20 (--resume " +
                                    job.run_dir + "/checkpoints/step-00000020)"),
            std::string::npos)
      << text_of(fewer.out);
  // (a checkpoint named as the docs said, step-N: "neither a run directory nor a checkpoint")
  Job unpadded =
      start_job(dir, "longer", kGpt, 2, {}, {}, {"--resume", job.run_dir + "/checkpoints/step-40"});
  st = unpadded.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2) << text_of(unpadded.out);
  EXPECT_NE(text_of(unpadded.out)
                .find("step-40: it does not exist (a checkpoint's directory has 8 digits: " +
                      job.run_dir + "/checkpoints/step-00000040)"),
            std::string::npos)
      << text_of(unpadded.out);
  Job more = start_job(dir, "longer", kGpt, 2, {"job.steps=80", "job.name=\"taken\""}, {},
                       {"--resume", job.run_dir});
  st = more.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(more.out);
  EXPECT_EQ(committed_losses(more.run_dir).size(), 80u);
  EXPECT_EQ(text_of(job.run_dir + "/job.token").rfind("taken ", 0), 0u);
  // The steps the lost coordinator committed past that checkpoint were redone: the event names
  // the checkpoint (it named none, as a stage-backup rollback does), and metrics.jsonl has a
  // second line of each, of a later generation (two lines of one step, nothing to tell them by).
  const std::string back = wait_event(more, is("steps_rolled_back"), 0s);
  ASSERT_NE(back, "");
  const std::string from = json_field(back, "from");
  EXPECT_NE(json_field(back, "checkpoint").find(actors::checkpoint_dir_name(std::stoull(from))),
            std::string::npos)
      << back;
  // And the console says so (it said only that the agents alive go on from their own state).
  EXPECT_NE(text_of(more.out).find("steps " + from + ".." +
                                   std::to_string(std::stoll(json_field(back, "to")) - 1) +
                                   ", committed before the take-over, are trained again, from the "
                                   "checkpoint "),
            std::string::npos)
      << text_of(more.out);
  std::vector<long> generations;
  for (const auto& m : lines_of(job.run_dir + "/metrics.jsonl"))
    if (json_field(m, "step") == from && !json_field(m, "step_seconds").empty())
      generations.push_back(std::stol(json_field(m, "generation")));
  ASSERT_EQ(generations.size(), 2u);
  EXPECT_LT(generations[0], generations[1]);
  EXPECT_TRUE(fs::exists(job.run_dir + "/checkpoints/step-00000080/manifest.json"));
  // A resume of the ended run under another name: its status names the job so (it named it as
  // the first run had).
  Job renamed = start_job(dir, "longer", kGpt, 2, {"job.steps=90", "job.name=\"renamed\""}, {},
                          {"--resume", job.run_dir});
  st = renamed.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(renamed.out);
  const std::string status = admin(dir, {"status", "--run-dir", job.run_dir, "--json"});
  EXPECT_NE(status.find("\"job\":\"renamed\""), std::string::npos) << status;
}

// The preemption pattern: SIGTERM, a checkpoint at the next step boundary (without periodic
// ones too), every process exits 0, the run says it is resumable; the same job again goes on
// from there.
TEST(Checkpoints, SigtermLeavesAResumableRunAndTheResumeGoesOnFromWhereItStopped) {
  TempDir dir;
  Reference want = reference(dir, 120);
  Job job = start_job(dir, "preempted", kGpt, 2, {"checkpoint.every_steps=0"}, {pace(30000)});
  wait_steps(job, 30);
  std::vector<int> agents = joined_pids(job);
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << last_line(job.out);
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "state"), "stopped") << end;
  EXPECT_EQ(json_field(end, "resumable"), "true") << end;
  const int stopped_at = std::stoi(json_field(end, "steps"));
  EXPECT_LT(stopped_at, 120);
  EXPECT_NE(text_of(job.out).find("resumable from"), std::string::npos) << text_of(job.out);
  for (int pid : agents) EXPECT_NE(::kill(pid, 0), 0) << "agent " << pid << " still runs";

  // The path the stop line names (the checkpoint's manifest) resumes as its directory: here the
  // step it is at and job.steps = that step leave nothing to run, refused before anything starts.
  const std::string out = text_of(job.out), from = "resumable from ";
  const size_t at = out.find(from) + from.size();
  const std::string manifest = out.substr(at, out.find(": troupe run", at) - at);
  Job nothing_left =
      start_job(dir, "nothing-left", kGpt, 1, {"job.steps=" + std::to_string(stopped_at)}, {},
                {"--resume", manifest});
  auto refused = nothing_left.proc->wait(30s);
  ASSERT_TRUE(refused);
  EXPECT_EQ(WEXITSTATUS(*refused), 2);
  EXPECT_NE(text_of(nothing_left.out)
                .find("is at step " + std::to_string(stopped_at) + " and job.steps = "),
            std::string::npos)
      << manifest << ": " << text_of(nothing_left.out);

  // (the run's own config.toml garbled: what differs from it cannot be named, and that is said)
  std::ofstream(job.run_dir + "/config.toml", std::ios::app) << "\n[job\n";
  // (steps to trace that ran before the resume's step: said, not silently none)
  Job resumed = start_job(dir, "preempted", kGpt, 3, {"observability.trace_steps=\"2-3\""}, {},
                          {"--resume", job.run_dir});
  expect_same_function(resumed, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);
  EXPECT_EQ(resumed_from(resumed), stopped_at);
  EXPECT_NE(text_of(resumed.out)
                .find("observability.trace_steps = \"2-3\": those steps ran before step " +
                      std::to_string(stopped_at) + ", where this run goes on: none is traced"),
            std::string::npos)
      << text_of(resumed.out);
  EXPECT_FALSE(fs::exists(job.run_dir + "/trace.json"));
  EXPECT_NE(text_of(resumed.out)
                .find("what differs from the run's own config is not named: " + job.run_dir +
                      "/config.toml"),
            std::string::npos)
      << text_of(resumed.out);
}

// The same job apart, on one worker: optimizer.lr 0.003 up to step `at` (a checkpoint there),
// then a resume from it at 0.001 up to `steps`: the losses of a job whose rate changed at `at`.
std::vector<double> losses_apart(const TempDir& dir, int at, int steps) {
  const std::string s = std::to_string(at);
  Job before = start_job(dir, "before", kGpt, 1, {"job.steps=" + s, "checkpoint.every_steps=" + s});
  EXPECT_TRUE(before.proc->wait(180s));
  char step_dir[32];
  std::snprintf(step_dir, sizeof step_dir, "/checkpoints/step-%08d", at);
  Job after =
      start_job(dir, "after", kGpt, 1, {"job.steps=" + std::to_string(steps), "optimizer.lr=0.001"},
                {}, {"--resume", before.run_dir + step_dir});
  EXPECT_TRUE(after.proc->wait(180s));
  std::vector<double> apart = committed_losses(before.run_dir);
  for (double l : committed_losses(after.run_dir)) apart.push_back(l);
  return apart;
}

// `troupe lr` on a running job: from one step on, every member trains with the new learning rate
// (a member killed after the change and restarted by the launcher too), and a resume from a
// checkpoint taken after it goes on with it. Checked bitwise against the same two phases run
// apart: the old rate up to that step, then a resume from there with --set optimizer.lr.
TEST(Checkpoints, ALearningRateChangedWhileRunningActsFromOneStepOnEveryMember) {
  TempDir dir;
  const std::vector<std::string> longer{"job.steps=200"};  // (room for slow admin commands)
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), longer.begin(), longer.end());
    return sets;
  };
  Job job = start_job(dir, "lr", kGpt, 2, with({"checkpoint.keep=20"}), {pace(50000)});
  wait_steps(job, 25);
  admin(dir, {"lr", "--run-dir", job.run_dir, "0.001"});
  const std::string changed = wait_event(job, is("lr_changed"), 60s);
  ASSERT_NE(changed, "");
  EXPECT_EQ(json_field(changed, "lr"), "0.001");
  const int at = std::stoi(json_field(changed, "step"));
  ASSERT_LT(at, 150) << "the change came too late for the rest of the test";
  wait_steps(job, size_t(at) + 5);
  auto pids = member_pids(dir, job);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);  // (the launcher restarts it: it joins, as of now)
  auto st = job.proc->wait(180s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << last_line(job.out);
  const auto losses = committed_losses(job.run_dir);
  ASSERT_EQ(losses.size(), 200u);
  EXPECT_EQ(count_events(job, "member_failed"), 1);

  // The same job apart: the old rate up to `at` (a checkpoint there), then the new one.
  const std::vector<double> apart = losses_apart(dir, at, 200);
  ASSERT_EQ(apart.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) ASSERT_EQ(losses[i], apart[i]) << "step " << i;
  // Without the change the losses after `at` differ: the test would notice a change that did
  // nothing.
  Job plain = start_job(dir, "plain", kGpt, 1, with({"checkpoint.every_steps=0"}));
  ASSERT_TRUE(plain.proc->wait(180s));
  EXPECT_NE(committed_losses(plain.run_dir).back(), losses.back());

  // A resume from a checkpoint after the change (the config still says 0.003) goes on at 0.001.
  const int later = (at / 20 + 1) * 20;
  char step_dir[32];
  std::snprintf(step_dir, sizeof step_dir, "/checkpoints/step-%08d", later);
  Job resumed =
      start_job(dir, "resumed", kGpt, 1, longer, {}, {"--resume", job.run_dir + step_dir});
  ASSERT_TRUE(resumed.proc->wait(180s));
  const auto tail = committed_losses(resumed.run_dir);
  ASSERT_EQ(tail.size(), size_t(200 - later));
  for (size_t i = 0; i < tail.size(); ++i)
    ASSERT_EQ(tail[i], losses[size_t(later) + i]) << "step " << later + int(i);
  // (said; and its config.toml keeps the configured rate, so that a resume of it with the same
  // file is no change of rate)
  EXPECT_NE(text_of(resumed.out)
                .find("optimizer.lr goes on at the checkpoint's 0.001 (the config "
                      "says 0.003: --set optimizer.lr=0.003 trains with that)"),
            std::string::npos)
      << text_of(resumed.out);
  EXPECT_NE(text_of(resumed.run_dir + "/config.toml").find("lr = 0.003"), std::string::npos);
}

// A rollback past a `troupe lr` change (both agents SIGKILLed after it: the state goes back to the
// checkpoint before it) redoes the steps before the change at the old rate and acts at its step
// again: bitwise the same losses as the two phases run apart. (The redo took the new rate from
// the checkpoint's step on.)
TEST(Checkpoints, StepsRedoneAfterALearningRateChangeKeepTheRatesTheyHad) {
  TempDir dir;
  Job job = start_job(dir, "lr-redo", kGpt, 2,
                      {"job.steps=120", "checkpoint.keep=20", "checkpoint.every_steps=50"},
                      {pace(100000)});
  wait_steps(job, 51);
  admin(dir, {"lr", "--run-dir", job.run_dir, "0.001"});
  const std::string changed = wait_event(job, is("lr_changed"), 60s);
  ASSERT_NE(changed, "");
  const int at = std::stoi(json_field(changed, "step"));
  ASSERT_LT(at, 95) << "the change came too late: the rollback would not pass it";
  wait_steps(job, size_t(at) + 2);
  const std::vector<int> pids = joined_pids(job);
  ASSERT_EQ(pids.size(), 2u);
  for (int pid : pids) ASSERT_EQ(::kill(pid, SIGKILL), 0);  // (back to the checkpoint of 50)
  auto st = job.proc->wait(180s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << last_line(job.out);
  const std::string back = wait_event(job, is("steps_rolled_back"), 0s);
  ASSERT_NE(back, "");
  EXPECT_EQ(json_field(back, "from"), "50") << back;
  const auto losses = committed_losses(job.run_dir);
  ASSERT_EQ(losses.size(), 120u);

  const std::vector<double> apart = losses_apart(dir, at, 120);
  ASSERT_EQ(apart.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) ASSERT_EQ(losses[i], apart[i]) << "step " << i;
}

// `troupe run --resume RUN_DIR` from a checkpoint before a `troupe lr` change (the newer ones
// removed) acts at the change's step again: bitwise the two phases run apart. (A resume went on
// at the checkpoint's rate for good.)
TEST(Checkpoints, AResumeFromBeforeALearningRateChangeActsAtItsStepAgain) {
  TempDir dir;
  Job job =
      start_job(dir, "lr-resume", kGpt, 1, {"job.steps=120", "checkpoint.keep=20"}, {pace(100000)});
  wait_steps(job, 21);
  admin(dir, {"lr", "--run-dir", job.run_dir, "0.001"});
  const std::string changed = wait_event(job, is("lr_changed"), 60s);
  ASSERT_NE(changed, "");
  const int at = std::stoi(json_field(changed, "step"));
  wait_steps(job, size_t(at) + 2);
  ASSERT_TRUE(job.proc->signal(SIGTERM));
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0) << last_line(job.out);
  for (const auto& e : fs::directory_iterator(job.run_dir + "/checkpoints"))
    if (e.path().filename().string() > "step-00000020") fs::remove_all(e.path());
  Job resumed = start_job(dir, "lr-resume", kGpt, 1, {"job.steps=120", "checkpoint.keep=20"}, {},
                          {"--resume", job.run_dir});
  auto rst = resumed.proc->wait(180s);
  ASSERT_TRUE(rst);
  ASSERT_EQ(WEXITSTATUS(*rst), 0) << last_line(resumed.out);
  EXPECT_EQ(resumed_from(resumed), 20);
  const auto losses = committed_losses(resumed.run_dir);
  ASSERT_EQ(losses.size(), 120u);

  const std::vector<double> apart = losses_apart(dir, at, 120);
  ASSERT_EQ(apart.size(), losses.size());
  for (size_t i = 0; i < losses.size(); ++i) ASSERT_EQ(losses[i], apart[i]) << "step " << i;
}

// A resume that sets optimizer.lr trains with it, however it is spelled (--set 'optimizer.lr =
// 0.002') and wherever (a config file whose rate is not the run's own), and names it among what
// differs; without either the checkpoint's rate goes on. (Both were ignored without a word.)
TEST(Checkpoints, AResumeWithAnotherLearningRateTrainsWithItAndSaysSo) {
  TempDir dir;
  Job job = start_job(dir, "lr-set", kGpt, 1, {"job.steps=20"});
  ASSERT_TRUE(job.proc->wait(120s));
  auto lr_at = [&](int step) {
    char name[64];
    std::snprintf(name, sizeof name, "/checkpoints/step-%08d/manifest.json", step);
    std::ifstream in(job.run_dir + name);
    const auto m = nlohmann::json::parse(in, nullptr, false);
    return m.is_object() ? m["optimizer"].value("lr", 0.0) : -1.0;
  };
  ASSERT_EQ(lr_at(20), 0.003);
  auto resume = [&](const std::string& config, int steps, const std::vector<std::string>& more) {
    std::vector<std::string> sets{"job.steps=" + std::to_string(steps)};
    sets.insert(sets.end(), more.begin(), more.end());
    const size_t before = text_of(job.out).size();  // (each run's output is appended there)
    Job r = start_job(dir, "lr-set", config, 1, sets, {}, {"--resume", job.run_dir});
    auto st = r.proc->wait(120s);
    EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0) << text_of(r.out);
    return text_of(r.out).substr(before);
  };
  std::string said = resume(kGpt, 40, {"optimizer.lr = 0.002"});
  EXPECT_EQ(lr_at(40), 0.002) << said;
  EXPECT_NE(said.find("optimizer.lr = 0.002 (the run's: 0.003)"), std::string::npos) << said;
  std::string edited = kGpt;
  edited.replace(edited.find("lr = 0.003"), 10, "lr = 0.001");
  said = resume(edited, 60, {});
  EXPECT_EQ(lr_at(60), 0.001) << said;
  EXPECT_NE(said.find("optimizer.lr = 0.001 (the run's: 0.002)"), std::string::npos) << said;
  said = resume(text_of(job.run_dir + "/config.toml"), 80, {});  // (the run's own: it goes on)
  EXPECT_EQ(lr_at(80), 0.001) << said;
  EXPECT_EQ(said.find("optimizer.lr"), std::string::npos) << said;
  // A new run from one of its checkpoints, with a config of another rate: the same.
  edited.replace(edited.find("lr = 0.001"), 10, "lr = 0.004");
  Job branch = start_job(dir, "lr-branch", edited, 1, {"job.steps=70"}, {},
                         {"--resume", job.run_dir + "/checkpoints/step-00000060"});
  ASSERT_TRUE(branch.proc->wait(120s));
  EXPECT_NE(text_of(branch.out).find("optimizer.lr = 0.004 (its run's: 0.001)"), std::string::npos)
      << text_of(branch.out);
  std::ifstream in(branch.run_dir + "/checkpoints/step-00000070/manifest.json");
  EXPECT_EQ(nlohmann::json::parse(in, nullptr, false)["optimizer"].value("lr", 0.0), 0.004);
}

// Gone, or a zombie nobody reaped yet (the coordinator that started it was SIGKILLed).
bool ended(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string skip, state;
  return !(stat >> skip >> skip >> state) || state == "Z";
}

// The coordinator SIGKILLed: no agent lingers, the launched ones and one that joined by hand;
// each says why and exits non-zero within elastic.failure_timeout_ms. Nobody restarts the
// coordinator in time, so `troupe run --resume` goes on from the newest checkpoint, and starts
// its agents at once: every agent of the run is visibly gone. (It waited failure_timeout_ms +
// 2 s for them to come back.)
TEST(Checkpoints, TheCoordinatorKilledLeavesNoAgentAndTheRunResumesFromItsCheckpoint) {
  TempDir dir;
  // 200 paced steps: an agent joining once the first generation trains is in long before the
  // end, even when it starts slowly (as under a sanitizer). The coordinator dies with the three
  // training and a checkpoint at step 40 or later written.
  Reference want = reference(dir, 200);
  Job job = start_job(dir, "headless", kGpt, 2,
                      {"job.steps=200", "elastic.max_workers=3", "elastic.rejoin_timeout_ms=2000"},
                      {pace(60000)});
  wait_steps(job, 1);
  auto joiner = join_agent(dir, job, "joiner", {pace(60000)});
  const std::string three = wait_event(job, is("generation_started", "world_size", "3"), 60s);
  ASSERT_NE(three, "") << "the joiner never trained";
  wait_steps(job, std::max<size_t>(45, std::stoul(json_field(three, "step")) + 5));
  std::vector<int> agents = joined_pids(job);
  ASSERT_EQ(agents.size(), 3u) << "the run ended before the kill";
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  auto joiner_status = joiner->wait(20s);  // (its --failure-timeout-ms, 3 s, + the rejoin's 2 s)
  ASSERT_TRUE(joiner_status) << "the joined agent lingers";
  EXPECT_NE(WEXITSTATUS(*joiner_status), 0);
  EXPECT_NE(text_of(dir.path() + "/joiner.out").find("the coordinator was lost"), std::string::npos)
      << text_of(dir.path() + "/joiner.out");
  EXPECT_NE(text_of(dir.path() + "/joiner.out").find("no coordinator took the run over"),
            std::string::npos);
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  for (int pid : agents)
    while (!ended(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
  for (int pid : agents) EXPECT_TRUE(ended(pid)) << "agent " << pid << " lingers";
  for (const char* log : {"/agent-0.log", "/agent-1.log"})
    EXPECT_NE(text_of(job.run_dir + log).find("troupe agent: the coordinator"), std::string::npos)
        << text_of(job.run_dir + log);

  Job resumed =
      start_job(dir, "headless", kGpt, 2, {"job.steps=200"}, {}, {"--resume", job.run_dir});
  expect_same_function(resumed, want.losses, 200, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);
  EXPECT_GE(resumed_from(resumed), 40);
  double restarted = 0, launched = 0;
  for (const auto& e : events_of(resumed)) {
    if (is("coordinator_restarted")(e)) restarted = std::stod(json_field(e, "ts"));
    if (restarted > 0 && launched == 0 && is("agent_started")(e))
      launched = std::stod(json_field(e, "ts"));
  }
  ASSERT_GT(restarted, 0) << "it was not taken over";
  ASSERT_GT(launched, 0) << "it started no agent";
  EXPECT_NE(text_of(resumed.out).find("started (in place of an agent of the run that is gone)"),
            std::string::npos)
      << text_of(resumed.out);
  EXPECT_LT(launched - restarted, 5.0) << "it waited failure_timeout_ms (3 s) + 2 s for them";
}

// The coordinator stalled (SIGSTOP) past elastic.rejoin_timeout_ms, then SIGKILLed: every agent,
// launched or joined by hand, gives up waiting for a take-over and exits. (They waited for good
// in the end of their control plane, CAF's teardown, after saying they gave up.)
TEST(Checkpoints, AgentsWhoseCoordinatorStalledAndDiedExit) {
  TempDir dir;
  Job job =
      start_job(dir, "stalled", kGpt, 2,
                {"job.steps=100000", "elastic.max_workers=3", "elastic.rejoin_timeout_ms=30000"},
                {pace(60000)});
  wait_steps(job, 1);
  auto joiner = join_agent(dir, job, "joiner", {pace(60000)});
  ASSERT_NE(wait_event(job, is("generation_started", "world_size", "3"), 60s), "");
  std::vector<int> agents = joined_pids(job);
  ASSERT_EQ(agents.size(), 3u);
  ASSERT_EQ(::kill(job.proc->pid(), SIGSTOP), 0);
  std::this_thread::sleep_for(40s);  // (past the agents' 3 s failure timeout and 30 s rejoin)
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (int pid : agents)
    while (!ended(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
  for (int pid : agents) EXPECT_TRUE(ended(pid)) << "agent " << pid << " lingers";
  EXPECT_NE(text_of(dir.path() + "/joiner.out").find("no coordinator took the run over"),
            std::string::npos)
      << text_of(dir.path() + "/joiner.out");
  // Each shut its control plane down (troupe agent's 10 s teardown deadline is a backstop only:
  // a rejoin's reply that came after its request's deadline held the bridge's actor for good).
  for (const std::string& out :
       {dir.path() + "/joiner.out", job.run_dir + "/agent-0.log", job.run_dir + "/agent-1.log"})
    EXPECT_EQ(text_of(out).find("did not shut down within"), std::string::npos) << out;
}

// A member drained at a step boundary where a checkpoint is due writes its shards of it there
// with the others, and reports them as it leaves: that step's checkpoint is complete. (They were
// written and never reported: the checkpoint never came, and the survivors, who had written
// theirs, did not write it again.)
TEST(Checkpoints, ADrainedMembersShardsCompleteTheCheckpointOfTheStepItLeavesAt) {
  TempDir dir;
  Job job = start_job(dir, "drained-write", kGpt, 3,
                      {"job.steps=100000", "checkpoint.every_steps=1", "checkpoint.keep=100000"},
                      {pace(30000)});
  wait_steps(job, 5);
  admin(dir, {"drain", "--run-dir", job.run_dir, "--agent", "agent-2"});
  ASSERT_NE(wait_event(job, is("member_left"), 60s), "");
  const std::string next = wait_event(job, is("generation_started", "generation", "2"), 30s);
  ASSERT_NE(next, "");
  const std::string step = json_field(next, "step");
  EXPECT_NE(wait_event(job, is("checkpoint_written", "step", step), 30s), "")
      << "the checkpoint of step " << step << ", where agent-2 left, never completed";
  admin(dir, {"stop", "--run-dir", job.run_dir});
  EXPECT_TRUE(job.proc->wait(60s));
}

// troupe agent hears Ctrl-C while it waits for its workers to stop (a drained member finishing
// its checkpoint write may take up to 10 minutes): it leaves at once, 130, saying so.
TEST(Checkpoints, ADrainedAgentWaitingForItsWriteLeavesAtOnceOnSigint) {
  TempDir dir;
  Job job = start_job(dir, "drained-sigint", kGpt, 2,
                      {"job.steps=100000", "checkpoint.every_steps=0"}, {pace(30000)});
  wait_steps(job, 3);
  auto joiner =
      join_agent(dir, job, "slow-writer", {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=120000"});
  ASSERT_NE(wait_event(job, is("generation_started", "world_size", "3"), 60s), "");
  // (troupe checkpoint waits for the checkpoint, which waits for the paused write: not here)
  coordinator::ChildProcess asked({{troupe_binary(), "checkpoint", "--run-dir", job.run_dir},
                                   dir.path() + "/checkpoint.out",
                                   dir.path() + "/checkpoint.out",
                                   {}});
  ASSERT_NE(wait_event(job, is("checkpoint_requested"), 30s), "");
  std::this_thread::sleep_for(1s);  // (its write starts at the next step boundary, and pauses)
  admin(dir, {"drain", "--run-dir", job.run_dir, "--agent", "slow-writer"});
  ASSERT_NE(wait_event(job, is("member_left"), 60s), "");
  std::this_thread::sleep_for(1s);
  ASSERT_TRUE(joiner->signal(SIGINT));
  auto st = joiner->wait(10s);
  ASSERT_TRUE(st) << "the agent did not leave on SIGINT";
  EXPECT_EQ(WEXITSTATUS(*st), 130);
  const std::string out = text_of(dir.path() + "/slow-writer.out");
  EXPECT_NE(out.find("SIGINT while its workers stop: exiting at once"), std::string::npos) << out;
  admin(dir, {"stop", "--run-dir", job.run_dir});
  EXPECT_TRUE(job.proc->wait(60s));
}

// The name member `member` joined with (its member_joined event), or "".
std::string joined_name(const Job& job, const std::string& member) {
  std::string name;
  for (const auto& e : events_of(job))
    if (json_field(e, "event") == "member_joined" && json_field(e, "member") == member)
      name = json_field(e, "name");
  return name;
}

// A launched agent drained by `troupe scale` and SIGKILLed while it waits for its checkpoint
// write (each writer 8 s slow): the launcher does not start it again (it did: the job grew back
// past the size asked).
TEST(Checkpoints, ADrainedLaunchedAgentKilledWhileItWritesIsNotStartedAgain) {
  TempDir dir;
  Job job =
      start_job(dir, "drained-killed", kGpt, 3, {"job.steps=100000", "checkpoint.every_steps=0"},
                {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=8000"});
  wait_steps(job, 3);
  admin(dir, {"checkpoint", "--run-dir", job.run_dir, "--no-wait"});
  std::this_thread::sleep_for(1s);  // (the writes start at the next step boundary, and pause)
  admin(dir, {"scale", "--run-dir", job.run_dir, "--workers", "2"});
  const std::string left = wait_event(job, is("member_left"), 60s);
  ASSERT_NE(left, "");
  const std::string name = joined_name(job, json_field(left, "member"));  // (any join order)
  const int pid = pid_of(job, name);
  ASSERT_GT(pid, 0) << name;
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  std::this_thread::sleep_for(2s);  // (a restart comes after 100 ms)
  admin(dir, {"stop", "--run-dir", job.run_dir});
  ASSERT_TRUE(job.proc->wait(60s));
  EXPECT_EQ(count_events(job, "agent_restarted"), 0);
  EXPECT_EQ(count_events(job, "generation_started"), 2);
}

// The same, killed before it leaves (steps of 3 s: the drain waits for the step's end): it was
// retired only as it left, and the launcher started it again. A drain that comes just before a
// step's end (a slow `troupe scale`, as under a sanitizer on a loaded host) can let the agent
// leave before the kill: that attempt proves nothing, and the test tries again.
TEST(Checkpoints, ADrainedLaunchedAgentKilledBeforeItLeavesIsNotStartedAgain) {
  TempDir dir;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string label = "drained-early-" + std::to_string(attempt);
    Job job = start_job(dir, label, kGpt, 3, {"job.steps=100000"}, {pace(3000000)});
    wait_steps(job, 1);
    admin(dir, {"scale", "--run-dir", job.run_dir, "--workers", "2"});
    const std::string drained = wait_event(job, is("drain_requested"), 30s);
    ASSERT_NE(drained, "");
    const std::string name = joined_name(job, json_field(drained, "member"));
    const int pid = pid_of(job, name);
    ASSERT_GT(pid, 0) << name;
    const bool left_first = count_events(job, "member_left") > 0;  // (then it may be gone)
    if (!left_first) {
      ASSERT_EQ(::kill(pid, SIGKILL), 0);
      EXPECT_EQ(wait_event(job, is("agent_restarted"), 5s), "") << "the drained agent came back";
    }
    admin(dir, {"stop", "--run-dir", job.run_dir});
    ASSERT_TRUE(job.proc->wait(60s));
    if (left_first) continue;
    EXPECT_EQ(count_events(job, "member_joined"), 3);
    return;
  }
  FAIL() << "the drained agent left before the kill in every attempt: nothing was shown";
}

// The coordinator SIGKILLed and `troupe run --resume RUN_DIR` started again within
// elastic.rejoin_timeout_ms: it takes the run over, the agents still alive join it again and go on
// from their own state (nothing is rolled back to the checkpoint, no agent is launched anew), and
// the job computes the same bits as one never interrupted, every sample once in the ledger.
TEST(Checkpoints, ARestartedCoordinatorAdoptsTheLiveAgentsAndNothingIsRedone) {
  TempDir dir;
  Reference want = reference(dir, 120);
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000"};
  Job job = start_job(dir, "adopted", kGpt, 2, sets, {pace(30000)});
  wait_steps(job, 45);
  std::vector<int> agents = joined_pids(job);
  ASSERT_EQ(agents.size(), 2u);
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  const size_t before = committed_losses(job.run_dir).size();
  ASSERT_LT(before, 100u) << "the kill came too late to see anything adopted";
  for (int pid : agents) EXPECT_FALSE(ended(pid)) << "agent " << pid << " did not wait";

  // Another job.steps is refused, nothing started: the agents still alive train to the run's own.
  Job other = start_job(dir, "adopted-steps", kGpt, 2, {sets[0], "job.steps=150"}, {},
                        {"--resume", job.run_dir});
  auto refused = other.proc->wait(30s);
  ASSERT_TRUE(refused);
  EXPECT_EQ(WEXITSTATUS(*refused), 2) << text_of(other.out);
  EXPECT_NE(text_of(other.out).find("job.steps = 150, but the run was started with 120"),
            std::string::npos)
      << text_of(other.out);
  EXPECT_NE(text_of(other.out).find("to train to another step, start a new run from its "
                                    "checkpoint of step "),
            std::string::npos)
      << text_of(other.out);
  // So is another job.name: the agents still alive present the run's token, its name.
  Job renamed = start_job(dir, "adopted-name", kGpt, 2, {sets[0], "job.name=\"other\""}, {},
                          {"--resume", job.run_dir});
  refused = renamed.proc->wait(30s);
  ASSERT_TRUE(refused);
  EXPECT_EQ(WEXITSTATUS(*refused), 2) << text_of(renamed.out);
  EXPECT_NE(
      text_of(renamed.out)
          .find("job.name = 'other', but its agents that may still be alive are job 'checkpoints'"),
      std::string::npos)
      << text_of(renamed.out);

  Job taken = start_job(dir, "adopted", kGpt, 2, sets, {}, {"--resume", job.run_dir});
  expect_same_function(taken, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(taken), want.checksum);
  const std::string adopted = wait_event(taken, is("members_adopted"), 0s);
  ASSERT_NE(adopted, "") << "the live agents were not adopted";
  EXPECT_GE(std::stoul(json_field(adopted, "step")), before);
  // (the steps the lost coordinator had not logged, committed from the agents' reports: it said
  // 0 whenever they came before the generation formed)
  EXPECT_EQ(std::stoul(json_field(adopted, "recovered_steps")),
            std::stoul(json_field(adopted, "step")) - before)
      << adopted;
  EXPECT_EQ(count_events(taken, "steps_rolled_back"), 0);
  EXPECT_EQ(count_events(taken, "resumed_from_checkpoint"), 0);
  int adopted_agents = 0, launched_after = 0;
  bool restarted = false;
  for (const auto& e : events_of(taken)) {
    restarted = restarted || json_field(e, "event") == "coordinator_restarted";
    adopted_agents += restarted && is("member_joined", "adopted", "true")(e);
    launched_after += restarted && is("agent_started")(e);
  }
  EXPECT_EQ(adopted_agents, 2);
  EXPECT_EQ(launched_after, 0);
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (int pid : agents)
    while (!ended(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
  for (int pid : agents) EXPECT_TRUE(ended(pid)) << "adopted agent " << pid << " lingers";
}

// A plain stop while a take-over forms (one adopted agent back, the other held): not the end
// at once that a stop before the first generation is (the adopted agents may hold steps past
// the newest checkpoint), but a stop after the next step, its state saved there.
TEST(Checkpoints, APlainStopWhileATakeOverFormsSavesTheAdoptedState) {
  TempDir dir;
  const std::string hold = dir.path() + "/hold-agent-1";  // (absent: agent-1 joins at once)
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000",
                                      "elastic.failure_timeout_ms=10000",
                                      "checkpoint.every_steps=10"};
  Job job = start_job(dir, "forming", kGpt, 2, sets,
                      {pace(30000), "TROUPE_TEST_JOIN_DELAY_AGENT=agent-1",
                       "TROUPE_TEST_JOIN_DELAY_MS=120000", "TROUPE_TEST_JOIN_DELAY_FILE=" + hold});
  wait_steps(job, 25);
  std::ofstream(hold) << "";  // (agent-1's rejoin waits while it is there)
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  const size_t before = committed_losses(job.run_dir).size();

  Job taken = start_job(dir, "forming", kGpt, 2, sets, {}, {"--resume", job.run_dir});
  ASSERT_NE(wait_event(taken, is("member_joined", "adopted", "true"), 30s), "");
  const std::string said = admin(dir, {"stop", "--run-dir", taken.run_dir});
  EXPECT_EQ(said.find("the job stops now"), std::string::npos) << said;
  std::this_thread::sleep_for(1s);  // (a stop before training ends its job within 0.5 s)
  EXPECT_FALSE(taken.proc->wait(0s)) << "the take-over ended before its agents came back";
  fs::remove(hold);
  auto st = taken.proc->wait(60s);
  ASSERT_TRUE(st) << "the take-over did not end";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(taken.out);
  const std::string end = events_of(taken).back();
  EXPECT_EQ(json_field(end, "event"), "job_finished") << end;
  EXPECT_EQ(json_field(end, "state"), "stopped") << end;
  EXPECT_EQ(json_field(end, "resumable"), "true") << end;
  const size_t steps = std::stoul(json_field(end, "steps"));
  EXPECT_GT(steps, before) << end;
  char there[64];
  std::snprintf(there, sizeof there, "/checkpoints/step-%08zu/manifest.json", steps);
  EXPECT_EQ(json_field(end, "checkpoint"), taken.run_dir + there) << end;
  EXPECT_EQ(count_events(taken, "steps_rolled_back"), 0);
}

// A preemption's SIGTERM, then its SIGKILL while the stop's checkpoint is being written, and the
// run taken over: the adopted agents forget the lost coordinator's stop and train to job.steps,
// the same bits as a run never stopped. (They kept it and ended a step later: the take-over said
// "completed" after 5 of 12 steps.) The stop's checkpoint, whose shards were reported while no
// coordinator listened, is completed by the one that took over: the agents report them again.
// (It was lost.)
TEST(Checkpoints, ATakeOverOfARunThatWasStoppingTrainsToItsEnd) {
  TempDir dir;
  Reference want = reference(dir, 120);
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000",
                                      "checkpoint.every_steps=0"};
  Job job = start_job(dir, "stopping", kGpt, 2, sets,
                      {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=5000"});
  wait_steps(job, 20);
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  ASSERT_NE(wait_event(job, is("stop_requested"), 30s), "");
  std::this_thread::sleep_for(1s);  // (its step taken, its checkpoint under way for 5 s)
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  ASSERT_EQ(count_events(job, "job_finished"), 0) << "it ended before the kill: the test is void";
  std::this_thread::sleep_for(6s);  // (the writes end; their reports reach no coordinator)
  Job taken = start_job(dir, "stopping", kGpt, 2, sets, {}, {"--resume", job.run_dir});
  expect_same_function(taken, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(taken), want.checksum);
  const std::string adopted = wait_event(taken, is("members_adopted"), 0s);
  ASSERT_NE(adopted, "") << "nothing was adopted";
  const std::string stop_step = json_field(adopted, "step");  // (where they stopped and wrote)
  EXPECT_EQ(json_field(events_of(taken).back(), "state"), "completed") << events_of(taken).back();
  std::vector<std::string> written;
  for (const auto& e : events_of(taken))
    if (json_field(e, "event") == "checkpoint_written") written.push_back(json_field(e, "step"));
  EXPECT_EQ(written, (std::vector<std::string>{stop_step, "120"}));
  EXPECT_EQ(count_events(taken, "checkpoint_failed"), 0);
}

// The same preemption with an agent signalled first, its drain refused (below
// elastic.min_workers), then the coordinator's stop followed, and the coordinator SIGKILLed: the
// run taken over trains on, but that agent does not. It asks the new coordinator to drain it,
// is refused again, leaves, and an agent started in its place trains to job.steps, the same bits.
// (It trained on with the run taken over: the signal was forgotten with the lost stop.)
TEST(Checkpoints, AnAgentSignalledBeforeATakeOverLeavesTheRunTakenOver) {
  TempDir dir;
  Reference want = reference(dir, 120);
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000", "checkpoint.every_steps=0",
                                      "elastic.min_workers=2"};
  Job job = start_job(dir, "signalled", kGpt, 2, sets,
                      {pace(100000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=5000"});
  wait_steps(job, 10);
  const int signalled = pid_of(job, "agent-0");
  ASSERT_GT(signalled, 0);
  ASSERT_EQ(::kill(signalled, SIGTERM), 0);
  const std::string log = job.run_dir + "/agent-0.log";
  auto logged = [&](const std::string& what) {
    for (auto until = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(10ms))
      if (text_of(log).find(what) != std::string::npos) return true;
    return false;
  };
  ASSERT_TRUE(logged("asking the coordinator to drain")) << text_of(log);
  std::this_thread::sleep_for(300ms);  // (its drain refused; answered later, it would be taken)
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  ASSERT_NE(wait_event(job, is("stop_requested"), 30s), "");
  ASSERT_TRUE(logged("this agent stops with it")) << text_of(log);
  std::this_thread::sleep_for(1s);  // (its step taken, its checkpoint under way for 5 s)
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  ASSERT_EQ(count_events(job, "job_finished"), 0) << "it ended before the kill: the test is void";
  ASSERT_FALSE(ended(signalled)) << "the signalled agent did not follow the stop: the test is void";
  Job taken = start_job(dir, "signalled", kGpt, 2, sets, {pace(100000)}, {"--resume", job.run_dir});
  expect_same_function(taken, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(taken), want.checksum);
  // Asked once the new coordinator's first generation started: refused for elastic.min_workers
  // (before, every drain is refused: "the job is not running").
  const std::string said = text_of(log);
  const size_t asked = said.find(
      "SIGTERM before the coordinator was lost: asking the one that took the run over to drain "
      "this agent");
  ASSERT_NE(asked, std::string::npos) << said;
  EXPECT_NE(said.find("elastic.min_workers", asked), std::string::npos) << said.substr(asked);
  bool restarted = false, replaced = false, lost_before_end = false;
  for (const auto& e : events_of(taken)) {
    restarted = restarted || is("coordinator_restarted")(e);
    replaced = replaced || (restarted && is("agent_started")(e));
    lost_before_end = lost_before_end || (restarted && is("member_failed")(e));
  }
  EXPECT_TRUE(lost_before_end) << "the signalled agent trained on with the run taken over";
  EXPECT_TRUE(replaced) << "no agent was started in its place";
}

// A run stopped and resumed, and the resume's coordinator SIGKILLed: `troupe run --resume` takes
// that run over too (the first run's job_finished is not the resume's end) and adopts its live
// agents, with the job's token kept. (It resumed from the checkpoint again under a new token, and
// the live agents, refused by it, exited: the steps since were redone.)
TEST(Checkpoints, AResumedRunWhoseCoordinatorIsKilledIsTakenOverToo) {
  TempDir dir;
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000", "job.steps=100000",
                                      "checkpoint.every_steps=0"};
  // (Its stop's checkpoint written slowly: a second stop --checkpoint comes while it is.)
  Job job = start_job(dir, "resumed-lost", kGpt, 2, sets,
                      {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=5000"});
  wait_steps(job, 5);
  admin(dir, {"stop", "--run-dir", job.run_dir, "--checkpoint"});
  admin(dir, {"stop", "--run-dir", job.run_dir, "--checkpoint"});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0);
  EXPECT_EQ(count_events(job, "checkpoint_requested"), 1);  // one request, asked twice
  Job resumed =
      start_job(dir, "resumed-lost", kGpt, 2, sets, {pace(30000)}, {"--resume", job.run_dir});
  ASSERT_NE(wait_event(resumed, is("generation_started"), 60s), "");
  const size_t at = committed_losses(job.run_dir).size();
  wait_steps(resumed, at + 10);
  const std::string token = text_of(job.run_dir + "/job.token");
  ASSERT_EQ(::kill(resumed.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(resumed.proc->wait(10s));
  Job taken = start_job(dir, "resumed-lost", kGpt, 2, sets, {}, {"--resume", job.run_dir});
  ASSERT_NE(wait_event(taken, is("members_adopted"), 60s), "") << text_of(taken.out);
  EXPECT_EQ(text_of(job.run_dir + "/job.token"), token);
  int resumes = 0;
  for (const auto& e : events_of(taken)) resumes += is("resumed_from_checkpoint")(e);
  EXPECT_EQ(resumes, 1) << "the take-over resumed from the checkpoint instead";
  EXPECT_EQ(count_events(taken, "steps_rolled_back"), 0);
  admin(dir, {"stop", "--run-dir", job.run_dir});
  st = taken.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(taken.out);
  // A plain stop: the run's checkpoint it went on from is still where a resume goes on from (it
  // said none: a coordinator knew only the checkpoints it wrote itself).
  const std::string end = events_of(taken).back();
  EXPECT_NE(json_field(end, "resume_from").find(job.run_dir + "/checkpoints/step-"),
            std::string::npos)
      << end;
  EXPECT_NE(text_of(taken.out).find("its newest checkpoint is " + job.run_dir), std::string::npos)
      << text_of(taken.out);
}

// An adopted agent lost after the take-over is no child of the new launcher: one is started in its
// place, named past the run's agents (a scale used to start a second agent-0 beside the adopted
// one, both writing agent-0.log; the lost one was never replaced).
TEST(Checkpoints, AnAdoptedAgentLostAfterATakeOverIsReplacedUnderANewName) {
  TempDir dir;
  const std::vector<std::string> sets{"elastic.rejoin_timeout_ms=60000", "job.steps=100000"};
  Job job = start_job(dir, "adopted-lost", kGpt, 2, sets, {pace(60000)});
  wait_steps(job, 5);
  std::vector<int> agents = joined_pids(job);
  ASSERT_EQ(agents.size(), 2u);
  ASSERT_EQ(::kill(job.proc->pid(), SIGKILL), 0);
  ASSERT_TRUE(job.proc->wait(10s));
  Job taken = start_job(dir, "adopted-lost", kGpt, 2, sets, {}, {"--resume", job.run_dir});
  ASSERT_NE(wait_event(taken, is("members_adopted"), 60s), "") << text_of(taken.out);
  ASSERT_EQ(::kill(agents[0], SIGKILL), 0);
  const std::string started = wait_event(taken, is("agent_started"), 60s);
  ASSERT_NE(started, "") << "the lost adopted agent was not replaced";
  EXPECT_EQ(json_field(started, "slot"), "2") << started;
  // (Said why: it said "scale", and none was asked for.)
  EXPECT_EQ(json_field(started, "detail").rfind("in place of ", 0), 0u) << started;
  ASSERT_NE(wait_event(taken, is("member_joined", "name", "agent-2"), 60s), "");
  // (the adoption's generation had two members, the one after the loss one; then two again)
  int twos = 0;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       twos < 2 && std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(100ms)) {
    twos = 0;
    bool restarted = false;  // (the run's events before the take-over are in the file too)
    for (const auto& e : events_of(taken)) {
      restarted = restarted || is("coordinator_restarted")(e);
      twos += restarted && is("generation_started", "world_size", "2")(e);
    }
  }
  EXPECT_GE(twos, 2) << "the replacement never trained";
  admin(dir, {"stop", "--run-dir", taken.run_dir});
  auto st = taken.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(taken.out);
  const std::string log0 = text_of(taken.run_dir + "/agent-0.log");
  EXPECT_EQ(log0.find("joined job"), log0.rfind("joined job")) << "two agent-0s: " << log0;
  EXPECT_EQ(count_events(taken, "agent_started"), 1) << "more agents than cluster.agents";
  for (int pid : agents) {
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!ended(pid) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
    EXPECT_TRUE(ended(pid)) << "adopted agent " << pid << " lingers";
  }
}

// The step-N directories in `dir`, oldest first.
std::vector<std::string> checkpoint_dirs_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("step-", 0) == 0)
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> checkpoint_dirs(const Job& job) {
  return checkpoint_dirs_in(job.run_dir + "/checkpoints");
}

// A job that completes keeps its last step's parameters in a checkpoint (troupe export reads it)
// though its steps are no multiple of checkpoint.every_steps: steps 50 to 59 were lost.
TEST(Checkpoints, AJobThatCompletesCheckpointsItsLastStep) {
  TempDir dir;
  Job job = start_job(dir, "last", kGpt, 2, {"job.steps=59", "checkpoint.every_steps=25"});
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  ASSERT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  EXPECT_EQ(checkpoint_dirs(job),
            (std::vector<std::string>{"step-00000025", "step-00000050", "step-00000059"}));
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "state"), "completed") << end;
  EXPECT_EQ(json_field(end, "resumable"), "false") << end;  // (nothing left to run)
  EXPECT_EQ(json_field(end, "checkpoint"), job.run_dir + "/checkpoints/step-00000059/manifest.json")
      << end;
  const std::string model = dir.path() + "/last.safetensors";
  const std::string said = admin(dir, {"export", job.run_dir, "-o", model, "--batch-of-step", "9"});
  EXPECT_NE(said.find("step 59 of"), std::string::npos) << said;
  EXPECT_NE(said.find("the global batch of step 9 -> " + model + ".batch.safetensors"),
            std::string::npos)
      << said;
  // A batch of no step of the job: refused (they wrote nothing, or a batch of a step never run).
  EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model, "--batch-of-step", "59"}, 2)
                .find("--batch-of-step 59: the job's steps are 0 to 58"),
            std::string::npos);
  EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model, "--batch-of-step", "-5"}, 2)
                .find("--batch-of-step: -5 is not a step (0 or more)"),
            std::string::npos);
  // (--step -1 exported the newest checkpoint)
  EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model, "--step", "-1"}, 2)
                .find("--step: -1 is not a step (0 or more)"),
            std::string::npos);
  // (it was taken as 9223372036854775807, and said so; 0x10 as 16)
  EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model, "--step", "99999999999999999999"}, 2)
                .find("--step: 99999999999999999999 is not a step (more than any job has)"),
            std::string::npos);
  EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model, "--step", "0x10"}, 2)
                .find("--step: 0x10 is not a decimal number"),
            std::string::npos);
  // A run directory moved takes its checkpoints along (export read the old place's, by the
  // absolute checkpoint.dir in config.toml: gone, or another run's).
  const std::string moved = dir.path() + "/moved";
  fs::rename(job.run_dir, moved);
  EXPECT_NE(admin(dir, {"export", moved, "-o", model, "--step", "50"}).find("step 50 of"),
            std::string::npos);
  // A step as its directory names it (CLI11 read 00000050 as octal: step 40)
  EXPECT_NE(admin(dir, {"export", moved, "-o", model, "--step", "00000050"}).find("step 50 of"),
            std::string::npos);
  // A checkpoint named as the events name it (its manifest) or by its directory stands for its
  // run and step; the batch of another step is said not to pair with it.
  const std::string by_run = text_of(model);
  const std::string named =
      admin(dir, {"export", moved + "/checkpoints/step-00000050/manifest.json", "-o", model,
                  "--batch-of-step", "9"});
  EXPECT_NE(named.find("step 50 of " + moved), std::string::npos) << named;
  // (no checkpoint of step 9 is kept: it said "--step 9 pairs them", which export then refused)
  EXPECT_NE(named.find("this one is of step 50; no checkpoint of step 9 is kept"),
            std::string::npos)
      << named;
  EXPECT_NE(admin(dir, {"export", moved, "-o", model, "--batch-of-step", "25", "--step", "50"})
                .find("this one is of step 50: --step 25 pairs them"),
            std::string::npos);
  EXPECT_EQ(text_of(model), by_run);
  EXPECT_NE(
      admin(dir, {"export", moved + "/checkpoints/step-00000025/", "-o", model, "--step", "50"}, 2)
          .find("checkpoints/step-00000025 is the checkpoint of step 25"),
      std::string::npos);

  // Without checkpoint.every_steps too (the default): the training's result is kept, not lost.
  Job plain = start_job(dir, "last-plain", kGpt, 1, {"job.steps=12"});
  st = plain.proc->wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  ASSERT_EQ(WEXITSTATUS(*st), 0) << text_of(plain.out);
  EXPECT_EQ(checkpoint_dirs(plain), (std::vector<std::string>{"step-00000012"}));
  EXPECT_NE(admin(dir, {"export", plain.run_dir, "-o", model}).find("step 12 of"),
            std::string::npos);
}

// A member SIGKILLed while the shards of the last step's checkpoint are written (each writer
// 3 s slow after its first shard): the survivor's generation, formed after the last step, writes
// the checkpoint again in its own layout. The job completed with it (it ended "completed" with no
// checkpoint, the lost member's shards missing: nothing to export). With elastic.min_workers = 2
// too: a job whose every step is committed does not pause for a second worker (it failed at
// rejoin_timeout_ms, finished).
TEST(Checkpoints, AMemberLostWhileTheLastCheckpointIsWrittenLeavesItWrittenByTheOthers) {
  TempDir dir;
  for (const std::string min_workers : {"1", "2"}) {
    SCOPED_TRACE("min_workers " + min_workers);
    const std::string name = "lost-at-end-" + min_workers;
    Job job = start_job(dir, name, kGpt, 2,
                        {"job.steps=20", "elastic.max_restarts=0",
                         "elastic.min_workers=" + min_workers, "elastic.rejoin_timeout_ms=5000"},
                        {pace(20000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=3000"});
    wait_steps(job, 20);
    std::this_thread::sleep_for(500ms);  // (its writer in its first shard's delay)
    ASSERT_EQ(::kill(pid_of(job, "agent-1"), SIGKILL), 0);
    auto st = job.proc->wait(60s);
    ASSERT_TRUE(st && WIFEXITED(*st));
    EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
    ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 1s), "")
        << "the kill came too late: " << text_of(job.run_dir + "/events.jsonl");
    const std::string end = events_of(job).back();
    EXPECT_EQ(json_field(end, "state"), "completed") << end;
    EXPECT_EQ(json_field(end, "checkpoint"),
              job.run_dir + "/checkpoints/step-00000020/manifest.json")
        << end;
    const std::string model = dir.path() + "/" + name + ".safetensors";
    EXPECT_NE(admin(dir, {"export", job.run_dir, "-o", model}).find("step 20 of"),
              std::string::npos);
  }
}

// After the last step no step is to commit, but the members still end within
// elastic.step_timeout_ms of another's end: one whose final checkpoint write hangs (a hung mount;
// here 20 s) is cut and the other writes the checkpoint again, the job completing with it; when
// every member's write hangs, the job fails after three windows saying so. (Both waited without
// end.)
TEST(Checkpoints, AMemberHungInTheLastCheckpointWriteIsCutAtTheStepTimeout) {
  TempDir dir;
  const std::vector<std::string> sets = {"job.steps=20", "elastic.max_restarts=0",
                                         "elastic.failure_timeout_ms=2000",
                                         "elastic.step_timeout_ms=3000"};
  Job one = start_job(dir, "one-hangs", kGpt, 2, sets,
                      {pace(20000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=20000",
                       "TROUPE_TEST_CHECKPOINT_DELAY_AGENT=agent-1"});
  auto st = one.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(one.out);
  const std::string cut = wait_event(one, is("member_failed"), 1s);
  EXPECT_NE(cut.find("hung: it did not end within 3000 ms of the job's last step 20"),
            std::string::npos)
      << cut;
  const std::string end = events_of(one).back();
  EXPECT_EQ(json_field(end, "state"), "completed") << end;
  EXPECT_EQ(json_field(end, "checkpoint"), one.run_dir + "/checkpoints/step-00000020/manifest.json")
      << end;

  Job all = start_job(dir, "all-hang", kGpt, 2, sets,
                      {pace(20000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=20000"});
  st = all.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 1) << text_of(all.out);
  const std::string failed = events_of(all).back();
  EXPECT_EQ(json_field(failed, "event"), "job_failed") << failed;
  EXPECT_NE(
      json_field(failed, "reason").find("no member ended within 9000 ms of the job's last step 20"),
      std::string::npos)
      << failed;
}

// The state lost with the members that held it (checkpoint.on_state_lost = "rollback", the
// default): every agent of a data-parallel job SIGKILLed at once, or a pipeline stage without a
// replica or a stage backup; the launcher starts them again, and the running job goes on from
// its newest checkpoint (step 40), or without checkpoints from its start (the seed), redoing the
// steps after it. The same function, bitwise: the losses and the ledger as an uninterrupted
// run's, and (data parallel) the same parameters.
TEST(Checkpoints, StateLostWithItsMembersIsReloadedFromTheNewestCheckpointWithinTheJob) {
  TempDir dir;
  Reference want = reference(dir, 120);
  struct Case {
    const char* name;
    std::vector<std::string> sets;
    std::vector<std::string> killed;
    const char* from;
  } cases[] = {
      {"all-lost", {}, {"agent-0", "agent-1"}, "40"},
      {"stage-lost",
       {"parallel.pipeline_stages=2", "parallel.stage_backup_steps=0"},
       {"agent-1"},
       "40"},
      {"no-checkpoint", {"checkpoint.every_steps=0"}, {"agent-0", "agent-1"}, "0"},
      {"stage-lost-no-checkpoint",  // (the surviving stage's moments go too)
       {"parallel.pipeline_stages=2", "parallel.stage_backup_steps=0", "checkpoint.every_steps=0"},
       {"agent-1"},
       "0"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Job job = start_job(dir, c.name, kGpt, 2, c.sets, {pace(30000)});
    wait_steps(job, 50);
    for (const auto& name : c.killed) ASSERT_EQ(::kill(pid_of(job, name), SIGKILL), 0);
    expect_same_function(job, want.losses, 120, kBatch, 0);
    if (c.sets.size() < 2) {  // (a pipeline's members hold different blocks)
      EXPECT_EQ(final_checksum(job), want.checksum);
    }
    const std::string back = wait_event(job, is("steps_rolled_back"), 1s);
    EXPECT_EQ(json_field(back, "from"), c.from) << back;
    const std::string said = text_of(job.out);
    if (std::string(c.from) == "0") {
      EXPECT_EQ(json_field(back, "seed"), "true") << back;
      EXPECT_NE(said.find("rolling back to the job's start (its seed)"), std::string::npos) << said;
      continue;
    }
    EXPECT_EQ(json_field(back, "checkpoint"), job.run_dir + "/checkpoints/step-00000040") << back;
    EXPECT_NE(said.find("the model's state was lost; rolling back to the checkpoint of step 40"),
              std::string::npos)
        << said;
  }
}

// A failure that recurs at the same step after every rollback (the test build's agent exits at
// step 13 in every incarnation; a bug, not a lost machine): elastic.max_reforms rollbacks in a
// row that commit nothing new fail the job, saying so, instead of rolling back for ever.
TEST(Checkpoints, RollbacksThatMakeNoProgressEnd) {
  TempDir dir;
  Job job =
      start_job(dir, "recurring", kGpt, 1,
                {"checkpoint.every_steps=5", "elastic.max_restarts=10", "elastic.max_reforms=2"},
                {pace(30000), "TROUPE_TEST_EXIT_AGENT=agent-0", "TROUPE_TEST_EXIT_AT_STEP=13"});
  auto st = job.proc->wait(180s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << text_of(job.out);
  EXPECT_EQ(WEXITSTATUS(*st), 1) << text_of(job.out);
  const std::string end = events_of(job).back();
  EXPECT_NE(end.find("rolled back 2 times in a row without committing a step past "),
            std::string::npos)
      << end;
  EXPECT_EQ(count_events(job, "steps_rolled_back"), 2) << text_of(job.out);
}

// A member SIGKILLed while its checkpoint write is in flight (every write pauses after its first
// shard): that checkpoint never gets a manifest, so it does not exist; every checkpoint that
// has one is complete and valid (troupe export checks it), and the job goes on to the end.
TEST(Checkpoints, AMemberLostMidWriteLeavesTheCheckpointAbsentAndEveryOtherValid) {
  TempDir dir;
  Reference want = reference(dir, 120);
  Job job = start_job(dir, "lost-writer", kGpt, 3, {"checkpoint.every_steps=10"},
                      {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=1500"});
  wait_steps(job, 12);  // the write of step 10 is paused on every member
  const int victim = pid_of(job, "agent-1");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  expect_same_function(job, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(job), want.checksum);
  // Said once a later one is complete (the lost writer's shards never come), and its files gone.
  const std::string failed = wait_event(job, is("checkpoint_failed", "step", "10"), 1s);
  EXPECT_NE(failed.find("had not come when the checkpoint at step "), std::string::npos) << failed;
  EXPECT_NE(failed.find(" was complete: their writer was lost"), std::string::npos) << failed;
  EXPECT_EQ(count_events(job, "checkpoint_failed"), 1);
  EXPECT_FALSE(fs::exists(job.run_dir + "/checkpoints/step-00000010"));
  int valid = 0;
  for (const auto& name : checkpoint_dirs(job)) {
    const std::string at = job.run_dir + "/checkpoints/" + name;
    if (!fs::exists(at + "/manifest.json")) continue;
    admin(dir, {"export", job.run_dir, "--step", std::to_string(std::stoi(name.substr(5))), "-o",
                dir.path() + "/" + name + ".safetensors"});
    ++valid;
  }
  EXPECT_GE(valid, 2);
  // A step without a valid checkpoint: refused, naming the ones there are.
  for (const char* step : {"10", "7"}) {
    const std::string said = admin(
        dir, {"export", job.run_dir, "--step", step, "-o", dir.path() + "/none.safetensors"}, 2);
    EXPECT_NE(said.find("; the valid checkpoints are of steps "), std::string::npos) << said;
  }
}

// troupe stop: the job ends within a minute, exit 0.
void stop_expecting_0(const TempDir& dir, const Job& job) {
  admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st) << "the job did not stop";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
}

// troupe stop while the job is paused with no worker left (its only agent killed): nothing can
// form a generation that stops, so the job stops at once, exit 0, and says where a resume goes on
// from (its newest checkpoint; the state after it went with the worker). (The stop was accepted,
// then ignored: the job failed when elastic.rejoin_timeout_ms ran out.)
TEST(Checkpoints, AStopWhilePausedWithNoWorkerStopsAtOnceResumableFromTheNewest) {
  TempDir dir;
  Job job = start_job(dir, "paused-stop", kGpt, 1,
                      {"cluster.launcher=\"external\"", "job.steps=100000",
                       "checkpoint.every_steps=10", "elastic.rejoin_timeout_ms=120000"});
  auto agent = join_agent(dir, job, "only", {pace(20000)});
  wait_steps(job, 25);
  ASSERT_TRUE(agent->signal(SIGKILL));
  ASSERT_NE(wait_event(job, is("job_paused"), 30s), "");
  admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(20s);
  ASSERT_TRUE(st) << "the stop waited for the pause's end";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "state"), "stopped") << end;
  const std::string from = json_field(end, "resume_from");
  EXPECT_NE(from.find("/checkpoints/step-000000"), std::string::npos) << end;
  EXPECT_TRUE(fs::exists(from)) << end;
  EXPECT_NE(text_of(job.out).find("no checkpoint there, the state went with the workers; resume "
                                  "from "),
            std::string::npos)
      << text_of(job.out);
}

// checkpoint.if_busy = "skip" with one member's write slow (its first pauses 2.5 s, ~80 steps):
// every member skips the periodic checkpoints while it writes, not only the busy one, so every
// checkpoint directory there is has its manifest. (Each rank decided alone: the idle one wrote
// its shards of ~20 steps whose checkpoints never completed, left on disk.)
TEST(Checkpoints, SkippedWhileBusyByEveryMemberAtOnce) {
  TempDir dir;
  Job job = start_job(dir, "skip-busy", kGpt, 1,
                      {"job.steps=100000", "checkpoint.every_steps=4", "checkpoint.keep=1000",
                       "checkpoint.if_busy=\"skip\""},
                      {pace(30000)});
  wait_steps(job, 3);
  auto joiner =
      join_agent(dir, job, "slow-writer", {pace(30000), "TROUPE_TEST_CHECKPOINT_DELAY_MS=2500"});
  const std::string two = wait_event(job, is("generation_started", "world_size", "2"), 60s);
  ASSERT_NE(two, "");
  wait_steps(job, std::stoul(json_field(two, "step")) + 150);
  stop_expecting_0(dir, job);
  const std::string log = text_of(job.run_dir + "/agent-0.log");
  EXPECT_NE(log.find("still being written by another member"), std::string::npos) << log;
  size_t complete = 0;
  for (const auto& name : checkpoint_dirs(job)) {
    EXPECT_TRUE(fs::exists(job.run_dir + "/checkpoints/" + name + "/manifest.json"))
        << name << " holds shards of a checkpoint that never completed";
    complete += fs::exists(job.run_dir + "/checkpoints/" + name + "/manifest.json");
  }
  EXPECT_GE(complete, 3u);
}

// troupe checkpoint, served; then a worker fails and is restarted (its agent's board still
// holds the request): the next generation takes no checkpoint of its own. (The restarted worker
// voted for the served request at its first step boundary, and every member took one.)
TEST(Checkpoints, ARequestServedIsNotTakenAgainByARestartedWorker) {
  TempDir dir;
  Job job =
      start_job(dir, "served-once", kGpt, 2, {"job.steps=100000", "checkpoint.every_steps=0"},
                {pace(30000), "TROUPE_TEST_THROW_AGENT=agent-1", "TROUPE_TEST_THROW_AT_STEP=200"});
  wait_steps(job, 5);
  admin(dir, {"checkpoint", "--run-dir", job.run_dir});
  ASSERT_EQ(count_events(job, "checkpoint_written"), 1);
  // (complete before the failure: else it is rightly asked for again)
  ASSERT_LT(std::stoul(json_field(wait_event(job, is("checkpoint_written"), 1s), "step")), 195u);
  ASSERT_NE(wait_event(job, is("worker_failed"), 60s), "");
  const std::string next = wait_event(job, is("generation_started", "generation", "2"), 60s);
  ASSERT_NE(next, "");
  wait_steps(job, std::stoul(json_field(next, "step")) + 20);
  stop_expecting_0(dir, job);
  EXPECT_EQ(count_events(job, "checkpoint_written"), 1) << "a checkpoint nobody asked for";
}

// troupe checkpoint while a member's worker fails with its write under way (every write pauses
// 8 s after its first shard, and agent-1's worker throws meanwhile): its result is never
// reported, so the checkpoint never completes; the next generation is asked for it again, and
// troupe checkpoint gets one. (It waited its 10 minutes: every member counted it served.)
TEST(Checkpoints, ARequestedCheckpointWhoseWriterFailedIsTakenAgain) {
  TempDir dir;
  Job job =
      start_job(dir, "writer-failed", kGpt, 2, {"job.steps=100000", "checkpoint.every_steps=0"},
                {pace(50000), "TROUPE_TEST_THROW_AGENT=agent-1", "TROUPE_TEST_THROW_AT_STEP=100",
                 "TROUPE_TEST_CHECKPOINT_DELAY_MS=8000"});
  wait_steps(job, 5);
  coordinator::ChildProcess asked({{troupe_binary(), "checkpoint", "--run-dir", job.run_dir},
                                   dir.path() + "/checkpoint.out",
                                   dir.path() + "/checkpoint.out",
                                   {}});
  const std::string req = wait_event(job, is("checkpoint_requested"), 30s);
  ASSERT_NE(req, "");
  ASSERT_LT(std::stoul(json_field(req, "step")), 95u) << "asked for after the failure";
  ASSERT_NE(wait_event(job, is("worker_failed"), 60s), "");
  auto st = asked.wait(60s);
  ASSERT_TRUE(st) << "troupe checkpoint still waits: " << text_of(dir.path() + "/checkpoint.out");
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(dir.path() + "/checkpoint.out");
  EXPECT_GE(count_events(job, "checkpoint_written"), 1);
  EXPECT_NE(wait_event(job, is("checkpoint_requested", "again", "true"), 1s), "")
      << "the events do not say it was asked for again";
  admin(dir, {"stop", "--run-dir", job.run_dir});
  EXPECT_TRUE(job.proc->wait(60s));
}

// One checkpoint.dir given to several runs: a second live run, of any configuration, is refused
// naming the first (their checkpoints of one step were one directory, and a run of the same
// configuration pruned the other's as its own), and so is a new run once the first has ended (it
// overwrote them); a run resumed from one of them goes on there. Each refusal exits 2 and leaves
// no run directory.
TEST(Checkpoints, ACheckpointDirHoldsOneRunsCheckpoints) {
  TempDir dir;
  const std::string shared = dir.path() + "/shared";
  const std::vector<std::string> sets{"job.steps=100000", "checkpoint.every_steps=5",
                                      "checkpoint.dir=\"" + shared + "\""};
  Job first = start_job(dir, "first", kGpt, 1, sets, {pace(30000)});
  wait_steps(first, 6);
  auto refused = [&](const std::string& name, const std::vector<std::string>& more,
                     const std::vector<std::string>& args = {}) {
    std::vector<std::string> all = sets;
    all.insert(all.end(), more.begin(), more.end());
    Job j = start_job(dir, name, kGpt, 1, all, {}, args);
    auto st = j.proc->wait(60s);
    EXPECT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 2) << text_of(j.out);
    EXPECT_FALSE(fs::exists(j.run_dir)) << "a refused run left " << j.run_dir;
    return text_of(j.out);
  };
  for (const auto& [name, more] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"second", {}}, {"other", {"job.seed=4"}}}) {
    const std::string live = refused(name, more);
    EXPECT_NE(live.find("is in use by another job (job 'checkpoints', pid"), std::string::npos)
        << live;
  }
  stop_expecting_0(dir, first);
  const std::string fresh = refused("fresh", {"job.seed=4"});
  EXPECT_NE(fresh.find("holds an earlier run's checkpoints (the newest: step "), std::string::npos)
      << fresh;
  const std::string newest = checkpoint_dirs_in(shared).back();
  Job resumed =
      start_job(dir, "resumed", kGpt, 1, sets, {pace(30000)}, {"--resume", shared + "/" + newest});
  wait_steps(resumed, std::stoul(newest.substr(5)) + 6);
  stop_expecting_0(dir, resumed);
}

// Checkpoints on a full disk: the checkpoint directory is a 2 MiB tmpfs in a user and mount
// namespace of the test's own (room for one checkpoint of this MLP: its first block's shard is
// 1.6 MB). The first checkpoint is written; the later ones fail with the system's reason, said on
// the console once each, and leave nothing behind (the other writer's shard, kept, would fill the
// disk further); the job trains to its end.
TEST(Checkpoints, OnAFullDiskTheyFailWithTheReasonAndLeaveNothingBehind) {
  if (std::system("/usr/bin/unshare -rm true > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "no user and mount namespaces here (unshare -rm true fails)";
  TempDir dir;
  const std::string config = dir.path() + "/full.toml", ck = dir.path() + "/ck",
                    run_dir = dir.path() + "/full", out = dir.path() + "/full.out";
  std::ofstream(config) << "[job]\nname = \"full-disk\"\nseed = 1\nsteps = 60\n"
                           "[model]\nkind = \"mlp\"\ninputs = 784\nhidden = [256]\nclasses = 10\n"
                           "[data]\nkind = \"synthetic\"\nsamples = 2000\n"
                           "[batch]\nglobal = 32\nmicro = 16\n"
                           "[optimizer]\nkind = \"sgd\"\nlr = 0.05\nmomentum = 0.9\n"
                           "[checkpoint]\nevery_steps = 20\nkeep = 3\ndir = \""
                        << ck << "\"\n[cluster]\nagents = 2\n";
  fs::create_directories(ck);
  // (timeout: the job ends even if the shell is killed; the listing is taken inside, where the
  // tmpfs is mounted.)
  const std::string script = "mount -t tmpfs -o size=2m tmpfs " + ck + " && timeout 100 " +
                             troupe_binary() + " run " + config + " --set job.run_dir=\\\"" +
                             run_dir + "\\\"; rc=$?; ls " + ck + " > " + dir.path() +
                             "/listing; exit $rc";
  coordinator::ChildProcess p({{"/usr/bin/unshare", "-rm", "/bin/sh", "-c", script}, out, out, {}});
  const auto status = p.wait(120s);
  ASSERT_TRUE(status && WIFEXITED(*status)) << text_of(out);
  // Trained to the end, its final parameters unsaved: a failure, naming the newest checkpoint
  // (it exited 0, "completed", with nothing to export).
  EXPECT_EQ(WEXITSTATUS(*status), 1) << text_of(out);
  const std::string end = lines_of(run_dir + "/events.jsonl").back();
  EXPECT_NE(end.find("all 60 steps trained, but the final checkpoint was not written (rank "),
            std::string::npos)
      << end;
  EXPECT_NE(end.find("the final parameters are not saved; the newest checkpoint is " + ck +
                     "/step-00000020/manifest.json"),
            std::string::npos)
      << end;
  EXPECT_EQ(lines_of(dir.path() + "/listing"), std::vector<std::string>{"step-00000020"});
  const std::string console = text_of(out);
  // (whichever writer the disk failed first: each may, and the checkpoint is said to fail once)
  EXPECT_NE(console.find("checkpoint at step 40 failed: rank "), std::string::npos) << console;
  EXPECT_NE(console.find(": cannot write " + ck + "/step-00000040/block-0000"), std::string::npos)
      << console;
  EXPECT_EQ(console.find("checkpoint at step 40 failed"),
            console.rfind("checkpoint at step 40 failed"))
      << console;
  EXPECT_NE(console.find("No space left on device"), std::string::npos) << console;
  int written = 0, failed = 0;
  for (const auto& e : lines_of(run_dir + "/events.jsonl")) {
    written += json_field(e, "event") == "checkpoint_written";
    failed += json_field(e, "event") == "checkpoint_failed";
  }
  EXPECT_EQ(written, 1);
  EXPECT_EQ(failed, 2);
  EXPECT_EQ(committed_losses(run_dir).size(), 60u);
}

// Before training starts (an agent not joined yet), `troupe stop --checkpoint` is a stop after
// the first step with a checkpoint there, and `troupe checkpoint` is refused saying why; while the
// stop is under way, `troupe checkpoint` is refused as lr and scale are. (The stop was refused as
// "not running", and the job trained to its end; a checkpoint asked during a stop was accepted,
// then said to have failed.)
TEST(Checkpoints, AStopWithACheckpointBeforeTrainingStartsStopsAfterTheFirstStep) {
  TempDir dir;
  const std::string hold = dir.path() + "/hold-agent-1";
  std::ofstream(hold) << "";
  Job job = start_job(dir, "early", kGpt, 2, {"checkpoint.every_steps=0"},
                      {"TROUPE_TEST_JOIN_DELAY_AGENT=agent-1", "TROUPE_TEST_JOIN_DELAY_MS=120000",
                       "TROUPE_TEST_JOIN_DELAY_FILE=" + hold});
  ASSERT_NE(wait_event(job, is("member_joined"), 60s), "");
  std::string said = admin(dir, {"checkpoint", "--run-dir", job.run_dir, "--no-wait"}, 1);
  EXPECT_NE(said.find("the job has not started training: no step to checkpoint"), std::string::npos)
      << said;
  admin(dir, {"stop", "--run-dir", job.run_dir, "--checkpoint"});
  said = admin(dir, {"checkpoint", "--run-dir", job.run_dir, "--no-wait"}, 1);
  EXPECT_NE(said.find("the job is stopping, with a checkpoint where it stops"), std::string::npos)
      << said;
  EXPECT_EQ(count_events(job, "generation_started"), 0) << "it was not forming: the test is void";
  fs::remove(hold);
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "state"), "stopped") << end;
  EXPECT_EQ(json_field(end, "steps"), "1") << end;
  EXPECT_EQ(json_field(end, "resumable"), "true") << end;
  EXPECT_TRUE(fs::exists(job.run_dir + "/checkpoints/step-00000001/manifest.json"));
}

// A plain `troupe stop` before the first generation formed ends the job now, stopped at step 0,
// and says so: with the local launcher (one agent joined, one held back; checkpoint.every_steps
// makes a plain stop one with a checkpoint, nothing new to save here), and with agents started by
// hand, none yet (the answer went out before the coordinator's end). (It was acknowledged as a stop
// "after the current step": the job waited on, and trained a step when its agents came.)
TEST(Checkpoints, APlainStopBeforeTrainingStartsEndsTheJobNow) {
  // By the local launcher with an agent held back; by hand with none joined; the launcher's
  // again in a run started from another run's checkpoint (none of its own yet).
  for (int how : {0, 1, 2}) {
    TempDir dir;
    const bool by_hand = how == 1;
    std::string other;  // (the other run's checkpoint the third goes on from)
    if (how == 2) {
      Job before = start_job(dir, "before", kGpt, 1, {"job.steps=3", "checkpoint.every_steps=3"});
      ASSERT_TRUE(before.proc->wait(180s));
      other = before.run_dir + "/checkpoints/step-00000003";
      ASSERT_TRUE(fs::exists(other + "/manifest.json"));
    }
    const std::string hold = dir.path() + "/hold-agent-1";
    std::ofstream(hold) << "";
    const std::vector<std::string> held{"TROUPE_TEST_JOIN_DELAY_AGENT=agent-1",
                                        "TROUPE_TEST_JOIN_DELAY_MS=120000",
                                        "TROUPE_TEST_JOIN_DELAY_FILE=" + hold};
    Job job = by_hand         ? start_job(dir, "early", kGpt, 2, {"cluster.launcher=\"external\""})
              : other.empty() ? start_job(dir, "early", kGpt, 2, {}, held)
                              : start_job(dir, "early", kGpt, 2, {}, held, {"--resume", other});
    if (by_hand)
      ASSERT_NE(wait_event(job, is("job_started"), 60s), "");
    else
      ASSERT_NE(wait_event(job, is("member_joined"), 60s), "");
    const std::string said = admin(dir, {"stop", "--run-dir", job.run_dir});
    // (agent-1 may join within the half second before the end: no generation starts even so)
    if (!by_hand) fs::remove(hold);
    const std::string at = other.empty() ? "0" : "3";
    EXPECT_NE(said.find("the job stops now, at step " + at + ": no generation of it had formed"),
              std::string::npos)
        << how << ": " << said;
    auto st = job.proc->wait(60s);
    fs::remove(hold);
    ASSERT_TRUE(st) << "the job did not end";
    EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
    EXPECT_EQ(count_events(job, "generation_started"), 0);
    const std::string end = events_of(job).back();
    EXPECT_EQ(json_field(end, "event"), "job_finished") << end;
    EXPECT_EQ(json_field(end, "state"), "stopped") << end;
    EXPECT_EQ(json_field(end, "steps"), at) << end;
    EXPECT_NE(
        text_of(job.out).find("stopped at step " + at + " (troupe stop before the job formed a "),
        std::string::npos)
        << text_of(job.out);
    // (no step trained: no loss on its last line; it said "loss 0.0000")
    EXPECT_NE(text_of(job.out).find("stopped after " + at + " of "), std::string::npos)
        << text_of(job.out);
    EXPECT_EQ(text_of(job.out).find(", loss "), std::string::npos) << text_of(job.out);
    if (other.empty()) continue;
    // It goes on from the other run's checkpoint (it said nothing: this run has none of its
    // own), and the resume troupe status gives does so (--resume RUN_DIR: "no valid checkpoint").
    EXPECT_EQ(json_field(end, "resume_from"), other + "/manifest.json") << end;
    EXPECT_EQ(json_field(end, "resumable"), "true") << end;
    const std::string status = admin(dir, {"status", "--run-dir", job.run_dir});
    EXPECT_NE(status.find("goes on with: troupe run " + job.run_dir + "/config.toml --resume " +
                          job.run_dir + "\n"),
              std::string::npos)
        << status;
    Job again = start_job(dir, "early", kGpt, 1, {}, {}, {"--resume", job.run_dir});
    auto done = again.proc->wait(120s);
    ASSERT_TRUE(done) << "the resume did not end";
    EXPECT_EQ(WEXITSTATUS(*done), 0) << text_of(again.out);
    EXPECT_NE(text_of(again.out).find("it has no checkpoint of its own: it goes on from " + other),
              std::string::npos)
        << text_of(again.out);
    const std::string last = events_of(again).back();
    EXPECT_EQ(json_field(last, "state"), "completed") << last;
    EXPECT_EQ(json_field(last, "steps"), "120") << last;
  }
}

// On request: `troupe checkpoint` writes one at the next step boundary and says where, while
// training goes on; `troupe stop --checkpoint` writes one where it stops. No periodic ones, and
// each request is served once (all members vote on it at the same step boundary). The resume
// from the stop's checkpoint computes the same function.
TEST(Checkpoints, OnRequestTroupeCheckpointAndStopWithACheckpoint) {
  TempDir dir;
  Reference want = reference(dir, 120);
  // Paced so that both requests (a client process each, slow under a sanitizer) come well before
  // the end.
  Job job = start_job(dir, "asked", kGpt, 3, {"checkpoint.every_steps=0"}, {pace(100000)});
  wait_steps(job, 15);
  const std::string said = admin(dir, {"checkpoint", "--run-dir", job.run_dir});
  const size_t at = said.find("checkpoints/step-");
  ASSERT_NE(at, std::string::npos) << said;
  const int step = std::stoi(said.substr(at + 17, 8));
  EXPECT_GE(step, 16) << said;
  EXPECT_TRUE(
      fs::exists(job.run_dir + "/checkpoints/" + said.substr(at + 12, 13) + "/manifest.json"))
      << said;
  EXPECT_NE(text_of(dir.path() + "/admin.out").find("written"), std::string::npos);
  wait_steps(job, size_t(step) + 10);  // training went on
  admin(dir, {"stop", "--run-dir", job.run_dir, "--checkpoint"});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << last_line(job.out);
  const std::string end = events_of(job).back();
  EXPECT_EQ(json_field(end, "resumable"), "true") << end;
  const int stopped_at = std::stoi(json_field(end, "steps"));
  char stop_dir[32];
  std::snprintf(stop_dir, sizeof stop_dir, "step-%08d", stopped_at);
  EXPECT_EQ(checkpoint_dirs(job), (std::vector<std::string>{said.substr(at + 12, 13), stop_dir}));

  Job resumed =
      start_job(dir, "asked", kGpt, 1, {"checkpoint.every_steps=0"}, {}, {"--resume", job.run_dir});
  expect_same_function(resumed, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);
  EXPECT_EQ(resumed_from(resumed), stopped_at);

  // A plain stop (no checkpoint where it stops) names the newest one to go on from: it said
  // nothing, as if there were none.
  Job plain = start_job(dir, "plain", kGpt, 1, {"checkpoint.every_steps=0"}, {pace(100000)});
  wait_steps(plain, 5);
  const std::string asked = admin(dir, {"checkpoint", "--run-dir", plain.run_dir});
  wait_steps(plain, size_t(std::stoi(asked.substr(asked.find("checkpoints/step-") + 17, 8))) + 3);
  admin(dir, {"stop", "--run-dir", plain.run_dir});
  auto plain_st = plain.proc->wait(60s);
  ASSERT_TRUE(plain_st);
  EXPECT_EQ(WEXITSTATUS(*plain_st), 0);
  EXPECT_EQ(json_field(events_of(plain).back(), "resumable"), "false");
  EXPECT_NE(
      json_field(events_of(plain).back(), "resume_from").find(plain.run_dir + "/checkpoints/step-"),
      std::string::npos)
      << "the event does not say where a resume goes on from, as the console does";
  const std::string plain_out = text_of(plain.out);
  EXPECT_NE(plain_out.find("its newest checkpoint is " + plain.run_dir + "/checkpoints/step-"),
            std::string::npos)
      << plain_out;
  EXPECT_NE(plain_out.find("goes on from there (the steps after it again)"), std::string::npos)
      << plain_out;
}

// A pipelined job stopped early (no gather: each member holds its stage's blocks) ends as a stop
// does, exit 0 and resumable, in every record; the replicas of each stage agree, and a rank of
// no stage is not compared (dp 2 x pp 2, then dp 1 x pp 2 with a third worker of no stage).
TEST(Checkpoints, APipelineStoppedEarlyEndsResumableWithItsStagesCompared) {
  for (const int agents : {4, 3}) {
    TempDir dir;
    Job job = start_job(dir, "piped", kGpt, agents,
                        {"parallel.pipeline_stages=2", "checkpoint.every_steps=0"}, {pace(50000)});
    wait_steps(job, 10);
    // (Three workers in two stages: dp 1 x pp 2 and a rank that holds no stage.)
    const std::string status = admin(dir, {"status", "--run-dir", job.run_dir, "--json"});
    EXPECT_EQ(status.find(R"("state":"idle")") != std::string::npos, agents == 3) << status;
    admin(dir, {"stop", "--run-dir", job.run_dir, "--checkpoint"});
    auto st = job.proc->wait(60s);
    ASSERT_TRUE(st);
    EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
    const std::string end = events_of(job).back();
    EXPECT_EQ(json_field(end, "event"), "job_finished") << end;
    EXPECT_EQ(json_field(end, "state"), "stopped") << end;
    EXPECT_EQ(json_field(end, "resumable"), "true") << end;
    EXPECT_EQ(text_of(job.out).find("failed"), std::string::npos) << text_of(job.out);
  }
}

// Saved by one layout, resumed by another: the shards are per block, so each member reads the
// blocks it will own.
void reshard(const std::vector<std::string>& save, int save_agents,
             const std::vector<std::string>& load, int load_agents) {
  TempDir dir;
  Reference want = reference(dir, 120);
  std::vector<std::string> first = save;
  first.push_back("job.steps=60");
  Job saved = start_job(dir, "saved", kGpt, save_agents, first);
  ASSERT_TRUE(saved.proc->wait(120s));
  ASSERT_TRUE(fs::exists(saved.run_dir + "/checkpoints/step-00000060/manifest.json"));
  Job resumed = start_job(dir, "saved", kGpt, load_agents, load, {}, {"--resume", saved.run_dir});
  expect_same_function(resumed, want.losses, 120, kBatch, 0);
  EXPECT_EQ(final_checksum(resumed), want.checksum);
  EXPECT_EQ(resumed_from(resumed), 60);
}

TEST(Checkpoints, SavedByThreeWorkersInTwoStagesResumedByTwoInOne) {
  reshard({"parallel.pipeline_stages=2"}, 3, {"parallel.pipeline_stages=1"}, 2);
}

TEST(Checkpoints, SavedByTwoDataParallelWorkersResumedByTwoStages) {
  reshard({}, 2, {"parallel.pipeline_stages=2"}, 2);
}

void flip_a_byte(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(200);
  char c = 0;
  f.get(c);
  f.seekp(200);
  f.put(char(c ^ 0x10));
}

// Runs `troupe run --resume` expecting exit 2; returns what it said.
std::string refused_resume(const TempDir& dir, const std::string& run_dir,
                           std::vector<std::string> sets) {
  Job j = start_job(dir, "refused", kGpt, 1, sets, {}, {"--resume", run_dir});
  auto st = j.proc->wait(30s);
  EXPECT_TRUE(st && WEXITSTATUS(*st) == 2) << last_line(j.out);
  return testing::text_of(j.out);
}

// A checkpoint knows its data by the content, not by the path's text: the same text named by
// another path (a copy elsewhere, a path relative to another directory: the run's config.toml
// names it absolute) resumes; another text at
// the path it was trained on is refused naming the data (it resumed; the other way, the same file
// named otherwise was "another data").
TEST(Checkpoints, AResumeKnowsTheDataByItsContentNotItsPath) {
  TempDir dir;
  const std::string text = dir.path() + "/a.txt", moved = dir.path() + "/moved/b.txt";
  fs::copy_file("/usr/share/common-licenses/GPL-3", text);
  const std::string relative = fs::relative(text).string();  // (from the jobs' directory)
  Job saved = start_job(dir, "by-content", kGpt, 1, {"job.steps=20", "data.path=" + relative});
  ASSERT_TRUE(saved.proc->wait(120s));
  // Its config.toml names the data absolute: resumed from another directory, the same data.
  const std::string effective = text_of(saved.run_dir + "/config.toml");
  EXPECT_NE(effective.find("path = '" + text + "'"), std::string::npos) << effective;
  fs::create_directories(dir.path() + "/moved");
  fs::copy_file(text, moved);
  Job again = start_job(dir, "by-content-moved", kGpt, 1, {"job.steps=30", "data.path=" + moved},
                        {}, {"--resume", saved.run_dir});
  auto st = again.proc->wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(again.out);
  EXPECT_NE(wait_event(saved, is("resumed_from_checkpoint", "step", "20"), 1s), "");  // (its run)

  fs::remove(text);
  fs::copy_file("/usr/share/common-licenses/GPL-2", text);
  const std::string out = refused_resume(dir, saved.run_dir, {"job.steps=30", "data.path=" + text});
  EXPECT_NE(out.find("belongs to another model, data or seed (data_digest: "), std::string::npos)
      << out;
}

TEST(Checkpoints, BadCheckpointsAreRefusedNamingTheFileAndTheNewestValidOneIsUsed) {
  TempDir dir;
  Reference want = reference(dir, 80);
  Job saved = start_job(dir, "bad", kGpt, 2, {"job.steps=60"});
  ASSERT_TRUE(saved.proc->wait(120s));
  const std::string ckpt = saved.run_dir + "/checkpoints";
  ASSERT_TRUE(fs::exists(ckpt + "/step-00000060/manifest.json"));

  // A flipped byte in the newest: refused, the one before is used, and the job ends as if it
  // had never stopped (a copy of the run: the cases below use the original).
  const std::string copy = dir.path() + "/bad-copy";
  fs::copy(saved.run_dir, copy, fs::copy_options::recursive);
  fs::remove(copy + "/run.lock");
  flip_a_byte(copy + "/checkpoints/step-00000060/block-00001.trpblk");
  Job resumed = start_job(dir, "bad-copy", kGpt, 2, {"job.steps=80"}, {}, {"--resume", copy});
  expect_same_function(resumed, want.losses, 80, kBatch, 0);
  EXPECT_EQ(resumed_from(resumed), 40);
  EXPECT_NE(
      text_of(resumed.out).find("step-00000060/block-00001.trpblk does not match its checksum"),
      std::string::npos)
      << text_of(resumed.out);

  // A run that did not end (its job_finished line gone) whose events lost a generation's size:
  // no take-over that would commit steps on one rank's report; exit 2 naming it.
  const std::string cut = dir.path() + "/bad-cut";
  fs::copy(saved.run_dir, cut, fs::copy_options::recursive);
  fs::remove(cut + "/run.lock");
  std::string events;
  for (std::string line : lines_of(cut + "/events.jsonl")) {
    if (line.find("\"job_finished\"") != std::string::npos) continue;
    const size_t at = line.find("\"world_size\":");
    if (line.find("\"generation_started\"") != std::string::npos && at != std::string::npos)
      line.replace(at, 13, "\"size_was\":");
    events += line + "\n";
  }
  std::ofstream(cut + "/events.jsonl", std::ios::trunc) << events;
  std::string took = refused_resume(dir, cut, {"job.steps=80"});
  EXPECT_NE(took.find("started without a world size"), std::string::npos) << took;

  // A manifest edited to list one block fewer (its last shard, then never checked): refused
  // before anything starts, naming both counts (the model's blocks are counted without its
  // text's vocabulary; the job failed once its workers said, and the end's advice named the
  // same checkpoint again).
  const std::string fewer = dir.path() + "/bad-fewer";
  fs::copy(ckpt + "/step-00000060", fewer, fs::copy_options::recursive);
  {
    std::ifstream in(fewer + "/manifest.json");
    nlohmann::json m = nlohmann::json::parse(in);
    m["shards"].erase(m["shards"].size() - 1);
    m["blocks"] = m["blocks"].get<int>() - 1;
    std::ofstream(fewer + "/manifest.json", std::ios::trunc) << m.dump(1);
  }
  Job short_one = start_job(dir, "fewer", kGpt, 1, {"job.steps=80"}, {}, {"--resume", fewer});
  auto fst = short_one.proc->wait(60s);
  ASSERT_TRUE(fst);
  EXPECT_EQ(WEXITSTATUS(*fst), 2) << text_of(short_one.out);
  EXPECT_NE(text_of(short_one.out).find("blocks of the model, which has"), std::string::npos)
      << text_of(short_one.out);
  // The same as a run directory's newest: skipped, and the one before is used.
  const std::string fewer_run = dir.path() + "/bad-fewer-run";
  fs::copy(saved.run_dir, fewer_run, fs::copy_options::recursive);
  fs::remove(fewer_run + "/run.lock");
  fs::copy_file(fewer + "/manifest.json", fewer_run + "/checkpoints/step-00000060/manifest.json",
                fs::copy_options::overwrite_existing);
  Job skipped =
      start_job(dir, "bad-fewer-run", kGpt, 1, {"job.steps=80"}, {}, {"--resume", fewer_run});
  auto sst = skipped.proc->wait(60s);
  ASSERT_TRUE(sst);
  EXPECT_EQ(WEXITSTATUS(*sst), 0) << text_of(skipped.out);
  EXPECT_EQ(resumed_from(skipped), 40) << text_of(skipped.out);

  // Another model, data or seed: every checkpoint refused, exit 2.
  std::string out = refused_resume(dir, saved.run_dir, {"job.seed=99", "job.steps=80"});
  EXPECT_NE(out.find("belongs to another model, data or seed (seed: 3 in the checkpoint, 99 now; "),
            std::string::npos)
      << out;
  // (and the run's own config is named: it resumes it)
  EXPECT_NE(out.find("is of this config's model, data and seed; the run's own config resumes it: "
                     "troupe run " +
                     saved.run_dir + "/config.toml --resume " + saved.run_dir),
            std::string::npos)
      << out;

  // The newest cut short by a crash before its manifest, the next with a truncated shard, the
  // oldest with a flipped byte: nothing valid is left, each named.
  fs::remove(ckpt + "/step-00000060/manifest.json");
  fs::resize_file(ckpt + "/step-00000040/block-00002.trpblk", 100);
  flip_a_byte(ckpt + "/step-00000020/block-00000.trpblk");
  out = refused_resume(dir, saved.run_dir, {"job.steps=80"});
  EXPECT_NE(out.find("step-00000060: no manifest"), std::string::npos) << out;
  EXPECT_NE(out.find("step-00000040/block-00002.trpblk has 100 bytes"), std::string::npos) << out;
  EXPECT_NE(out.find("step-00000020/block-00000.trpblk does not match its checksum"),
            std::string::npos)
      << out;
}

// `troupe export` into the PyTorch twin: the same weights give the same function. Troupe's loss
// on step 40's batch with the checkpoint of step 40 is step 40's loss in events.jsonl.
TEST(Checkpoints, AnExportComputesTheSameLossInPyTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' 2>/dev/null") != 0)
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  TempDir dir;
  for (const bool tied : {false, true}) {  // (tied: no head.weight; the metadata says to tie it)
    const std::string name = tied ? "exported-tied" : "exported";
    Job job = start_job(dir, name, kGpt, 2,
                        {"job.steps=60", "parallel.deterministic=false",
                         std::string("model.tied_head=") + (tied ? "true" : "false")});
    ASSERT_TRUE(job.proc->wait(120s));
    const std::string model = dir.path() + "/" + name + ".safetensors";
    admin(dir, {"export", job.run_dir, "--step", "40", "-o", model, "--batch-of-step", "40"});
    const std::string out = dir.path() + "/" + name + "-torch.out";
    coordinator::ChildProcess py(
        {{"/usr/bin/python3", std::string(TROUPE_SOURCE_DIR) + "/bench/peers/torch_check_export.py",
          model, model + ".batch.safetensors"},
         out,
         out,
         {}});
    auto st = py.wait(120s);
    ASSERT_TRUE(st && WEXITSTATUS(*st) == 0) << text_of(out);
    const double torch_loss = std::stod(json_field(last_line(out), "loss"));
    double troupe_loss = -1;
    for (const auto& e : events_of(job))
      if (is("step_committed", "step", "40")(e)) troupe_loss = std::stod(json_field(e, "loss"));
    ASSERT_GT(troupe_loss, 0);
    EXPECT_NEAR(torch_loss, troupe_loss, 1e-5 * troupe_loss) << name;
    std::printf("%s: step 40 loss: troupe %.9f, pytorch %.9f\n", name.c_str(), troupe_loss,
                torch_loss);
  }
}

}  // namespace
}  // namespace troupe
