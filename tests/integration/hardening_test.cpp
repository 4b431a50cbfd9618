// A job's run directory, signals and full disks, as a user meets them: a second job on the same
// directory, a finished directory reused, Ctrl-C (once and twice), SIGTERM to an agent, and the
// file-size limit of a full disk. Real `troupe` processes.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "coordinator/step_driver.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using namespace testing;
namespace fs = std::filesystem;

const char* kConfig = R"([job]
name = "hardening"
seed = 3
steps = 400
[model]
kind = "mlp"
inputs = 32
hidden = [32]
classes = 4
[data]
kind = "synthetic"
samples = 1024
[batch]
global = 16
micro = 8
[optimizer]
kind = "sgd"
lr = 0.05
)";

bool alive(int pid) { return pid > 0 && ::kill(pid, 0) == 0; }

// Every line of a JSON-lines file is a whole object.
void expect_whole_lines(const std::string& path) {
  std::ifstream in(path);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.empty()) return;
  EXPECT_EQ(all.back(), '\n') << path << " ends with a partial line";
  for (auto& l : lines_of(path))
    EXPECT_TRUE(!l.empty() && l.front() == '{' && l.back() == '}') << path << ": " << l;
}

TEST(RunDirectory, ASecondJobOnTheSameDirectoryIsRefusedWithTheFirstsName) {
  TempDir dir;
  Job first = start_job(dir, "shared", kConfig, 1, {"job.steps=100000"}, {pace(20000)});
  wait_steps(first, 2);
  // The same job.run_dir again: refused before anything starts, naming the job that owns it.
  Job second = start_job(dir, "shared", kConfig, 1, {"job.name=\"intruder\""});
  auto st = second.proc->wait(30s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  const std::string out = text_of(second.out);
  EXPECT_NE(out.find("is in use by another job (job 'hardening', pid"), std::string::npos) << out;
  // A resume of it while it runs (two resumes at once): refused, and not told to choose another
  // run directory (a new run there would start afresh).
  Job resume =
      start_job(dir, "shared", kConfig, 1, {"job.steps=100000"}, {}, {"--resume", first.run_dir});
  auto rst = resume.proc->wait(30s);
  ASSERT_TRUE(rst);
  EXPECT_EQ(WEXITSTATUS(*rst), 2);
  const std::string rout = text_of(resume.out);
  EXPECT_NE(rout.find("is in use by another job (job 'hardening', pid"), std::string::npos) << rout;
  EXPECT_NE(rout.find("; it goes on there: troupe status --run-dir " + first.run_dir),
            std::string::npos)
      << rout;
  // The first job's files are untouched: still its token, its address, only its events.
  EXPECT_EQ(count_events(first, "job_started"), 1);
  admin(dir, {"stop", "--run-dir", first.run_dir});
  auto st1 = first.proc->wait(60s);
  ASSERT_TRUE(st1);
  EXPECT_EQ(WEXITSTATUS(*st1), 0) << text_of(first.out);
}

TEST(RunDirectory, AFinishedJobsDirectoryIsNotAppendedTo) {
  TempDir dir;
  Job done = start_job(dir, "once", kConfig, 1, {"job.steps=5"});
  auto st = done.proc->wait(60s);
  ASSERT_TRUE(st);
  ASSERT_EQ(WEXITSTATUS(*st), 0);
  const size_t events = events_of(done).size();
  Job again = start_job(dir, "once", kConfig, 1, {"job.steps=5"});
  auto st2 = again.proc->wait(30s);
  ASSERT_TRUE(st2);
  EXPECT_EQ(WEXITSTATUS(*st2), 2);
  EXPECT_NE(text_of(again.out).find("already holds a job's logs"), std::string::npos)
      << text_of(again.out);
  // (and how that run goes on instead)
  EXPECT_NE(text_of(again.out).find("or go on with that run: troupe run " + done.run_dir +
                                    "/config.toml --resume " + done.run_dir),
            std::string::npos)
      << text_of(again.out);
  EXPECT_EQ(events_of(done).size(), events) << "the finished run's events changed";
}

// `troupe ARGS` within 30 s: its exit code (-1: it hung) and what it printed.
std::pair<int, std::string> run_for(const TempDir& dir, std::vector<std::string> args) {
  static int n = 0;
  const std::string out = dir.path() + "/cmd-" + std::to_string(n++) + ".out";
  args.insert(args.begin(), troupe_binary());
  coordinator::ChildProcess p({args, out, out, {}});
  auto st = p.wait(30s);
  return {st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1, text_of(out)};
}

// Files of a run, a checkpoint or a data set that are not files (a FIFO, whose read blocks
// forever; a directory, whose read threw a library error) are named or passed over, never waited
// on; so is a token file that is a device (it grew the memory without end); an empty --resume (an
// unset shell variable) is no new run, and a checkpoint's learning rate out of range is not taken.
TEST(RunDirectory, FilesThatAreNotFilesAreNamedNeverWaitedOn) {
  TempDir dir;
  Job done = start_job(dir, "ckpt", kConfig, 1, {"job.steps=10", "checkpoint.every_steps=5"});
  ASSERT_TRUE(done.proc->wait(60s));
  const std::string ck = done.run_dir + "/checkpoints/";
  const std::string model = dir.path() + "/m.safetensors";
  // Step 10's manifest a directory, then its shard a FIFO: passed over for step 5.
  fs::rename(ck + "step-00000010/manifest.json", dir.path() + "/manifest.json");
  fs::create_directories(ck + "step-00000010/manifest.json");
  auto [rc, said] = run_for(dir, {"export", done.run_dir, "-o", model});
  EXPECT_EQ(rc, 0) << said;
  EXPECT_NE(said.find("its manifest.json is not a regular file"), std::string::npos) << said;
  EXPECT_NE(said.find("step 5 of"), std::string::npos) << said;
  fs::remove(ck + "step-00000010/manifest.json");
  fs::rename(dir.path() + "/manifest.json", ck + "step-00000010/manifest.json");
  fs::remove(ck + "step-00000010/block-00000.trpblk");
  ASSERT_EQ(::mkfifo((ck + "step-00000010/block-00000.trpblk").c_str(), 0600), 0);
  std::tie(rc, said) = run_for(dir, {"export", done.run_dir, "-o", model});
  EXPECT_EQ(rc, 0) << said;
  EXPECT_NE(said.find("block-00000.trpblk is not a regular file"), std::string::npos) << said;
  // A learning rate out of range in step 5's manifest: not taken (it diverged the resume).
  std::string m = text_of(ck + "step-00000005/manifest.json");
  const size_t at = m.find("\"lr\"");
  ASSERT_NE(at, std::string::npos) << m;
  m.replace(at, m.find_first_of(",}\n", at) - at, "\"lr\": 1e300");
  std::ofstream(ck + "step-00000005/manifest.json") << m;
  std::tie(rc, said) = run_for(dir, {"export", done.run_dir, "-o", model, "--step", "5"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("optimizer.lr 1e+300 is outside [1e-12, 1000]"), std::string::npos) << said;
  // The run's events and its address FIFOs: status answers.
  const std::string run = dir.path() + "/fifo-run";
  fs::create_directories(run);
  ASSERT_EQ(::mkfifo((run + "/events.jsonl").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((run + "/coordinator.addr").c_str(), 0600), 0);
  std::tie(rc, said) = run_for(dir, {"status", "--run-dir", run});
  EXPECT_NE(rc, -1) << "troupe status hung on a FIFO";
  EXPECT_NE(rc, 0) << said;
  std::tie(rc, said) =
      run_for(dir, {"agent", "--join", "127.0.0.1:1", "--token-file", "/dev/zero"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("the token file '/dev/zero' is not a regular file"), std::string::npos)
      << said;
  std::tie(rc, said) = run_for(dir, {"run", "/nonexistent.toml", "--resume", ""});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("--resume names no run directory or checkpoint"), std::string::npos) << said;
}

// An export or a report written over the run's own files (its config, its events, a checkpoint's
// shard: they were replaced, exit 0) or onto a directory is refused, the run untouched; a report
// of a log that holds no job is refused (it reported "running, 0 steps").
TEST(RunDirectory, AnExportOrAReportNeverOverwritesTheRunsOwnFiles) {
  TempDir dir;
  const std::string text = dir.path() + "/corpus.txt";  // (its data: a text file)
  std::ofstream(text) << "some text to train on, some text to train on\n";
  Job done = start_job(dir, "own",
                       "[job]\nsteps = 5\n[model]\nkind = \"gpt\"\nlayers = 1\nd_model = 16\n"
                       "heads = 2\ncontext = 8\n[data]\nkind = \"text\"\npath = \"" +
                           text + "\"\n[batch]\nglobal = 4\nmicro = 4\n",
                       1);
  ASSERT_TRUE(done.proc->wait(60s));
  const std::string config = text_of(done.run_dir + "/config.toml");
  const size_t events = events_of(done).size();
  const std::string shard = done.run_dir + "/checkpoints/step-00000005/block-00000.trpblk";
  const std::string bytes = text_of(shard);
  for (const auto& [args, why] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"export", done.run_dir, "-o", done.run_dir + "/config.toml"},
            "is the run's own config.toml"},
           {{"export", done.run_dir, "-o", shard}, "is inside the run's checkpoints"},
           {{"export", done.run_dir, "-o", dir.path()}, "is a directory"},
           {{"export", done.run_dir, "-o", text}, "is the run's data (" + text + ")"},
           {{"report", done.run_dir, "-o", done.run_dir + "/events.jsonl"},
            "is the run's own events.jsonl"},
           {{"report", done.run_dir, "-o", dir.path()}, "is a directory"},
           {{"report", done.run_dir, "-o", dir.path() + "/absent/r.html"},
            "-o " + dir.path() + "/absent/r.html: " + dir.path() + "/absent is not a directory"},
           // (the run first: it was named as -o's directory)
           {{"report", dir.path() + "/absent"},
            dir.path() + "/absent/events.jsonl cannot be read: not a run directory"}}) {
    auto [rc, said] = run_for(dir, args);
    EXPECT_EQ(rc, 2) << said;
    EXPECT_NE(said.find(why), std::string::npos) << said;
  }
  EXPECT_EQ(text_of(done.run_dir + "/config.toml"), config);
  EXPECT_EQ(events_of(done).size(), events);
  EXPECT_EQ(text_of(shard), bytes);
  const std::string garbage = dir.path() + "/garbage";
  fs::create_directories(garbage);
  std::ofstream(garbage + "/events.jsonl") << "not an event\n";
  auto [rc, said] = run_for(dir, {"report", garbage});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("holds no job_started event"), std::string::npos) << said;
}

// The job stops within 60 s, exit 0, its last event a stop resumable from a checkpoint.
void expect_stopped_resumable(const Job& job) {
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st) << "the job did not stop";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  auto events = events_of(job);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(json_field(events.back(), "state"), "stopped") << events.back();
  EXPECT_EQ(json_field(events.back(), "resumable"), "true") << events.back();
  EXPECT_NE(json_field(events.back(), "checkpoint"), "") << events.back();
}

// Ctrl-C: the job stops at the next step boundary with a checkpoint there, writes its final event
// (job_finished, state stopped, identical parameters, resumable), prints its final line, ends
// every agent, and exits 0 (resumable; 130 only when no checkpoint could be written).
TEST(Signals, SigintStopsTheJobAtAStepBoundaryWithAFinalEventAndLine) {
  TempDir dir;
  Job job = start_job(dir, "sigint", kConfig, 2, {}, {pace(5000)});
  wait_steps(job, 5);
  const int a0 = pid_of(job, "agent-0"), a1 = pid_of(job, "agent-1");
  ASSERT_GT(a0, 0);
  ASSERT_GT(a1, 0);
  ASSERT_TRUE(job.proc->signal(SIGINT));
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st) << "the job did not stop";
  EXPECT_TRUE(WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  auto events = events_of(job);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(json_field(events.back(), "event"), "job_finished") << events.back();
  EXPECT_EQ(json_field(events.back(), "state"), "stopped") << events.back();
  EXPECT_EQ(json_field(events.back(), "resumable"), "true") << events.back();
  EXPECT_EQ(json_field(events.back(), "identical_parameters"), "true") << events.back();
  EXPECT_EQ(count_events(job, "interrupted"), 1);
  const std::string out = text_of(job.out);
  EXPECT_NE(out.find("SIGINT: stopping after the current step"), std::string::npos) << out;
  EXPECT_NE(out.find("job 'hardening' stopped after"), std::string::npos) << out;
  EXPECT_NE(out.find("resumable from"), std::string::npos) << out;
  EXPECT_FALSE(alive(a0));
  EXPECT_FALSE(alive(a1));
}

// `timeout 60 troupe run ...` delivers its SIGTERM twice at once (to troupe and to its group):
// one request, the same stop at a step boundary, resumable.
// troupe run's console closed under it (piped to head): the job goes on to its end and says so
// in its events. (SIGPIPE ended it at its next line, with no event, its agents orphaned.)
TEST(Signals, AClosedConsoleDoesNotEndTheJob) {
  TempDir dir;
  const std::string config = dir.path() + "/piped.toml", run_dir = dir.path() + "/piped";
  std::ofstream(config) << kConfig;
  coordinator::ChildProcess sh(
      {{"/bin/sh", "-c", "\"$0\" \"$@\" | head -n 1 > /dev/null", troupe_binary(), "run", config,
        "--set", "job.run_dir=\"" + run_dir + "\"", "--set", "cluster.agents=2", "--set",
        "job.steps=80"},
       dir.path() + "/sh.out",
       dir.path() + "/sh.out",
       {pace(20000)}});
  ASSERT_TRUE(sh.wait(120s)) << "the job did not end";
  const auto events = lines_of(run_dir + "/events.jsonl");
  ASSERT_FALSE(events.empty()) << text_of(dir.path() + "/sh.out");
  EXPECT_EQ(json_field(events.back(), "event"), "job_finished") << events.back();
}

TEST(Signals, ASigtermDeliveredTwiceAtOnceIsOneStop) {
  TempDir dir;
  Job job = start_job(dir, "twice-at-once", kConfig, 1, {}, {pace(5000)});
  wait_steps(job, 3);
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  expect_stopped_resumable(job);
  EXPECT_EQ(count_events(job, "interrupted"), 1);
  EXPECT_EQ(text_of(job.out).find("stopping at once"), std::string::npos) << text_of(job.out);
}

// A second Ctrl-C does not wait for the step: the job fails at once, naming the signal.
TEST(Signals, ASecondSigintStopsAtOnce) {
  TempDir dir;
  // Steps of 3 s: the first SIGINT's step boundary is far away.
  Job job = start_job(dir, "twice", kConfig, 1, {}, {pace(3000000)});
  wait_steps(job, 1);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(job.proc->signal(SIGINT));
  ASSERT_FALSE(wait_event(job, is("interrupted", "count", "1"), 10s).empty());
  std::this_thread::sleep_for(300ms);  // (a repeat within 200 ms is the same request)
  ASSERT_TRUE(job.proc->signal(SIGINT));
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 130);
  auto events = events_of(job);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(json_field(events.back(), "event"), "job_failed") << events.back();
  EXPECT_NE(events.back().find("interrupted by SIGINT again"), std::string::npos);
  EXPECT_EQ(committed_losses(job.run_dir).size(), 1u) << "it waited for the step";
  EXPECT_FALSE(alive(pid_of(job, "agent-0"))) << "the agent was left running";
  std::printf("second SIGINT -> exit after %.2f s (a step takes 3 s)\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// SIGTERM to an agent is a leave: it is drained at the next step boundary and exits 0 (the local
// launcher does not restart it); the job goes on with the others and computes the same function.
TEST(Signals, SigtermToAnAgentDrainsIt) {
  TempDir dir;
  Job job = start_job(dir, "sigterm", kConfig, 3, {"job.steps=300"}, {pace(3000)});
  wait_steps(job, 10);
  const int victim = pid_of(job, "agent-2");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGTERM), 0);
  auto left = wait_event(job, is("member_left", "reason", "drained"), 60s);
  ASSERT_FALSE(left.empty()) << "the agent was not drained";
  EXPECT_EQ(count_events(job, "member_failed"), 0);
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
  EXPECT_EQ(count_events(job, "agent_restarted"), 0) << "a drained agent is not restarted";
  auto events = events_of(job);
  EXPECT_EQ(json_field(events.back(), "identical_parameters"), "true") << events.back();
  EXPECT_FALSE(alive(victim));
  const std::string log = text_of(job.run_dir + "/agent-2.log");
  EXPECT_NE(log.find("SIGTERM: asking the coordinator to drain this agent"), std::string::npos)
      << log;
  // (a drained agent's exit is no loss: the coordinator warns of nothing)
  const std::string coordinator = text_of(job.run_dir + "/coordinator.log");
  EXPECT_EQ(coordinator.find("[warning] control plane"), std::string::npos) << coordinator;
}

// Once the agents `names`, sent SIGTERM, have asked for their drains (and heard the answers),
// the coordinator's own SIGTERM: the job stops resumable, nothing rolled back, those agents gone.
void preempt_after_drains(const Job& job, const std::vector<std::string>& names) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  auto asked = [&](const std::string& name) {
    return text_of(job.run_dir + "/" + name + ".log").find("asking the coordinator to drain") !=
           std::string::npos;
  };
  while (!std::all_of(names.begin(), names.end(), asked) &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(10ms);
  std::this_thread::sleep_for(300ms);  // (the drains answered)
  ASSERT_EQ(::kill(job.proc->pid(), SIGTERM), 0);
  expect_stopped_resumable(job);
  EXPECT_EQ(count_events(job, "steps_rolled_back"), 0);
  for (const auto& name : names) EXPECT_FALSE(alive(pid_of(job, name))) << name;
}

// A preemption (Slurm's scancel, systemctl stop) signals the coordinator and every agent at once.
// Here the agents' drains come first (the worst order: one is drained, the other refused below
// min_workers), then the coordinator's own signal: the job stops at one step boundary with a
// checkpoint there (without periodic ones: nothing else to go on from), nothing rolled back, no
// agent restarted, resumable. (The refused agent left at once with 143: the stop's checkpoint
// lacked its shards, its restarted self rolled the job back to the seed.)
TEST(Signals, APreemptionSignallingTheCoordinatorAndEveryAgentAtOnceStopsWithACheckpoint) {
  TempDir dir;
  Job job = start_job(dir, "preempted", kConfig, 2, {"checkpoint.every_steps=0"}, {pace(20000)});
  wait_steps(job, 10);
  const int a0 = pid_of(job, "agent-0"), a1 = pid_of(job, "agent-1");
  ASSERT_EQ(::kill(a0, SIGTERM), 0);
  ASSERT_EQ(::kill(a1, SIGTERM), 0);
  preempt_after_drains(job, {"agent-0", "agent-1"});
  EXPECT_GE(count_events(job, "checkpoint_written"), 1);
  EXPECT_EQ(count_events(job, "agent_restarted"), 0);
}

// The same preemption with a change under way for longer than a refused agent's grace: the
// drained agent leaves at the end of a long step, and the coordinator holds its stop back until
// the next generation starts. The refused agent waits for the change and then the stop, and the
// job stops resumable. (It waited 5 s from its refusal and left with 143: the stop's checkpoint
// lacked its shards.)
TEST(Signals, APreemptionDuringALongChangeStillStopsWithACheckpoint) {
  TempDir dir;
  Job job = start_job(dir, "preempted-slow", kConfig, 2, {"checkpoint.every_steps=0"},
                      {pace(8000000)});  // (steps of 8 s: the change ends with one)
  wait_steps(job, 1);
  const int a0 = pid_of(job, "agent-0"), a1 = pid_of(job, "agent-1");
  ASSERT_EQ(::kill(a1, SIGTERM), 0);
  ASSERT_NE(wait_event(job, is("drain_requested"), 10s), "") << "agent-1's drain was not taken";
  ASSERT_EQ(::kill(a0, SIGTERM), 0);
  preempt_after_drains(job, {"agent-0", "agent-1"});  // (agent-0's refused: the last)
  EXPECT_EQ(count_events(job, "member_failed"), 0);
}

// troupe stop, then SIGTERM before the step ends: the job stops there with the checkpoint the
// signal asks for (its stop was already sent, without one: it ended not resumable; so did troupe
// stop --checkpoint after a plain stop, which said "with a checkpoint there").
TEST(Signals, AStopWithACheckpointAfterAPlainStopStillTakesIt) {
  TempDir dir;
  Job job = start_job(dir, "stop-twice", kConfig, 1, {"checkpoint.every_steps=0"},
                      {pace(8000000)});  // (steps of 8 s: both stops come within one)
  wait_steps(job, 1);
  admin(dir, {"stop", "--run-dir", job.run_dir});
  ASSERT_TRUE(job.proc->signal(SIGTERM));
  expect_stopped_resumable(job);
}

// SIGTERM while the job is paused below elastic.min_workers: the survivor, which holds the whole
// state, forms a generation of its own that stops with a checkpoint: resumable, exit 0. (It
// waited for elastic.rejoin_timeout_ms and failed, the state lost with the survivor.)
TEST(Signals, ASigtermWhilePausedStopsWithTheSurvivorsCheckpoint) {
  TempDir dir;
  Job job = start_job(dir, "paused-stop", kConfig, 2,
                      {"elastic.min_workers=2", "elastic.max_restarts=0",
                       "elastic.rejoin_timeout_ms=120000", "checkpoint.every_steps=0"},
                      {pace(5000)});
  wait_steps(job, 10);
  ASSERT_EQ(::kill(pid_of(job, "agent-1"), SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("job_paused"), 30s), "");
  ASSERT_TRUE(job.proc->signal(SIGTERM));
  expect_stopped_resumable(job);
}

// A full disk (a 64 KiB tmpfs for the run directory, in a mount namespace of the test's own): the
// job fails naming the file, never reports success, and no JSON-lines file ends mid-line.
TEST(RunLogs, AFullDiskFailsTheJobNamingTheFileWithoutPartialLines) {
  TempDir dir;
  const std::string config = dir.path() + "/full.toml";
  std::ofstream(config) << kConfig;
  const std::string disk = dir.path() + "/disk", run_dir = disk + "/full";
  const std::string out = dir.path() + "/full.out";
  std::filesystem::create_directories(disk);
  const std::string copy = dir.path() + "/copy";
  // (The tmpfs goes with the namespace: the script copies what was written out of it.)
  const std::string script = "mount -t tmpfs -o size=64k tmpfs '" + disk + "' || exit 77; '" +
                             troupe_binary() + "' run '" + config + "' --set 'job.run_dir=\"" +
                             run_dir +
                             "\"' --set job.steps=100000 --set cluster.agents=1; rc=$?; cp -r '" +
                             run_dir + "' '" + copy + "'; exit $rc";
  coordinator::ChildProcess p({{"/usr/bin/unshare", "-m", "/bin/sh", "-c", script}, out, out, {}});
  auto st = p.wait(120s);
  ASSERT_TRUE(st) << "the job did not end";
  ASSERT_TRUE(WIFEXITED(*st));
  if (WEXITSTATUS(*st) == 77 || (WEXITSTATUS(*st) == 1 && text_of(out).find("unshare") == 0))
    GTEST_SKIP() << "no mount namespace here (needs CAP_SYS_ADMIN): " << text_of(out);
  EXPECT_EQ(WEXITSTATUS(*st), 1) << text_of(out);
  const std::string text = text_of(out);
  EXPECT_NE(text.find("cannot write " + run_dir + "/"), std::string::npos) << text;
  EXPECT_NE(text.find(".jsonl: No space left on device"), std::string::npos) << text;
  EXPECT_NE(text.find("failed after"), std::string::npos) << "no final line: " << text;
  expect_whole_lines(copy + "/events.jsonl");
  expect_whole_lines(copy + "/metrics.jsonl");
  EXPECT_GT(lines_of(copy + "/metrics.jsonl").size(), 10u) << "the disk was full from the start";
}

std::string troupe_output(const TempDir& dir, std::vector<std::string> args, int* rc = nullptr) {
  const std::string out = dir.path() + "/cmd.out";
  std::remove(out.c_str());
  args.insert(args.begin(), troupe_binary());
  coordinator::ChildProcess p({args, out, out, {}});
  auto st = p.wait(30s);
  if (rc) *rc = st && WIFEXITED(*st) ? WEXITSTATUS(*st) : -1;
  return text_of(out);
}

// A step report or a worker's end from a rank outside the generation (no generation yet, a
// worker's bug, another version) counts for nothing: no step commits on it, no job ends on it.
// (No processes: the coordinator's step driver alone.)
TEST(StepDriver, RanksOutsideTheGenerationCountForNothing) {
  TempDir dir;
  coordinator::RunLog log(dir.path(), false);
  coordinator::JobConfig cfg;
  int commits = 0;
  coordinator::StepDriver steps(log, cfg, [&](const coordinator::StepCommitted&) { ++commits; });
  actors::StepReport r;
  r.generation = 1;
  r.rank = 7;  // in a world of 2
  EXPECT_FALSE(steps.report(r, 1, 2));
  r.rank = 0;
  EXPECT_FALSE(steps.report(r, 1, 2));  // (rank 1 has not reported)
  EXPECT_FALSE(steps.report(r, 0, 0));  // no generation yet: a world of 0
  EXPECT_EQ(commits, 0);
  r.rank = 1;
  EXPECT_TRUE(steps.report(r, 1, 2));
  EXPECT_EQ(commits, 1);
  EXPECT_FALSE(steps.done({5, 1, 1, 42}, 2));
  EXPECT_FALSE(steps.done({0, 0, 0, 42}, 0));  // a world of 0: the job is not done
  EXPECT_FALSE(steps.done({0, 1, 1, 42}, 2));
  EXPECT_TRUE(steps.done({1, 1, 1, 42}, 2));
}

// A coordinator killed after writing step 1's ledger lines and before its step_committed event:
// the one taking the run over (committed 1, from the events) drops those lines, and the agents'
// reports sent again commit step 1 once, each rank's line once in the ledger.
TEST(StepDriver, ATakeOverCommitsAStepTheLostCoordinatorWroteToTheLedgerOnce) {
  TempDir dir;
  coordinator::JobConfig cfg;
  cfg.ledger = true;
  cfg.global_batch = 4;
  auto report = [](uint64_t step, uint32_t rank) {
    actors::StepReport r;
    r.generation = 1;
    r.step = step;
    r.rank = rank;
    r.position_begin = step * 4 + rank * 2;
    r.position_end = r.position_begin + 2;
    return r;
  };
  {
    coordinator::RunLog log(dir.path(), true);
    coordinator::StepDriver lost(log, cfg, [](const coordinator::StepCommitted&) {});
    for (uint64_t step : {0, 1})
      for (uint32_t rank : {0u, 1u}) lost.report(report(step, rank), 1, 2);
  }
  coordinator::RunLog log(dir.path(), true);
  coordinator::StepDriver steps(log, cfg, [](const coordinator::StepCommitted&) {});
  ASSERT_TRUE(steps.continue_at(1));
  for (uint32_t rank : {0u, 1u}) steps.report(report(1, rank), 1, 2);
  EXPECT_EQ(steps.committed(), 2u);
  std::map<std::string, int> lines;
  for (const auto& l : lines_of(dir.path() + "/ledger.jsonl"))
    ++lines[json_field(l, "step") + "/" + json_field(l, "member")];
  EXPECT_EQ(lines, (std::map<std::string, int>{{"0/0", 1}, {"0/1", 1}, {"1/0", 1}, {"1/1", 1}}));
}

// `troupe status` of a job no process runs any more reads how it ended from its run directory
// (it used to say "cannot reach ... Endpoint is not connected").
TEST(Status, AnEndedJobsStatusComesFromItsRunDirectory) {
  TempDir dir;
  Job done = start_job(dir, "ended", kConfig, 1, {"job.steps=5"});
  ASSERT_TRUE(done.proc->wait(60s));
  int rc = -1;
  std::string text = troupe_output(dir, {"status", "--run-dir", done.run_dir}, &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("job hardening: finished (completed) at step 5 of 5"), std::string::npos)
      << text;
  std::string json = troupe_output(dir, {"status", "--run-dir", done.run_dir, "--json"}, &rc);
  EXPECT_NE(json.find("\"state\":\"finished\",\"outcome\":\"completed\",\"step\":5,\"steps\":5"),
            std::string::npos)
      << json;
  // (its final checkpoint, what export reads: the status of an ended job said only its step)
  EXPECT_NE(
      json.find("\"checkpoint\":\"" + done.run_dir + "/checkpoints/step-00000005/manifest.json"),
      std::string::npos)
      << json;
  // Lines of other shapes (a damaged or hand-edited file): skipped, or their fields of the wrong
  // type taken as absent; never "type must be string" out of the JSON library.
  std::ofstream(done.run_dir + "/events.jsonl", std::ios::app)
      << "7\n"
      << R"({"event":"job_finished","state":3,"steps":"many","loss":"low"})"
      << "\n";
  text = troupe_output(dir, {"status", "--run-dir", done.run_dir}, &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("job hardening: finished (completed) at step 0"), std::string::npos) << text;
}

// Standbys are listed, and every row names its agent as its log file does (agent-N).
TEST(Status, StandbysAndAgentNamesAreListed) {
  TempDir dir;
  // (Steps enough that the job still runs when the standby is in, however slow the machine:
  // under a sanitizer with a neighbour, 400 paced steps ended before the status call.)
  Job job = start_job(dir, "standby", kConfig, 1, {"elastic.max_workers=1", "job.steps=100000"},
                      {pace(5000)});
  wait_steps(job, 3);
  auto extra = join_agent(dir, job, "spare", {pace(5000)});
  ASSERT_FALSE(wait_event(job, is("member_standby"), 60s).empty());
  int rc = -1;
  std::string text = troupe_output(dir, {"status", "--run-dir", job.run_dir}, &rc);
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("agent-0"), std::string::npos) << text;
  EXPECT_NE(text.find("standby"), std::string::npos) << text;
  EXPECT_NE(text.find("spare"), std::string::npos) << text;
  std::string json = troupe_output(dir, {"status", "--run-dir", job.run_dir, "--json"}, &rc);
  EXPECT_NE(json.find("\"standbys\":[{\"rank\":null,\"agent\":1,\"name\":\"spare\""),  // (no rank)
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"state\":\"standby\"}]"), std::string::npos) << json;  // (max_workers)
  admin(dir, {"stop", "--run-dir", job.run_dir});
  ASSERT_TRUE(job.proc->wait(60s));
}

// `troupe run` says when the membership changes; a normal end and admin commands leave no
// warnings in the coordinator's log (only losses do).
TEST(RunOutput, MembershipChangesArePrintedAndNormalDisconnectsAreNotWarnings) {
  TempDir dir;
  // (A job that runs until it is stopped: under a sanitizer on 2 cores a 300-step job ended
  // during the status call, before the kill.)
  Job job = start_job(dir, "changes", kConfig, 3, {"job.steps=100000", "elastic.max_restarts=0"},
                      {pace(3000)});
  wait_steps(job, 10);
  int rc = -1;
  troupe_output(dir, {"status", "--run-dir", job.run_dir}, &rc);
  EXPECT_EQ(rc, 0);
  const int victim = pid_of(job, "agent-2");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_NE(wait_event(job, is("generation_started", "generation", "2"), 60s), "");
  admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0);
  const std::string out = text_of(job.out);
  EXPECT_NE(out.find("troupe: agent-2 was lost (peer_lost)"), std::string::npos) << out;
  EXPECT_NE(out.find("troupe: generation 2: 2 worker(s) from step"), std::string::npos) << out;
  int warnings = 0;
  for (auto& l : lines_of(job.run_dir + "/coordinator.log"))
    warnings += l.find("[warning] control plane: node") != std::string::npos;
  EXPECT_EQ(warnings, 1) << "one loss (agent-2), no warning for the status call or the job's end";
}

// ---- the coordinator's port under attack ------------------------------------------------------

// CPU seconds a process has used (user + system).
double cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::istringstream rest(stat.substr(stat.rfind(')') + 2));
  std::string field;
  double user = 0, sys = 0;
  for (int i = 3; rest >> field; ++i) {
    if (i == 14) user = std::stod(field);
    if (i == 15) {
      sys = std::stod(field);
      break;
    }
  }
  return (user + sys) / double(sysconf(_SC_CLK_TCK));
}

// Sockets of this host in CLOSE-WAIT on local port `port` (/proc/net/tcp, state 08).
int close_wait_on(int port) {
  int n = 0;
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state;
    f >> slot >> local >> remote >> state;
    if (state == "08" && std::stoi(local.substr(local.find(':') + 1), nullptr, 16) == port) ++n;
  }
  return n;
}

void send_garbage(int port, size_t bytes) {
  int fd = connect_loopback(port);
  if (fd < 0) return;
  std::mt19937 rng{uint32_t(bytes)};
  std::vector<char> junk(bytes);
  for (auto& c : junk) c = char(rng());
  size_t at = 0;
  while (at < bytes) {
    ssize_t n = ::send(fd, junk.data() + at, bytes - at, MSG_NOSIGNAL);
    if (n <= 0) break;  // (the gate cuts the connection: a reset is what it should get)
    at += size_t(n);
  }
  ::close(fd);
}

// Random bytes (4 KB to 1 MB), a client that says nothing, and a flood of connections to the
// coordinator's port: the coordinator's CPU time and the training's throughput stay what they
// were (before the gate, 4 KB cost a core for the rest of the job: comm/gate.h), no connection is
// left half-closed, and the job ends normally.
TEST(Ports, GarbageSlowClientsAndFloodsLeaveTheCoordinatorAsItWas) {
  TempDir dir;
  Job job = start_job(dir, "attack", kConfig, 2, {"job.steps=1000000"}, {pace(2000)});
  wait_steps(job, 5);
  const int coordinator = job.proc->pid();
  const int port =
      std::stoi(lines_of(job.run_dir + "/coordinator.addr")
                    .at(0)
                    .substr(lines_of(job.run_dir + "/coordinator.addr").at(0).rfind(':') + 1));
  auto window = [&](const char* what) {
    const double c0 = cpu_seconds(coordinator);
    const size_t s0 = committed_losses(job.run_dir).size();
    std::this_thread::sleep_for(3s);
    const double cpu = (cpu_seconds(coordinator) - c0) / 3.0;
    const double rate = double(committed_losses(job.run_dir).size() - s0) / 3.0;
    std::printf("%s: coordinator %.3f cores, %.0f steps/s\n", what, cpu, rate);
    return cpu;
  };
  const double before = window("before");
  for (size_t bytes : {size_t(36), size_t(4096), size_t(65536), size_t(1) << 20})
    send_garbage(port, bytes);
  const int slow = connect_loopback(port);  // says nothing: cut at the gate's deadline
  std::vector<int> flood;
  for (int i = 0; i < 200; ++i) flood.push_back(connect_loopback(port));
  for (int fd : flood)
    if (fd >= 0) ::close(fd);
  std::this_thread::sleep_for(3s);  // (past the gate's 2 s deadline for the silent client)
  const double after = window("after the attack");
  if (slow >= 0) ::close(slow);
  EXPECT_LT(after, before + 0.25) << "the coordinator spins after garbage on its port";
  EXPECT_EQ(close_wait_on(port), 0) << "half-closed connections left on the port";
  admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << text_of(job.out);
}

}  // namespace
}  // namespace troupe
