// The job end to end, as a user runs it: `troupe run CONFIG` with local agents (real processes),
// the run directory's logs, equivalence across world sizes, config errors, status and stop.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "comm/cuda_info.h"
#include "coordinator/process.h"
#include "tests/harness/harness.h"
#include "tests/harness/jobs.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;

std::string write_config(const testing::TempDir& dir, const std::string& name,
                         const std::string& text) {
  std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

const char* kMlp = R"([job]
name = "equiv"
seed = 3
steps = 30
[model]
kind = "mlp"
inputs = 64
hidden = [64]
classes = 10
[data]
kind = "synthetic"
samples = 4096
ledger = true
[batch]
global = 50
micro = 8
[optimizer]
kind = "adamw"
lr = 0.003
clip_norm = 1.0
)";

struct RunResult {
  int exit_code = -1;
  std::string run_dir, output;
};

// A socket listening on a loopback port of its own (its "127.0.0.1:PORT" in `at`), or -1.
// A loopback port of the test's own, listening (or only bound: connects to it are refused).
int listening_socket(std::string& at, bool listen = true) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (s < 0 || ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      (listen && ::listen(s, 8) != 0) ||
      ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -1;
  at = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  return s;
}

// Where a job's coordinator listens, once it says so in its run directory ("" after 60 s: slow
// under a sanitizer).
std::string coordinator_address(const testing::Job& job) {
  std::string addr;
  for (int i = 0; i < 3000 && addr.empty(); ++i) {
    std::ifstream(job.run_dir + "/coordinator.addr") >> addr;
    if (addr.empty()) std::this_thread::sleep_for(20ms);
  }
  return addr;
}

RunResult troupe_run(const testing::TempDir& dir, const std::string& config,
                     std::vector<std::string> sets, std::chrono::seconds timeout = 300s) {
  static int n = 0;
  RunResult r;
  r.run_dir = dir.path() + "/run" + std::to_string(n++);
  std::vector<std::string> argv{testing::troupe_binary(), "run", config, "--set",
                                "job.run_dir=\"" + r.run_dir + "\""};
  for (auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  std::string out = r.run_dir + ".out";
  coordinator::ChildProcess p({argv, out, out, {}});
  auto status = p.wait(timeout);
  if (status && WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
  std::ifstream in(out);
  r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

TEST(Job, SameLossesAtWorldSizesOneToFour) {
  testing::TempDir dir;
  std::string config = write_config(dir, "mlp.toml", kMlp);
  std::vector<double> reference;
  for (int world : {1, 2, 3, 4}) {
    RunResult r = troupe_run(dir, config, {"cluster.agents=" + std::to_string(world)});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    auto l = testing::committed_losses(r.run_dir);
    ASSERT_EQ(l.size(), 30u) << r.output;
    auto events = testing::lines_of(r.run_dir + "/events.jsonl");
    ASSERT_EQ(testing::json_field(events.back(), "event"), "job_finished");
    EXPECT_EQ(testing::json_field(events.back(), "identical_parameters"), "true") << events.back();
    testing::check_ledger(r.run_dir, 30, 50);  // 50 over 3 or 4 ranks: uneven shares
    if (world == 1) {
      reference = l;
      EXPECT_LT(l.back(), 0.85 * l.front()) << "the loss did not fall";
      continue;
    }
    for (size_t i = 0; i < l.size(); ++i) {
      EXPECT_NEAR(l[i], reference[i], 1e-4 * std::abs(reference[i]))
          << "world " << world << ", step " << i;
    }
    std::printf("world %d: step 29 loss %.6f vs %.6f at world 1\n", world, l.back(),
                reference.back());
  }
  // The same with the gradient reduction overlapped with the backward pass (and logging.level
  // "warn": no info line in the coordinator's log or an agent's; it was ignored).
  RunResult r = troupe_run(
      dir, config, {"cluster.agents=3", "parallel.overlap_reduce=true", "logging.level=\"warn\""});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* log : {"/coordinator.log", "/agent-0.log", "/agent-2.log"}) {
    const std::string text = testing::text_of(r.run_dir + log);
    EXPECT_EQ(text.find("[info]"), std::string::npos) << log << ":\n" << text;
  }
  auto l = testing::committed_losses(r.run_dir);
  ASSERT_EQ(l.size(), reference.size());
  for (size_t i = 0; i < l.size(); ++i)
    EXPECT_NEAR(l[i], reference[i], 1e-4 * std::abs(reference[i])) << "overlap, step " << i;
  testing::check_ledger(r.run_dir, 30, 50);
}

// model.dtype = "bf16" on CPU workers: the linear layers' forward GEMMs read bf16-rounded inputs
// (the CUDA device's mixed precision, emulated): the workers say so, the losses move off f32's
// by less than 2%, and the members still end with identical parameters.
TEST(Job, ModelDtypeBf16TrainsOnTheCpuWithinTwoPercentOfF32) {
  testing::TempDir dir;
  std::string config = write_config(dir, "mlp.toml", kMlp);
  RunResult f32 = troupe_run(dir, config, {"cluster.agents=2"});
  RunResult bf16 = troupe_run(dir, config, {"cluster.agents=2", "model.dtype=\"bf16\""});
  ASSERT_EQ(f32.exit_code, 0) << f32.output;
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const auto a = testing::committed_losses(f32.run_dir);
  const auto b = testing::committed_losses(bf16.run_dir);
  ASSERT_EQ(a.size(), 30u);
  ASSERT_EQ(b.size(), 30u);
  EXPECT_NE(a, b) << "model.dtype acts";
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 0.02 * a[i]) << "step " << i;
  EXPECT_LT(b.back(), 0.85 * b.front()) << "bf16 learns";
  auto events = testing::lines_of(bf16.run_dir + "/events.jsonl");
  EXPECT_EQ(testing::json_field(events.back(), "identical_parameters"), "true") << events.back();
  EXPECT_NE(testing::text_of(bf16.run_dir + "/agent-0.log").find("bf16 GEMM inputs, emulated"),
            std::string::npos);
  EXPECT_NE(testing::text_of(bf16.run_dir + "/config.toml").find("dtype = 'bf16'"),
            std::string::npos)
      << "the effective config keeps it";
}

// The README's promise, run as `make run` runs it (the whole quickstart.toml): the loss falls
// from about 4.4 to about 1.75 nats per character over 300 steps (the run is deterministic at a
// given world size; the bounds leave room for a different libm, not for a model that does not
// learn). The time is printed, never asserted.
TEST(Job, TheQuickstartKeepsTheReadmesPromise) {
  testing::TempDir dir;
  auto t0 = std::chrono::steady_clock::now();
  RunResult r = troupe_run(dir, std::string(TROUPE_SOURCE_DIR) + "/configs/quickstart.toml", {});
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto l = testing::committed_losses(r.run_dir);
  ASSERT_EQ(l.size(), 300u);
  double last = 0;
  for (size_t i = l.size() - 15; i < l.size(); ++i) last += l[i] / 15;
  std::printf("quickstart: loss %.3f -> %.3f (mean of the last 15) in %.1f s\n", l[0], last,
              seconds);
  EXPECT_GT(l[0], 4.2);
  EXPECT_LT(l[0], 4.5);
  EXPECT_LT(last, 1.9);
  EXPECT_NE(r.output.find("finished after 300 of 300 steps"), std::string::npos) << r.output;
  for (const char* f : {"config.toml", "coordinator.addr", "metrics.jsonl", "job.token",
                        "agent-0.log", "agent-1.log"})
    EXPECT_TRUE(std::ifstream(r.run_dir + "/" + f).good()) << f;
}

TEST(Job, BadConfigsExitNonZeroWithTheReasonAndStartNothing) {
  testing::TempDir dir;
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"[job]\nsteps = \n", "syntax error"},
      {"[job]\nstpes = 3\n", "unknown key job.stpes; did you mean job.steps?"},
      {"[batch]\nglobal = 2.5\n", "batch.global must be an integer"},
      {"[optimizer]\nlr = 0.0\n", "optimizer.lr = 0 is out of range"},
      {"[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/nonexistent/text.txt\"\n",
       "cannot be read: No such file or directory"},
      {"[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"/dev/zero\"\n",
       "is not a regular file (a character device)"},
      {"[optimizer]\nlr = nan\n", "optimizer.lr must be a finite number"},
      {"[model]\nkind = \"gpt\"\nd_model = 600000\nheads = 1\n[data]\nkind = \"text\"\n",
       "GiB per worker"},
      // Keys that would not act are refused, never ignored.
      // (No GPU here: "the workers compute on the CPU"; one GPU: "needs a GPU per worker".)
      {"[parallel]\nbackend = \"nccl\"\n", "parallel.backend = \"nccl\""},
      {"[checkpoint]\nif_busy = \"skip\"\n", ":2:11: checkpoint.if_busy = \"skip\" skips periodic"},
      {"[observability]\nmetrics_listen = \"127.0.0.1\"\n",
       "observability.metrics_listen = \"127.0.0.1\" is not HOST:PORT"},
      {"[observability]\nmetrics_listen = \"192.0.2.1:0\"\n", "cannot listen on 192.0.2.1:0"},
      // (refused before anything listens: the control plane failed, exit 1, a run directory left)
      {"[cluster]\nlisten = \"127.0.0.1:47321\"\n[observability]\nmetrics_listen = "
       "\"0.0.0.0:47321\"\n",
       "observability.metrics_listen = \"0.0.0.0:47321\" is the address cluster.listen "
       "(\"127.0.0.1:47321\") listens on"},
      {"[cluster]\nlisten = \"127.0.0.1:99999\"\n",
       ":2:10: cluster.listen = \"127.0.0.1:99999\" is not HOST:PORT"},
      // (empty: it exited 1 with the transport's text)
      {"[cluster]\nlisten = \"\"\n", ":2:10: cluster.listen = \"\" is not HOST:PORT"},
      // (an IPv6 address: it exited 1 with the transport's text; no name lookup leaves the host)
      {"[cluster]\nlisten = \"::1:0\"\n", "cluster.listen = \"::1:0\": cannot resolve host '::1'"},
      {"[cluster]\nagents = 3\n[elastic]\nmax_workers = 2\n",
       "elastic.max_workers = 2 is below the workers the job starts with, 3"},
      // A kind's key for another kind would not act: a new run is refused (a resume warns).
      {"[optimizer]\nkind = \"adamw\"\nmomentum = 0.5\n",
       ":3:12: optimizer.momentum acts only with optimizer.kind = \"sgd\""},
      // (the job's id in its token file: a space made every agent's join fail, unexplained)
      {"[job]\nname = \"my gpt\"\n", ":2:8: job.name = \"my gpt\" must be a non-empty name"},
      {"[observability]\ntrace_steps = \"9-3\"\n",
       ":2:15: observability.trace_steps = \"9-3\" is not a step range"},
      {"[parallel]\ndeterministic = true\n[batch]\nglobal = 30\nmicro = 8\n",
       "parallel.deterministic needs batch.global (30) to be a multiple of batch.micro (8)"},
      // A memory budget no layout meets (blocks of 4160 and 650 parameters).
      {"[model]\ninputs = 64\nhidden = [64]\nclasses = 10\n[parallel]\nmax_params_per_worker = "
       "4000\npipeline_stages = \"auto\"\n",
       "max_params_per_worker = 4000: block 0 of the model has 4160 parameters"},
      {"[model]\ninputs = 64\nhidden = [64]\nclasses = 10\n[parallel]\nmax_params_per_worker = "
       "4500\n",
       "the model's 4810 parameters are one stage's (parallel.pipeline_stages = 1)"},
      {"[model]\ninputs = 64\nhidden = [64]\nclasses = 10\n[cluster]\nagents = 1\n[parallel]\n"
       "max_params_per_worker = 4500\npipeline_stages = \"auto\"\n",
       "need at least 2 pipeline stages, one worker each, and the job has 1 worker(s)"},
      // More stages than the model has blocks (an MLP of one hidden layer: 2): refused before
      // anything starts (it churned for elastic.rejoin_timeout_ms and blamed min_workers).
      {"[model]\ninputs = 64\nhidden = [64]\nclasses = 10\n[cluster]\nagents = 3\n[parallel]\n"
       "pipeline_stages = 3\n",
       "parallel.pipeline_stages = 3, but the model has only 2 block(s)"},
      // (a GPT on text too: its vocabulary unknown before the text is read, it was not checked)
      {"[model]\nkind = \"gpt\"\nlayers = 2\n[data]\nkind = \"text\"\n[parallel]\n"
       "max_params_per_worker = 10\npipeline_stages = \"auto\"\n",
       "max_params_per_worker = 10: block 0 of the model has"},
      // A program's own kind that cannot open its data: named by its key (it said only the
      // kind's own words).
      {"[model]\ninputs = 64\nhidden = [64]\nclasses = 10\n[data]\nkind = \"broken_samples\"\n"
       "open_fails = true\n",
       "data.kind = \"broken_samples\": cannot open /nonexistent/records.csv"},
      {"[model]\ninputs = 64\nhidden = [64, 64]\nclasses = 10\n[cluster]\nagents = 4\n"
       "[parallel]\nmax_params_per_worker = 4200\npipeline_stages = 2\n",
       "need at least 3 pipeline stages; parallel.pipeline_stages = 2"},
  };
  int i = 0;
  for (auto& c : cases) {
    std::string config = write_config(dir, "bad" + std::to_string(i++) + ".toml", c.text);
    RunResult r = troupe_run(dir, config, {}, 30s);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(config), std::string::npos)
        << "the message names the file: " << r.output;
    EXPECT_FALSE(std::ifstream(r.run_dir + "/events.jsonl").good()) << "a job was started";
  }
}

// A run directory whose own files cannot be written (a directory in the place of one) is refused,
// exit 2, naming the file. (config.toml and coordinator.addr went unwritten without a word, the
// job then unreachable by troupe status and stop; the token and the log exited 1, the log's with
// spdlog's words; coordinator.addr's now ends the control plane too, not 30 s later.)
TEST(Job, ARunDirectoryWhoseOwnFilesCannotBeWrittenIsRefusedNamingTheFile) {
  testing::TempDir dir;
  const std::string config = write_config(dir, "mlp.toml", kMlp);
  for (const std::string file :
       {"config.toml", "job.token", "coordinator.log", "coordinator.addr"}) {
    const std::string run_dir = dir.path() + "/in-" + file, out = run_dir + ".out";
    std::filesystem::create_directories(run_dir + "/" + file);
    coordinator::ChildProcess p(
        {{testing::troupe_binary(), "run", config, "--set", "job.run_dir=\"" + run_dir + "\""},
         out,
         out,
         {}});
    auto st = p.wait(20s);
    ASSERT_TRUE(st && WIFEXITED(*st)) << file << " did not end";
    EXPECT_EQ(WEXITSTATUS(*st), 2) << file << ": " << testing::text_of(out);
    EXPECT_NE(testing::text_of(out).find(run_dir + "/" + file), std::string::npos)
        << testing::text_of(out);
  }
}

// Inputs that could hang the command or exhaust the machine are refused before anything starts:
// a FIFO as the data file (reading it would block), a directory as the config file (it used to
// train the default job), an agent offering no device.
TEST(Job, InputsThatCouldHangOrMisleadAreRefusedBeforeAnythingStarts) {
  testing::TempDir dir;
  const std::string fifo = dir.path() + "/corpus.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string config =
      write_config(dir, "fifo.toml",
                   "[model]\nkind = \"gpt\"\n[data]\nkind = \"text\"\npath = \"" + fifo + "\"\n");
  RunResult r = troupe_run(dir, config, {}, 30s);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("is not a regular file (a FIFO)"), std::string::npos) << r.output;

  // A listen address in use: refused naming it, before the run directory is made (exit 1 and a
  // run directory left behind, UCX's errors its only words).
  std::string taken;
  const int busy = listening_socket(taken);
  ASSERT_GE(busy, 0);
  RunResult in_use = troupe_run(dir, write_config(dir, "busy.toml", kMlp),
                                {"cluster.listen=\"" + taken + "\""}, 30s);
  // (the metrics endpoint's too: it was named as the file's)
  RunResult metrics_in_use = troupe_run(dir, write_config(dir, "busy-metrics.toml", kMlp),
                                        {"observability.metrics_listen=\"" + taken + "\""}, 30s);
  ::close(busy);
  EXPECT_EQ(metrics_in_use.exit_code, 2) << metrics_in_use.output;
  EXPECT_NE(metrics_in_use.output.find("--set observability.metrics_listen: "
                                       "observability.metrics_listen: cannot listen on " +
                                       taken),
            std::string::npos)
      << metrics_in_use.output;
  EXPECT_EQ(in_use.exit_code, 2) << in_use.output;
  EXPECT_NE(in_use.output.find("--set cluster.listen: cluster.listen = \"" + taken +
                               "\": cannot listen there"),
            std::string::npos)
      << in_use.output;
  EXPECT_FALSE(std::filesystem::exists(in_use.run_dir)) << "a run directory was left";

  // A run directory whose log cannot be opened (a directory where metrics.jsonl goes): refused,
  // named (the command hung, deaf to SIGTERM, waiting for its control plane to end).
  const std::string blocked = dir.path() + "/blocked";
  std::filesystem::create_directories(blocked + "/metrics.jsonl");
  const std::string mlp = write_config(dir, "blocked.toml", kMlp);
  std::vector<std::string> argv{testing::troupe_binary(), "run", mlp, "--set",
                                "job.run_dir=\"" + blocked + "\""};
  coordinator::ChildProcess p({argv, blocked + ".out", blocked + ".out", {}});
  const auto st_blocked = p.wait(30s);
  ASSERT_TRUE(st_blocked) << "troupe run hung";
  EXPECT_EQ(WEXITSTATUS(*st_blocked), 2);
  EXPECT_NE(testing::text_of(blocked + ".out").find("cannot write " + blocked + "/metrics.jsonl"),
            std::string::npos)
      << testing::text_of(blocked + ".out");

  RunResult d = troupe_run(dir, dir.path(), {}, 30s);
  EXPECT_EQ(d.exit_code, 2) << d.output;
  EXPECT_NE(d.output.find("is a directory, not a config file"), std::string::npos) << d.output;
  EXPECT_FALSE(std::ifstream(d.run_dir + "/events.jsonl").good()) << "a job was started";

  std::string out = dir.path() + "/nodevice.out";
  coordinator::ChildProcess agent({{testing::troupe_binary(), "agent", "--join", "127.0.0.1:1",
                                    "--token-file", "/nonexistent", "--devices", ""},
                                   out,
                                   out,
                                   {}});
  auto st = agent.wait(30s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  std::string text;
  for (auto& l : testing::lines_of(out)) text += l;
  EXPECT_NE(text.find("--devices names no device"), std::string::npos) << text;
}

// The MLP job with two agents and the test build's faults `env`: its exit status (-1: none),
// run directory and output.
struct FaultedRun {
  int status = -1;
  std::string run_dir, out;
};
FaultedRun run_mlp_with(const testing::TempDir& dir, const std::string& name,
                        const std::vector<std::string>& env) {
  const std::string config = write_config(dir, name + ".toml", kMlp);
  FaultedRun r{-1, dir.path() + "/" + name, dir.path() + "/" + name + ".out"};
  coordinator::ChildProcess p({{testing::troupe_binary(), "run", config, "--set",
                                "job.run_dir=\"" + r.run_dir + "\"", "--set", "cluster.agents=2"},
                               r.out,
                               r.out,
                               env});
  auto st = p.wait(120s);
  if (st && WIFEXITED(*st)) r.status = WEXITSTATUS(*st);
  return r;
}

// `troupe ARGS...` run to its end: the exit code and what it printed (stdout and stderr).
std::pair<int, std::string> troupe_says(const testing::TempDir& dir,
                                        const std::vector<std::string>& args) {
  std::vector<std::string> argv{testing::troupe_binary()};
  argv.insert(argv.end(), args.begin(), args.end());
  static int calls = 0;  // (a file a call: ChildProcess appends)
  const std::string out = dir.path() + "/said-" + std::to_string(calls++) + ".out";
  coordinator::ChildProcess p({argv, out, out, {}});
  auto status = p.wait(30s);
  return {status && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, testing::text_of(out)};
}

// The checksum comparison can fail: a member that ends with other parameters (the test build
// changes one of agent-1's before its final checksum) makes the job fail, naming it.
TEST(Job, MembersThatEndDifferentFailTheJob) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(dir, "different", {"TROUPE_TEST_PERTURB_AGENT=agent-1"});
  EXPECT_EQ(r.status, 1);
  auto events = testing::lines_of(r.run_dir + "/events.jsonl");
  ASSERT_FALSE(events.empty());
  // Every record says it failed: the event, the console, troupe status.
  EXPECT_EQ(testing::json_field(events.back(), "event"), "job_failed") << events.back();
  EXPECT_EQ(testing::json_field(events.back(), "reason"),
            "members ended with different parameters: ranks 0 and 1 (the whole model)")
      << events.back();
  const std::string text = testing::text_of(r.out);
  EXPECT_NE(text.find("failed after"), std::string::npos) << text;
  EXPECT_NE(text.find("members ended with different parameters"), std::string::npos) << text;
  auto [rc, said] = troupe_says(dir, {"status", "--run-dir", r.run_dir});
  EXPECT_NE(said.find("failed"), std::string::npos) << said;
  EXPECT_EQ(said.find("completed"), std::string::npos) << said;
}

// A job of one worker whose worker fails (it throws once; its agent rebuilds it, holding
// nothing): no member holds the model's state, and the job fails leading with the failure that
// took it, not with the planner's account of blocks and pipeline stages, when asked not to roll
// back to a checkpoint (checkpoint.on_state_lost = "fail"). Its checkpoints are named as where a
// resume goes on from. (Rolled back: Checkpoints.StateLostWithItsMembersIsReloaded...)
TEST(Job, AJobThatLostItsOnlyStateFailsNamingTheFailureThatTookIt) {
  testing::TempDir dir;
  const std::string config = write_config(dir, "alone.toml", kMlp), run_dir = dir.path() + "/alone";
  const std::string out = dir.path() + "/alone-faulted.out";
  coordinator::ChildProcess p(
      {{testing::troupe_binary(), "run", config, "--set", "job.run_dir=\"" + run_dir + "\"",
        "--set", "cluster.agents=1", "--set", "checkpoint.every_steps=1", "--set",
        "checkpoint.on_state_lost=\"fail\""},
       out,
       out,
       {"TROUPE_TEST_THROW_AGENT=agent-0", "TROUPE_TEST_THROW_AT_STEP=3", testing::pace(100000)}});
  auto st = p.wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(out);
  const std::string reason =
      testing::json_field(testing::lines_of(run_dir + "/events.jsonl").back(), "reason");
  EXPECT_EQ(reason.find("the model's state was lost with the last failure: "), 0u) << reason;
  EXPECT_NE(reason.find("injected fault at step 2"), std::string::npos) << reason;
  EXPECT_NE(reason.find("; checkpoint.on_state_lost = "), std::string::npos) << reason;
  EXPECT_NE(testing::text_of(out).find("troupe: its newest checkpoint is " + run_dir +
                                       "/checkpoints/step-0000000"),
            std::string::npos)
      << testing::text_of(out);
  // (the run's own config: another's keys would change what it computes, with only a warning)
  EXPECT_NE(
      testing::text_of(out).find("troupe run " + run_dir + "/config.toml --resume " + run_dir),
      std::string::npos)
      << testing::text_of(out);
}

// A worker that says it holds state as of a step far past the job's end (the test build makes
// agent-1's say step 10^12): the coordinator takes it as holding nothing and it receives the
// state; the job runs its steps once each and ends with identical parameters (before, the first
// generation would have started at step 10^12, committing steps never run).
TEST(Job, AWorkerClaimingAStepPastTheEndReceivesTheState) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(
      dir, "claim", {"TROUPE_TEST_CLAIM_AGENT=agent-1", "TROUPE_TEST_CLAIM_APPLIED=1000000000000"});
  EXPECT_EQ(r.status, 0) << testing::text_of(r.out);
  auto events = testing::lines_of(r.run_dir + "/events.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(testing::json_field(events.back(), "identical_parameters"), "true") << events.back();
  EXPECT_EQ(testing::committed_losses(r.run_dir).size(),
            size_t(std::stoul(testing::json_field(events.back(), "steps"))));
  EXPECT_NE(testing::text_of(r.run_dir + "/coordinator.log").find("taken as holding nothing"),
            std::string::npos);
}

// Every step of the MLP job committed once, each with a loss it computed (a step committed
// without running has none), and the members ended alike.
void expect_every_step_run(const FaultedRun& r) {
  EXPECT_EQ(r.status, 0) << testing::text_of(r.out);
  auto events = testing::lines_of(r.run_dir + "/events.jsonl");
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(testing::json_field(events.back(), "identical_parameters"), "true") << events.back();
  const auto losses = testing::committed_losses(r.run_dir);
  EXPECT_EQ(losses.size(), 30u);
  for (size_t s = 0; s < losses.size(); ++s) EXPECT_GT(losses[s], 0.0) << "step " << s;
}

// A worker that says, before the job's first step, that it holds state as of step 5 (the test
// build makes agent-1's say so): nothing ran, so the coordinator takes it as holding nothing.
// (Before, the first generation started at step 5 from agent-1's step-0 state and the ledger
// committed steps 0-4 unrun, with loss 0.)
TEST(Job, AWorkerClaimingStepsBeforeAnyRanReceivesTheState) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(
      dir, "early", {"TROUPE_TEST_CLAIM_AGENT=agent-1", "TROUPE_TEST_CLAIM_APPLIED=5"});
  expect_every_step_run(r);
  EXPECT_NE(testing::text_of(r.run_dir + "/coordinator.log").find("before the job ran any step"),
            std::string::npos);
}

// A worker the coordinator says holds what it does not (the test build makes agent-1 read its
// own state in the generation's start as of step 5; it is as of step 0): it fails naming the
// claim rather than keep or send that state, its agent restarts it holding nothing and it
// receives the state; the job runs every step once.
TEST(Job, AWorkerSaidToHoldStateItLacksFailsAndIsRestartedToReceiveIt) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(
      dir, "lacks", {"TROUPE_TEST_CLAIM_AGENT=agent-1", "TROUPE_TEST_RELAY_APPLIED=5"});
  expect_every_step_run(r);
  const std::string all = testing::text_of(r.run_dir + "/events.jsonl");
  EXPECT_NE(all.find("holds block 0 live as of step 5, which it does not"), std::string::npos)
      << all;
}

// Workers that disagree on the model's blocks (the test build makes agent-1 say 7): the job fails
// naming both, instead of planning a generation around the larger count.
TEST(Job, WorkersThatDisagreeOnTheModelsBlocksFailTheJobNamingThem) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(
      dir, "blocks", {"TROUPE_TEST_CLAIM_AGENT=agent-1", "TROUPE_TEST_CLAIM_BLOCKS=7"});
  EXPECT_EQ(r.status, 1) << testing::text_of(r.out);
  EXPECT_NE(testing::text_of(r.out).find("say the model has"), std::string::npos)
      << testing::text_of(r.out);
}

// A worker that builds another model than the job's (the test build widens the first layer of
// `TROUPE_TEST_WIDEN_AGENT`'s model: another version of the program) is refused before any state
// moves, naming the block and both sizes; it used to end, after every reform, as "peer_lost:
// transfer failed: Message truncated". The coordinator knows the model's blocks before the start
// (it builds the model of an mlp, a gpt on token data, a program's own kinds) and tells every
// agent: such a worker refuses to start.
TEST(Job, AWorkerThatBuildsAnotherModelRefusesToStartNamingTheBlock) {
  testing::TempDir dir;
  const FaultedRun r = run_mlp_with(dir, "wider", {"TROUPE_TEST_WIDEN_AGENT=agent-1"});
  const std::string text = testing::text_of(r.out);
  EXPECT_EQ(r.status, 1) << text;
  // (64 inputs: the widened first block has 65 weights more and one bias more.)
  EXPECT_NE(text.find("/0 failed: it built another model than the job's: block 0 has "
                      "4225 parameters in this worker's model, 4160 in the job's model"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("truncated"), std::string::npos) << text;
}

// The same on text data, whose vocabulary (and so the model) only the workers read: the
// coordinator compares what the workers built before the first generation starts.
TEST(Job, WorkersThatBuildDifferentModelsOnTextDataFailTheJobBeforeItStarts) {
  testing::TempDir dir;
  const std::string config = write_config(dir, "text.toml", R"([job]
steps = 6
[model]
kind = "gpt"
layers = 1
d_model = 16
heads = 2
context = 8
[data]
kind = "text"
[batch]
global = 4
micro = 2
)");
  const std::string out = dir.path() + "/text.out";
  coordinator::ChildProcess p(
      {{testing::troupe_binary(), "run", config, "--set", "job.run_dir=\"" + dir.path() + "/text\"",
        "--set", "cluster.agents=2"},
       out,
       out,
       {"TROUPE_TEST_WIDEN_AGENT=agent-1"}});
  auto st = p.wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << testing::text_of(out);
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(out);
  const std::string text = testing::text_of(out);
  EXPECT_NE(text.find("the workers built different models: block 0 has "), std::string::npos)
      << text;
  EXPECT_NE(text.find(" parameters in worker 0/0's model, "), std::string::npos) << text;
  EXPECT_NE(text.find(" in worker 1/0's (every agent must run the same program"), std::string::npos)
      << text;
  EXPECT_TRUE(testing::committed_losses(dir.path() + "/text").empty());
}

// A program whose own loop calls ElasticLoop out of order (allreduce() before its first
// next_step(), commit() after the loop ended: the test build's `loop-misuse` member) is told so,
// naming the call, instead of a silent false; in between it trains the job to its end.
TEST(Job, ALoopsCallOutsideAStepIsNamed) {
  testing::TempDir dir;
  testing::Job job = testing::start_job(
      dir, "loop", "[job]\nsteps = 5\n[model]\nkind = \"external\"\n[logging]\nprogress = false\n",
      1, {"cluster.launcher=\"external\""});
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string out = dir.path() + "/misuse-member.out";
  coordinator::ChildProcess p(
      {{testing::troupe_binary(), "loop-misuse", addr, job.run_dir + "/job.token"}, out, out, {}});
  auto member = p.wait(60s);
  const std::string said = testing::text_of(out);
  ASSERT_TRUE(member && WIFEXITED(*member)) << said;
  EXPECT_EQ(WEXITSTATUS(*member), 0) << said;
  EXPECT_NE(said.find("before: ElasticLoop::allreduce() outside a step: call next_step() first"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("after: ElasticLoop::commit() outside a step"), std::string::npos) << said;
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
}

// A job of a program's own loop (model.kind = "external"), its members started by the test.
testing::Job loop_job(const testing::TempDir& dir, const std::string& name, int steps, int members,
                      std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), "cluster.launcher=\"external\"");
  return testing::start_job(dir, name,
                            "[job]\nsteps = " + std::to_string(steps) +
                                "\n[model]\nkind = \"external\"\n[logging]\nprogress = false\n",
                            members, sets);
}

// A loop's loss that sums to nan (one member's at step 3: `loop-member ... nan-at-step-3`) fails
// the job naming the step, as a built-in model's does; neither member commits it, both end with 1.
// (It was committed, its loss null in the events, and the job completed.)
TEST(Job, ALoopsLossThatSumsToNanFailsTheJobAtItsStep) {
  testing::TempDir dir;
  testing::Job job = loop_job(dir, "loop-nan", 30, 2);
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string token = job.run_dir + "/job.token";
  std::vector<std::unique_ptr<coordinator::ChildProcess>> members;
  for (const char* how : {"", "nan-at-step-3"}) {
    const std::string out = dir.path() + "/member" + std::to_string(members.size()) + ".out";
    std::vector<std::string> argv{testing::troupe_binary(), "loop-member", addr, token,
                                  "m" + std::to_string(members.size())};
    if (*how) argv.push_back(how);
    members.push_back(std::make_unique<coordinator::ChildProcess>(
        coordinator::ChildProcess::Options{argv, out, out, {}}));
  }
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the job did not end";
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(job.out);
  const std::string end = testing::events_of(job).back();
  EXPECT_NE(end.find("the training diverged at step 3: its loss, summed over the members, is nan"),
            std::string::npos)
      << end;
  // (Steps 0-2 at most: the failure may overtake the other member's last reports.)
  EXPECT_LE(testing::committed_losses(job.run_dir).size(), 3u);
  for (auto& m : members) {
    auto ms = m->wait(30s);
    ASSERT_TRUE(ms && WIFEXITED(*ms));
    EXPECT_EQ(WEXITSTATUS(*ms), 1);
  }
}

// An agent started in another directory (`troupe agent --join` from /) reads the data the job's
// relative data.path names from the coordinator's: its job spec carries the path resolved
// there. (It opened the relative path from its own directory, and its worker failed.)
TEST(Job, AnAgentJoiningFromAnotherDirectoryReadsTheJobsData) {
  testing::TempDir dir;
  std::filesystem::copy_file("/usr/share/common-licenses/GPL-3", dir.path() + "/text.txt");
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir.path());  // (the coordinator's directory: "text.txt" there)
  const std::string relative = "text.txt";
  testing::Job job = testing::start_job(
      dir, "elsewhere",
      "[job]\nsteps = 5\n[model]\nkind = \"gpt\"\nlayers = 1\nd_model = 16\nheads = 2\n"
      "context = 8\n[data]\nkind = \"text\"\n[batch]\nglobal = 8\nmicro = 8\n"
      "[logging]\nprogress = false\n",
      1, {"cluster.launcher=\"external\"", "data.path=" + relative});
  std::filesystem::current_path(cwd);
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string out = dir.path() + "/agent.out";
  coordinator::ChildProcess agent(
      {{"/bin/sh", "-c", "cd / && exec \"$0\" agent --join \"$1\" --token-file \"$2\"",
        testing::troupe_binary(), addr, job.run_dir + "/job.token"},
       out,
       out,
       {}});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the job did not end: " << testing::text_of(out);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out) << testing::text_of(out);
  EXPECT_EQ(testing::committed_losses(job.run_dir).size(), 5u);
}

// A program's own loop leaves the job when it asks (ElasticLoop::leave at step 5: a drain, as
// `troupe drain` of it): it ends with 0, "drained", and the other trains on to the end without a
// loss. (A loop had no way to leave but its end: a member lost.)
TEST(Job, ALoopLeavesTheJobWhenItAsks) {
  testing::TempDir dir;
  testing::Job job = loop_job(dir, "loop-leave", 200, 2);
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string token = job.run_dir + "/job.token";
  const std::string stays_out = dir.path() + "/stays.out", leaves_out = dir.path() + "/leaves.out";
  coordinator::ChildProcess stays(
      {{testing::troupe_binary(), "loop-member", addr, token, "stays"}, stays_out, stays_out, {}});
  coordinator::ChildProcess leaves(
      {{testing::troupe_binary(), "loop-member", addr, token, "leaves", "leaves-at-step-5"},
       leaves_out,
       leaves_out,
       {}});
  auto left = leaves.wait(60s);
  ASSERT_TRUE(left && WIFEXITED(*left)) << "the member that asked to leave did not end";
  EXPECT_EQ(WEXITSTATUS(*left), 0) << testing::text_of(leaves_out);
  const std::string said = testing::text_of(leaves_out);
  EXPECT_NE(said.find("leaves: leave: accepted"), std::string::npos) << said;
  EXPECT_NE(said.find("leaves: drained"), std::string::npos) << said;
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the job did not end";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
  EXPECT_EQ(testing::json_field(testing::events_of(job).back(), "state"), "completed");
  EXPECT_EQ(testing::count_events(job, "member_failed"), 0);
  EXPECT_NE(testing::wait_event(job, testing::is("member_left", "reason", "drained"), 1s), "");
  auto member = stays.wait(30s);
  ASSERT_TRUE(member && WIFEXITED(*member));
  EXPECT_EQ(WEXITSTATUS(*member), 0) << testing::text_of(stays_out);
}

// A loop whose LoopState::save takes longer than elastic.failure_timeout_ms (8 s, 3 s): a member
// joining waits for the state that long without progress, and the generation breaks. The job
// fails naming the wait for the state and the save. (It said "timed_out reported by rank 1, which
// gave up first": the echo of the joiner's error, which said nothing of the state either.)
TEST(Job, ALoopsSaveSlowerThanTheFailureTimeoutIsNamedWhenAMemberJoins) {
  testing::TempDir dir;
  testing::Job job = loop_job(dir, "loop-slow-save", 1000000, 1, {"elastic.max_reforms=0"});
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string token = job.run_dir + "/job.token";
  std::vector<std::unique_ptr<coordinator::ChildProcess>> members;
  for (const char* name : {"first", "joiner"}) {
    const std::string out = dir.path() + "/" + name + ".out";
    members.push_back(
        std::make_unique<coordinator::ChildProcess>(coordinator::ChildProcess::Options{
            {testing::troupe_binary(), "loop-member", addr, token, name, "slow-save"},
            out,
            out,
            {}}));
    if (members.size() == 1) testing::wait_steps(job, 5);
  }
  auto st = job.proc->wait(90s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the job did not end";
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(job.out);
  const std::string end = testing::events_of(job).back();
  EXPECT_NE(end.find(" broke without committing a step: timed_out: waiting for the state "
                     "from rank 0 (its LoopState::save, then the bytes; each within "
                     "elastic.failure_timeout_ms): no progress for 3000 ms"),
            std::string::npos)
      << end;
  const std::string first = testing::text_of(dir.path() + "/first.out");
  EXPECT_NE(first.find("first: generation "), std::string::npos) << first;  // (told why it ended)
  for (auto& m : members) EXPECT_TRUE(m->wait(60s)) << "a member did not end";
}

// A loop's member killed after its last step's commit, before it says its end (the test build's
// `loop-member ... dies-at-end`): the other, which said its own, forms a generation after the last
// step and ends the job with it. (It waited for a shutdown that never came, the job failing at
// the change's deadline: no address from the member that had said its end.)
TEST(Job, ALoopsMemberLostAfterTheLastStepLeavesTheOtherToEndTheJob) {
  testing::TempDir dir;
  testing::Job job = loop_job(dir, "loop-end", 30, 2, {"elastic.failure_timeout_ms=1000"});
  const std::string addr = coordinator_address(job);
  ASSERT_FALSE(addr.empty());
  const std::string token = job.run_dir + "/job.token", out = dir.path() + "/survivor.out";
  coordinator::ChildProcess survivor(
      {{testing::troupe_binary(), "loop-member", addr, token, "survivor"}, out, out, {}});
  coordinator::ChildProcess dies(
      {{testing::troupe_binary(), "loop-member", addr, token, "dies", "dies-at-end"},
       dir.path() + "/dies.out",
       dir.path() + "/dies.out",
       {}});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the job did not end";
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
  EXPECT_EQ(testing::json_field(testing::events_of(job).back(), "state"), "completed");
  EXPECT_NE(testing::wait_event(job, testing::is("generation_started", "step", "30"), 1s), "")
      << "the member died before the end: " << testing::text_of(job.run_dir + "/events.jsonl");
  auto member = survivor.wait(30s);
  ASSERT_TRUE(member && WIFEXITED(*member));
  EXPECT_EQ(WEXITSTATUS(*member), 0) << testing::text_of(out);
}

// An agent of another model joining a running job: its worker refuses to start and is given up;
// the job trains on without it and finishes.
TEST(Job, AJoinerThatBuildsAnotherModelIsGivenUpAndTheJobGoesOn) {
  testing::TempDir dir;
  // (Long enough for a joiner under a sanitizer; stopped once it was given up.)
  testing::Job job =
      testing::start_job(dir, "joiner", kMlp, 1, {"job.steps=1000000"}, {testing::pace(30000)});
  testing::wait_steps(job, 3);
  auto wide = testing::join_agent(dir, job, "wide", {"TROUPE_TEST_WIDEN_AGENT=wide"});
  const std::string failed = testing::wait_event(job, testing::is("worker_failed"), 120s);
  EXPECT_NE(failed.find("it built another model than the job's: block 0 has 4225 parameters"),
            std::string::npos)
      << failed;
  // (the agent stays, its worker given up: listed so; it was in no row of troupe status)
  const std::string status = testing::admin(dir, {"status", "--run-dir", job.run_dir, "--json"});
  EXPECT_NE(status.find("\"name\":\"wide\""), std::string::npos) << status;
  EXPECT_NE(status.find("\"given up\""), std::string::npos) << status;
  testing::admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << testing::text_of(job.out);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
  EXPECT_EQ(testing::count_events(job, "generation_started"), 1);
  EXPECT_TRUE(wide->wait(30s)) << "the refused agent did not exit";
}

// A data set that cannot give a sample (the test build's data.kind = "broken_samples": its fill
// throws on sample 100, or sample 200's target is one past the classes) fails the job at once,
// naming the sample: reading it again would give the same, so the worker is not restarted (it
// used to be, up to elastic.max_restarts times, and the message named the micro-batch's row).
TEST(Job, ASampleTheDataSetCannotGiveFailsTheJobNamingItWithoutRestarts) {
  testing::TempDir dir;
  struct Case {
    const char* set;
    const char* expect;
  } cases[] = {
      {"data.fail_at=100", "the data set failed on sample 100: record 100 is corrupt (a test's)"},
      {"data.bad_target_at=200",
       "target 10 (sample 200 of the data set) is outside the model's 10 outputs"},
  };
  for (const Case& c : cases) {
    RunResult r = troupe_run(
        dir, write_config(dir, "broken.toml", kMlp),
        {"data.kind=\"broken_samples\"", "data.samples=512", c.set, "cluster.agents=2"}, 120s);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("restarting"), std::string::npos) << r.output;
    const std::string events = testing::text_of(r.run_dir + "/events.jsonl");
    EXPECT_EQ(events.find("\"restarting\":true"), std::string::npos) << events;
    EXPECT_NE(events.find(c.expect), std::string::npos) << events;
  }
}

// The epochs the job trained: the samples its committed steps drew over the data set's samples
// an epoch (the members report its size), in metrics.jsonl and on the console: 12 steps of 50
// from 400 samples is 1.5 epochs.
TEST(Job, TheEpochsTrainedAreTheSamplesDrawnOverTheDataSets) {
  testing::TempDir dir;
  RunResult r = troupe_run(dir, write_config(dir, "epochs.toml", kMlp),
                           {"job.steps=12", "data.samples=400", "cluster.agents=2"}, 120s);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = testing::lines_of(r.run_dir + "/metrics.jsonl");
  std::vector<std::string> epochs;
  for (const auto& l : lines)
    if (!testing::json_field(l, "epoch").empty()) epochs.push_back(testing::json_field(l, "epoch"));
  ASSERT_EQ(epochs.size(), 12u) << r.run_dir;
  EXPECT_EQ(epochs.front(), "0.125");
  EXPECT_EQ(epochs.back(), "1.5");
  EXPECT_NE(r.output.find("step 12/12 loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" epoch 1.5\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("the data set has 400 sample(s) an epoch (8 steps of batch.global = 50)"),
            std::string::npos)
      << r.output;
  // A set smaller than a step's batch: said (every step draws each sample more than once).
  RunResult tiny = troupe_run(dir, write_config(dir, "tiny.toml", kMlp),
                              {"job.steps=2", "data.samples=20", "cluster.agents=1"}, 120s);
  ASSERT_EQ(tiny.exit_code, 0) << tiny.output;
  EXPECT_NE(tiny.output.find("has 20 sample(s) an epoch (0.4 steps of batch.global = 50): fewer "
                             "than a step's batch"),
            std::string::npos)
      << tiny.output;
}

// A diverged training (SGD at lr 1000): the job fails at the step whose loss or gradient norm is
// not finite, without restarts, naming it; no committed step has a nan loss and every complete
// checkpoint is of a step before it (it used to train on with "loss -nan", exit 0, and its
// checkpoints rotated the good ones out).
TEST(Job, ADivergedTrainingFailsAtTheStepNamingItAndKeepsTheCheckpointsBefore) {
  testing::TempDir dir;
  RunResult r = troupe_run(dir, write_config(dir, "diverge.toml", kMlp),
                           {"optimizer.kind=\"sgd\"", "optimizer.lr=1000", "optimizer.clip_norm=0",
                            "checkpoint.every_steps=2", "cluster.agents=2"},
                           120s);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  const size_t at = r.output.find("the training diverged at step ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const uint64_t step = std::stoull(r.output.substr(at + 30));
  EXPECT_EQ(r.output.find("restarting"), std::string::npos) << r.output;
  const std::string metrics = testing::text_of(r.run_dir + "/metrics.jsonl");
  EXPECT_EQ(metrics.find("null"), std::string::npos) << metrics;
  const auto losses = testing::committed_losses(r.run_dir);
  // The steps before it commit; the one just before may not (its report from the other agent
  // can come after the failure that ends the job).
  EXPECT_LE(losses.size(), step);
  EXPECT_GE(losses.size() + 1, step);
  for (double l : losses) EXPECT_TRUE(std::isfinite(l));
  int complete = 0;  // (a checkpoint is complete once its manifest is written)
  for (const auto& d : std::filesystem::directory_iterator(r.run_dir + "/checkpoints"))
    if (std::filesystem::exists(d.path() / "manifest.json")) {
      ++complete;
      EXPECT_LE(std::stoull(d.path().filename().string().substr(5)), step) << d.path();
    }
  EXPECT_GT(complete, 0);
  EXPECT_NE(r.output.find("its newest checkpoint is"), std::string::npos) << r.output;
}

// A program's block whose init is not a function of its seed (the test build's
// model.kind = "shifted_linear" with repeatable_init = false) fails the job before its first
// step, naming the block: it used to train the whole run on members with different models and
// fail at the end, on the final checksums. A repeatable one trains.
TEST(Job, ABlockWhoseInitIsNotRepeatableFailsTheJobBeforeItTrains) {
  testing::TempDir dir;
  const std::string config = write_config(dir, "unseeded.toml", R"([job]
steps = 20
[model]
kind = "shifted_linear"
[data]
kind = "broken_samples"
[batch]
global = 32
micro = 8
)");
  const std::vector<std::string> sets{"cluster.agents=2"};
  RunResult ok = troupe_run(dir, config, sets, 120s);
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  std::vector<std::string> unseeded = sets;
  unseeded.push_back("model.repeatable_init=false");
  RunResult r = troupe_run(dir, config, unseeded, 120s);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("failed after 0 steps"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("model 'shifted_linear': block 1 ('shift') initialised twice from the "
                          "same seed gave different parameters ('bias' element 9: "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("restarting"), std::string::npos) << r.output;
  // A block that cannot take the one before's output is named where the worker first runs it
  // (it said only "input is not (B, 11)", with no block).
  std::vector<std::string> wider = sets;
  wider.push_back("model.wider_shift=1");
  r = troupe_run(dir, config, wider, 120s);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(
      r.output.find("model 'shifted_linear': block 1 ('shift') forward: input is not (B, 11)"),
      std::string::npos)
      << r.output;
}

// A device the agent cannot open is refused where it starts: exit 2, with the reason, before it
// contacts anyone (a CPU worker never stands in for a GPU one). On a machine without a GPU that
// is any cuda:N; with one, a GPU it does not have.
TEST(Job, AnAgentOfferingADeviceItCannotOpenIsRefusedBeforeAnythingStarts) {
  testing::TempDir dir;
  const int gpus = comm::cuda_device_count();
  const std::string missing = "cuda:" + std::to_string(gpus);
  for (const char* device : {missing.c_str(), "tpu:0", "cpu:x"}) {
    std::string out = dir.path() + "/agent.out";
    coordinator::ChildProcess agent({{testing::troupe_binary(), "agent", "--join", "127.0.0.1:1",
                                      "--token-file", "/nonexistent/token", "--devices", device},
                                     out,
                                     out,
                                     {}});
    auto status = agent.wait(30s);
    ASSERT_TRUE(status);
    EXPECT_EQ(WEXITSTATUS(*status), 2) << device;
    const std::string text = testing::text_of(out);
    EXPECT_NE(text.find(std::string("device '") + device + "'"), std::string::npos) << text;
    if (device == missing) {  // (a build without nvcc, as the sanitizers': no CUDA support)
      EXPECT_TRUE(text.find(gpus == 0 ? "no CUDA device" : "GPU(s)") != std::string::npos ||
                  text.find("this build has no CUDA device support") != std::string::npos)
          << text;
    }
  }
}

// cluster.devices = "cuda" where no GPU can be opened: exit 2 naming the key and why, before a
// run directory or an agent exists; "auto" (the default) trains on the CPU there. `troupe
// version` says whether the CUDA module loads (this build has it wherever nvcc was found).
TEST(Job, CudaDevicesWhereThereAreNoneAreRefusedAndAutoTrainsOnTheCpu) {
  if (comm::cuda_device_count() > 0) GTEST_SKIP() << "a GPU is here: tests/gpu cover this";
  testing::TempDir dir;
  std::string config = write_config(dir, "mlp.toml", kMlp);
  const std::string run_dir = dir.path() + "/cuda";
  const std::string out = dir.path() + "/cuda.out";
  coordinator::ChildProcess refused(
      {{testing::troupe_binary(), "run", config, "--set", "cluster.devices=\"cuda\"", "--set",
        "job.run_dir=\"" + run_dir + "\""},
       out,
       out,
       {}});
  auto st = refused.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 2);
  const std::string text = testing::text_of(out);
  // (named as the --set it came from, not as the file)
  EXPECT_TRUE(
      text.find("--set cluster.devices: cluster.devices = \"cuda\": no CUDA device") !=
          std::string::npos ||
      text.find("--set cluster.devices: cluster.devices = \"cuda\": this build has no CUDA") !=
          std::string::npos)
      << text;
  EXPECT_FALSE(std::filesystem::exists(run_dir)) << "nothing started";
  const std::string version_out = dir.path() + "/version.out";
  coordinator::ChildProcess version(
      {{testing::troupe_binary(), "version"}, version_out, version_out, {}});
  ASSERT_TRUE(version.wait(60s));
  const std::string said = testing::text_of(version_out);
  EXPECT_TRUE(said.find("CUDA workers: none (no CUDA device") != std::string::npos ||
              said.find("CUDA workers: none (this build has no CUDA") != std::string::npos)
      << "the CUDA module did not load in troupe: " << said;
}

// The benchmarks keep what the user had (bench checkpoint --dir removed the directory given,
// with every file in it) and refuse what they would not run as asked before any process starts.
TEST(Command, BenchmarksKeepTheUsersFilesAndRefuseWhatTheyCannotRun) {
  testing::TempDir dir;
  const std::string mine = dir.path() + "/mine";
  std::filesystem::create_directories(mine + "/sub");
  std::ofstream(mine + "/sentinel.txt") << "keep";
  auto [rc, said] = troupe_says(dir, {"bench", "checkpoint", "--params", "1", "--dir", mine});
  EXPECT_EQ(rc, 0) << said;
  EXPECT_TRUE(std::filesystem::exists(mine + "/sentinel.txt")) << said;
  EXPECT_TRUE(std::filesystem::exists(mine + "/sub"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(mine), {}), 2) << "left behind";
  const struct {
    std::vector<std::string> args;
    const char* expect;
  } refused[] = {
      {{"--sizes", "foo"}, "bad size 'foo' (use 4K, 1M, 64M)"},  // (it said "stod")
      {{"--sizes", "6"}, "size 6 is not a whole number of f32 elements (4 bytes)"},  // (ran 4)
      {{"--sizes", "12", "--dtype", "i64"}, "size 12 is not a whole number of i64 elements"},
      {{"--min-seconds", "abc"}, "--min-seconds"},  // (the workers' refusal, after the start)
      {{"--min-seconds", "-1"}, "--min-seconds"},
  };
  for (const auto& c : refused) {
    std::vector<std::string> args{"bench", "allreduce", "--workers", "2"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    std::tie(rc, said) = troupe_says(dir, args);
    EXPECT_EQ(rc, 2) << c.args[1] << ": " << said;
    EXPECT_NE(said.find(c.expect), std::string::npos) << said;
    EXPECT_EQ(said.find("memcpy"), std::string::npos) << "started: " << said;
  }
  std::tie(rc, said) =  // (taken, and never read)
      troupe_says(dir, {"bench", "model", "--model", "mlp", "--data-path", "/nonexistent"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("--data-path: the mlp trains on synthetic samples"), std::string::npos)
      << said;
}

// Every command and group answers --help (exit 0, under its own name) and names a mistake
// (exit 2): a group without its command lists its commands.
TEST(Command, EveryCommandAndGroupAnswersHelpAndNamesAMistake) {
  testing::TempDir dir;
  struct Case {
    std::vector<std::string> args;
    int rc;
    const char* expect;
  } cases[] = {
      {{"bench"}, 2, "usage: troupe bench COMMAND"},
      {{"bench", "--help"}, 0, "  checkpoint   a checkpoint's copy"},
      {{"bench", "modle"}, 2, "troupe bench: unknown command 'modle'; did you mean 'model'?"},
      {{"demo"}, 2, "  control      two-process control-plane demo"},
      {{"demo", "--help"}, 0, "usage: troupe demo COMMAND"},
      {{"top", "--help"}, 0, "Usage: troupe top"},
      {{"kinds", "--help"}, 0, "usage: troupe kinds (no arguments)"},
      {{"kinds", "extra"}, 2, "troupe kinds: unexpected 'extra'"},
      {{"version", "-h"}, 0, "usage: troupe version (no arguments)"},
      {{"stauts"}, 2, "unknown command 'stauts'; did you mean 'status'?"},
      {{"bench", "model", "--help"}, 0, "--threads"},
      {{"help", "run"}, 0, "Usage: troupe run [OPTIONS] CONFIG"},  // (it was the general help)
      {{"help", "data", "prepare"}, 0, "--max-words"},
      {{"agent", "--join", "garbage", "--token-file", "t"}, 2, "--join garbage is not HOST:PORT"},
      // (the address was UCX's to refuse, with its source line: "(ucx.cpp:105)"; a missing
      // --token-file had the general advice)
      {{"status", "--coordinator", "127.0.0.1", "--token-file", "t"},
       2,
       "troupe status: --coordinator 127.0.0.1 is not HOST:PORT with a port"},
      {{"status", "--coordinator", "127.0.0.1:1"},
       2,
       "--coordinator 127.0.0.1:1 needs --token-file"},
      {{"status", "--coordinator", "127.0.0.1:00", "--token-file", "t"}, 2, "port 0 is none"},
      {{"agent", "--join", "127.0.0.1:0", "--token-file", "t"}, 2, "is not HOST:PORT with a port"},
      {{"stop", "--token-file", "t"}, 2, "--token-file t needs --coordinator HOST:PORT"},
  };
  for (const auto& c : cases) {
    auto [rc, said] = troupe_says(dir, c.args);
    EXPECT_EQ(rc, c.rc) << c.args.back() << ": " << said;
    EXPECT_NE(said.find(c.expect), std::string::npos) << c.args.back() << ": " << said;
  }
  EXPECT_EQ(troupe_says(dir, {"top", "--help"}).second.find("Usage: troupe status"),
            std::string::npos);
  EXPECT_EQ(troupe_says(dir, {"bench"}).second.find("allreduce-worker"), std::string::npos);
  auto [rc, said] = troupe_says(dir, {"stop", "--run-dir", dir.path() + "/none"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("no run directory " + dir.path() + "/none: it does not exist"),
            std::string::npos)
      << said;
  std::ofstream(dir.path() + "/file") << "x";
  std::tie(rc, said) = troupe_says(dir, {"lr", "--run-dir", dir.path() + "/file", "0.1"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("no run directory " + dir.path() + "/file: it is not a directory"),
            std::string::npos)
      << said;
  // A run directory's name longer than a file system's (255 bytes): named, no library text.
  std::tie(rc, said) =
      troupe_says(dir, {"run", std::string(TROUPE_SOURCE_DIR) + "/configs/quickstart.toml", "--set",
                        "job.run_dir=\"" + dir.path() + "/" + std::string(300, 'r') + "\""});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find("cannot create the run directory"), std::string::npos) << said;
  EXPECT_EQ(said.find("filesystem error"), std::string::npos) << said;
  std::filesystem::create_directories(dir.path() + "/empty");
  std::tie(rc, said) = troupe_says(dir, {"stop", "--run-dir", dir.path() + "/empty"});
  EXPECT_EQ(rc, 2) << said;
  EXPECT_NE(said.find(dir.path() + "/empty is not a run directory"), std::string::npos) << said;
}

// A command sent to an address where something other than a coordinator listens (a stale
// coordinator.addr whose port another program took): the reason and exit 1, not an abort in
// UCX's teardown (the endpoint whose connection never formed keeps its first send pending).
TEST(Command, AnAddressWhereSomethingElseListensIsAnErrorNotACrash) {
  testing::TempDir dir;
  std::string at;
  const int s = listening_socket(at);
  ASSERT_GE(s, 0);
  const std::string token = dir.path() + "/job.token";
  std::ofstream(token) << "job-id secret\n";
  std::filesystem::permissions(
      token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  for (const char* command : {"status", "stop"}) {
    auto [rc, said] = troupe_says(dir, {command, "--coordinator", at, "--token-file", token});
    EXPECT_EQ(rc, 1) << command << ": " << said;
    EXPECT_NE(said.find("troupe: cannot reach the job at " + at), std::string::npos) << said;
    EXPECT_EQ(said.find("Bug"), std::string::npos) << said;
  }
  ::close(s);
}

// An agent started before its coordinator listens (hosts started in any order) waits for it, up
// to --join-timeout-ms, saying so once; then it fails naming the address (it failed at once).
TEST(Command, AnAgentWaitsForACoordinatorThatDoesNotListenYet) {
  testing::TempDir dir;
  std::string at;
  const int s = listening_socket(at, /*listen=*/false);
  ASSERT_GE(s, 0);
  const std::string token = dir.path() + "/job.token";
  std::ofstream(token) << "job-id secret\n";
  std::filesystem::permissions(
      token, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  const auto start = std::chrono::steady_clock::now();
  auto [rc, said] =
      troupe_says(dir, {"agent", "--join", at, "--token-file", token, "--join-timeout-ms", "2000"});
  EXPECT_GE(std::chrono::steady_clock::now() - start, 1500ms) << said;
  EXPECT_EQ(rc, 1) << said;
  EXPECT_NE(said.find("no coordinator at " + at + " yet: trying again for up to 2 s"),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("cannot reach the coordinator at " + at), std::string::npos) << said;
  // SIGTERM ends the wait (it went unheard until the wait's end), 128 + 15.
  const std::string out = dir.path() + "/waiting.out";
  coordinator::ChildProcess waiting(
      {{testing::troupe_binary(), "agent", "--join", at, "--token-file", token}, out, out, {}});
  const auto said_by = std::chrono::steady_clock::now() + 30s;
  while (testing::text_of(out).find("no coordinator at") == std::string::npos) {
    ASSERT_LT(std::chrono::steady_clock::now(), said_by) << testing::text_of(out);
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(waiting.signal(SIGTERM));
  auto st = waiting.wait(5s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the waiting agent did not end on SIGTERM";
  EXPECT_EQ(WEXITSTATUS(*st), 128 + SIGTERM) << testing::text_of(out);
  EXPECT_NE(testing::text_of(out).find("interrupted while it waited for the coordinator at " + at),
            std::string::npos)
      << testing::text_of(out);
  ::close(s);
}

// Fault injection lives in the test build only: the release `troupe` given the variables that
// make troupe_test's worker throw trains on without a failure.
TEST(Job, TheReleaseBinaryReadsNoFaultInjection) {
  testing::TempDir dir;
  std::string config = write_config(dir, "mlp.toml", kMlp);
  for (bool release : {true, false}) {
    std::string run_dir = dir.path() + (release ? "/release" : "/test-build");
    std::string out = run_dir + ".out";
    coordinator::ChildProcess p(
        {{release ? TROUPE_RELEASE_BINARY : testing::troupe_binary(), "run", config, "--set",
          "job.run_dir=\"" + run_dir + "\"", "--set", "cluster.agents=2", "--set",
          "elastic.max_restarts=0"},
         out,
         out,
         {"TROUPE_TEST_THROW_AGENT=agent-1", "TROUPE_TEST_THROW_AT_STEP=3"}});
    auto status = p.wait(120s);
    ASSERT_TRUE(status);
    int failures = 0;
    for (auto& l : testing::lines_of(run_dir + "/events.jsonl"))
      failures += l.find("\"worker_failed\"") != std::string::npos;
    EXPECT_EQ(failures, release ? 0 : 1) << (release ? "release" : "test build");
    EXPECT_EQ(WEXITSTATUS(*status), 0);
  }
}

// `troupe coordinator` of the MLP job for 2 agents started by hand, once its address is in the
// run directory (coord null if it is not within 30 s).
struct ByHand {
  testing::TempDir dir;
  std::string run_dir = dir.path() + "/byhand", out = dir.path() + "/coordinator.out";
  std::unique_ptr<coordinator::ChildProcess> coord;
  std::string addr;
  explicit ByHand(const std::vector<std::string>& more = {}) {
    std::vector<std::string> argv{testing::troupe_binary(),
                                  "coordinator",
                                  write_config(dir, "mlp.toml", kMlp),
                                  "--listen",
                                  "127.0.0.1:0",
                                  "--set",
                                  "job.run_dir=\"" + run_dir + "\"",
                                  "--set",
                                  "cluster.agents=2"};
    for (const std::string& s : more) argv.insert(argv.end(), {"--set", s});
    coord = std::make_unique<coordinator::ChildProcess>(
        coordinator::ChildProcess::Options{argv, out, out, {}});
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (testing::lines_of(run_dir + "/coordinator.addr").empty()) {
      if (std::chrono::steady_clock::now() > deadline) {
        coord.reset();
        return;
      }
      std::this_thread::sleep_for(20ms);
    }
    addr = testing::lines_of(run_dir + "/coordinator.addr").at(0);
  }
};

// Three agents started by hand at once for a job of cluster.agents = 2: the one that comes while
// the first generation forms with the other two is asked to join again once it has started,
// and does (it was turned away, exit 1): all three train and end with the job.
TEST(Job, AnAgentMoreThanTheJobAskedForJoinsOnceItHasStarted) {
  ByHand job({"job.steps=150"});
  ASSERT_TRUE(job.coord) << testing::text_of(job.out);
  std::vector<std::unique_ptr<coordinator::ChildProcess>> agents;
  for (int i = 0; i < 3; ++i) {
    const std::string out = job.dir.path() + "/agent" + std::to_string(i) + ".out";
    agents.push_back(std::make_unique<coordinator::ChildProcess>(
        coordinator::ChildProcess::Options{{testing::troupe_binary(), "agent", "--join", job.addr,
                                            "--token-file", job.run_dir + "/job.token"},
                                           out,
                                           out,
                                           {"TROUPE_TEST_STEP_DELAY_US=20000"}}));
  }
  auto cst = job.coord->wait(120s);
  ASSERT_TRUE(cst && WIFEXITED(*cst));
  EXPECT_EQ(WEXITSTATUS(*cst), 0) << testing::text_of(job.out);
  for (int i = 0; i < 3; ++i) {
    auto st = agents[i]->wait(30s);
    ASSERT_TRUE(st && WIFEXITED(*st));
    EXPECT_EQ(WEXITSTATUS(*st), 0)
        << testing::text_of(job.dir.path() + "/agent" + std::to_string(i) + ".out");
  }
  const auto events = testing::lines_of(job.run_dir + "/events.jsonl");
  int joined = 0, of_three = 0;
  for (const auto& e : events) {
    joined += testing::json_field(e, "event") == "member_joined";
    of_three += testing::json_field(e, "event") == "generation_started" &&
                testing::json_field(e, "world_size") == "3";
  }
  EXPECT_EQ(joined, 3);
  EXPECT_GE(of_three, 1);
}

TEST(Job, CoordinatorAndAgentsStartedByHand) {
  ByHand job;
  ASSERT_TRUE(job.coord) << testing::text_of(job.out);
  const testing::TempDir& dir = job.dir;
  const std::string &run_dir = job.run_dir, &addr = job.addr;
  // With a token file of the right job and the wrong token: the join reaches the coordinator's
  // process and is refused there (the agent exits 2 naming the refusal, as for any join that can
  // never be taken; it was 1; nothing joins).
  const std::string bad_token = dir.path() + "/bad.token";
  {
    std::ifstream good(run_dir + "/job.token");
    std::string job_id;
    good >> job_id;
    std::ofstream(bad_token) << job_id << " 0123456789abcdef\n";
  }
  ::chmod(bad_token.c_str(), 0600);
  coordinator::ChildProcess intruder(
      {{testing::troupe_binary(), "agent", "--join", addr, "--token-file", bad_token},
       dir.path() + "/intruder.out",
       dir.path() + "/intruder.out",
       {}});
  auto ist = intruder.wait(30s);
  ASSERT_TRUE(ist && WIFEXITED(*ist));
  EXPECT_EQ(WEXITSTATUS(*ist), 2);
  const std::string said = testing::text_of(dir.path() + "/intruder.out");
  EXPECT_NE(said.find("join refused: troupe.refused: wrong job id or token for this job"),
            std::string::npos)
      << said;
  // An admin command with that token: refused, exit 2 (it can never be valid; it was 1, "cannot
  // now").
  auto [rc, refused] =
      troupe_says(dir, {"status", "--coordinator", addr, "--token-file", bad_token});
  EXPECT_EQ(rc, 2) << refused;
  EXPECT_NE(refused.find("refused: wrong job id or token for this job"), std::string::npos)
      << refused;
  // The second agent's copy of the token can be read by others: it joins, with a warning.
  const std::string open_token = dir.path() + "/open.token";
  std::filesystem::copy_file(run_dir + "/job.token", open_token);
  ::chmod(open_token.c_str(), 0644);
  std::vector<std::unique_ptr<coordinator::ChildProcess>> agents;
  for (int i = 0; i < 2; ++i) {
    agents.push_back(std::make_unique<coordinator::ChildProcess>(coordinator::ChildProcess::Options{
        {testing::troupe_binary(), "agent", "--join", addr, "--token-file",
         i == 0 ? run_dir + "/job.token" : open_token},
        dir.path() + "/agent" + std::to_string(i) + ".out",
        dir.path() + "/agent" + std::to_string(i) + ".out",
        {}}));
  }
  auto cst = job.coord->wait(120s);
  ASSERT_TRUE(cst && WIFEXITED(*cst));
  EXPECT_EQ(WEXITSTATUS(*cst), 0);
  for (auto& a : agents) {
    auto st = a->wait(30s);
    ASSERT_TRUE(st && WIFEXITED(*st));
    EXPECT_EQ(WEXITSTATUS(*st), 0);
  }
  EXPECT_EQ(testing::committed_losses(run_dir).size(), 30u);
  auto said_by = [&](int i) {
    return testing::text_of(dir.path() + "/agent" + std::to_string(i) + ".out");
  };
  EXPECT_EQ(said_by(0).find("can be read by others"), std::string::npos) << said_by(0);
  EXPECT_NE(said_by(1).find("can be read by others (mode 644)"), std::string::npos) << said_by(1);
}

// A coordinator listening on every interface (0.0.0.0) is joined through another host's view of
// it: an interface that is not loopback (a veth pair in a network namespace of the test's own,
// with its own /sys for UCX to find it). It advertises that address, not 0.0.0.0, and the agent
// joins. (UCX was handed the connection over loopback and offered the joiner loopback's
// addresses: "Operation rejected by remote peer", exit 1.)
TEST(Job, ACoordinatorOnEveryInterfaceIsJoinedThroughOneThatIsNotLoopback) {
  testing::TempDir dir;
  const std::string config = write_config(dir, "mlp.toml", kMlp), d = dir.path();
  const std::string t = testing::troupe_binary(), out = d + "/netns.out";
  const std::string script =
      "mount -t sysfs sysfs /sys && ip link set lo up && "
      "ip link add v0 type veth peer name v1 && ip addr add 10.200.0.1/24 dev v0 && "
      "ip link set v1 up && ip link set v0 up || exit 77\n"
      "timeout 120 '" +
      t + "' coordinator '" + config +
      "' --listen 0.0.0.0:0 --set "
      "'job.run_dir=\"" +
      d + "/run\"' --set cluster.agents=1 > '" + d +
      "/coord.out' 2>&1 &\n"
      "c=$!; i=0\n"
      "while [ ! -s '" +
      d +
      "/run/coordinator.addr' ] && [ $i -lt 300 ]; do sleep 0.1; "
      "i=$((i+1)); done\n"
      "addr=$(cat '" +
      d +
      "/run/coordinator.addr'); echo \"advertised $addr\"\n"
      "timeout 120 '" +
      t + "' agent --join \"10.200.0.1:${addr##*:}\" --token-file '" + d + "/run/job.token' > '" +
      d +
      "/agent.out' 2>&1\n"
      "a=$?; echo \"agent $a\"; [ $a -eq 0 ] || kill $c\n"
      "wait $c; echo \"coordinator $?\"\n";
  coordinator::ChildProcess p(
      {{"/usr/bin/unshare", "-n", "-m", "/bin/sh", "-c", script}, out, out, {}});
  auto st = p.wait(200s);
  ASSERT_TRUE(st && WIFEXITED(*st)) << "the script did not end";
  const std::string said = testing::text_of(out);
  if (WEXITSTATUS(*st) == 77 || said.find("unshare") == 0)
    GTEST_SKIP() << "no network namespace with a veth pair here (needs CAP_SYS_ADMIN): " << said;
  EXPECT_NE(said.find("advertised 10.200.0.1:"), std::string::npos) << said;
  EXPECT_NE(said.find("agent 0\n"), std::string::npos)
      << said << testing::text_of(d + "/agent.out");
  EXPECT_NE(said.find("coordinator 0\n"), std::string::npos)
      << said << testing::text_of(d + "/coord.out");
  EXPECT_EQ(testing::committed_losses(d + "/run").size(), 30u);
}

// An agent started by hand takes the job's heartbeats and failure timeout once it has joined, as
// the launcher's do: a coordinator stopped for 4 s, within the job's 10 s, is not lost to it (it
// kept its command line's 3 s and cut the coordinator off; the job lost it).
TEST(Job, AnAgentStartedByHandTakesTheJobsFailureTimeout) {
  ByHand job({"elastic.failure_timeout_ms=10000", "cluster.agents=1", "job.steps=100000"});
  ASSERT_TRUE(job.coord) << testing::text_of(job.out);
  const std::string agent_out = job.dir.path() + "/agent.out";
  coordinator::ChildProcess agent({{testing::troupe_binary(), "agent", "--join", job.addr,
                                    "--token-file", job.run_dir + "/job.token"},
                                   agent_out,
                                   agent_out,
                                   {testing::pace(20000)}});
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (testing::committed_losses(job.run_dir).size() < 3) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << testing::text_of(agent_out);
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(job.coord->signal(SIGSTOP));
  std::this_thread::sleep_for(4s);
  ASSERT_TRUE(job.coord->signal(SIGCONT));
  const size_t before = testing::committed_losses(job.run_dir).size();
  while (testing::committed_losses(job.run_dir).size() < before + 5) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline + 30s) << testing::text_of(agent_out);
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(testing::text_of(agent_out).find("coordinator was lost"), std::string::npos)
      << testing::text_of(agent_out);
  EXPECT_EQ(testing::text_of(job.run_dir + "/events.jsonl").find("member_failed"),
            std::string::npos);
  troupe_says(job.dir, {"stop", "--run-dir", job.run_dir});
  auto cst = job.coord->wait(60s);
  ASSERT_TRUE(cst && WIFEXITED(*cst));
  EXPECT_EQ(WEXITSTATUS(*cst), 0) << testing::text_of(job.out);
}

// Fewer agents than cluster.agents by elastic.start_timeout_ms: with at least
// elastic.min_workers ready the job starts with them, and the one that comes later joins (it
// failed: "only 1 of 2 workers became ready"); with fewer, it fails naming the minimum.
TEST(Job, AJobShortOfAgentsAtItsStartTimeoutStartsWithMinWorkers) {
  for (const char* min : {"1", "2"}) {
    ByHand job({"elastic.start_timeout_ms=8000", std::string("elastic.min_workers=") + min,
                "job.steps=100000"});
    ASSERT_TRUE(job.coord) << testing::text_of(job.out);
    auto agent = [&](const std::string& name) {
      const std::string out = job.dir.path() + "/" + name + ".out";
      return std::make_unique<coordinator::ChildProcess>(coordinator::ChildProcess::Options{
          {testing::troupe_binary(), "agent", "--join", job.addr, "--token-file",
           job.run_dir + "/job.token", "--name", name},
          out,
          out,
          {testing::pace(20000)}});
    };
    auto first = agent("first");
    testing::Job view{job.run_dir, job.out, nullptr};
    if (std::string(min) == "2") {
      auto st = job.coord->wait(60s);
      ASSERT_TRUE(st && WIFEXITED(*st));
      EXPECT_EQ(WEXITSTATUS(*st), 1);
      EXPECT_NE(testing::text_of(job.out).find("only 1 of 2 workers became ready within 8000 ms "
                                               "(elastic.start_timeout_ms); it starts with at "
                                               "least 2 (elastic.min_workers)"),
                std::string::npos)
          << testing::text_of(job.out);
      continue;
    }
    ASSERT_NE(testing::wait_event(view, testing::is("generation_started", "world_size", "1"), 60s),
              "")
        << testing::text_of(job.out);
    EXPECT_NE(testing::text_of(job.out).find("starting with 1 of 2 workers, those ready within "
                                             "8000 ms"),
              std::string::npos)
        << testing::text_of(job.out);
    auto second = agent("second");
    EXPECT_NE(testing::wait_event(view, testing::is("generation_started", "world_size", "2"), 60s),
              "")
        << testing::text_of(job.out);
    troupe_says(job.dir, {"stop", "--run-dir", job.run_dir});
    auto st = job.coord->wait(60s);
    ASSERT_TRUE(st && WIFEXITED(*st));
    EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
  }
}

// An agent started by hand and lost before the first generation leaves the job, which goes on
// waiting for enough workers (elastic.start_timeout_ms): two others join and it trains to the end.
TEST(Job, AHandStartedAgentLostBeforeTheStartLeavesAndOthersStartTheJob) {
  ByHand job;
  ASSERT_TRUE(job.coord) << testing::text_of(job.out);
  const testing::TempDir& dir = job.dir;
  const std::string &run_dir = job.run_dir, &out = job.out, &addr = job.addr;
  auto agent = [&](const std::string& name) {
    return std::make_unique<coordinator::ChildProcess>(
        coordinator::ChildProcess::Options{{testing::troupe_binary(), "agent", "--join", addr,
                                            "--token-file", run_dir + "/job.token", "--name", name},
                                           dir.path() + "/" + name + ".out",
                                           dir.path() + "/" + name + ".out",
                                           {}});
  };
  auto count = [&](const char* event) {
    int n = 0;
    for (const auto& l : testing::lines_of(run_dir + "/events.jsonl"))
      n += testing::json_field(l, "event") == event;
    return n;
  };
  auto lost = agent("lost");
  auto deadline = std::chrono::steady_clock::now() + 30s;
  while (count("member_joined") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << testing::text_of(out);
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_EQ(::kill(lost->pid(), SIGKILL), 0);
  deadline = std::chrono::steady_clock::now() + 30s;
  while (count("member_failed") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << testing::text_of(out);
    std::this_thread::sleep_for(20ms);
  }
  auto a = agent("a"), b = agent("b");
  auto st = job.coord->wait(120s);
  ASSERT_TRUE(st && WIFEXITED(*st));
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(out);
  EXPECT_EQ(testing::committed_losses(run_dir).size(), 30u);
  EXPECT_NE(testing::text_of(out).find("lost was lost before training started; waiting for 2 "
                                       "workers (0 ready)"),
            std::string::npos)
      << testing::text_of(out);
  for (auto* p : {a.get(), b.get()}) {
    auto s = p->wait(30s);
    EXPECT_TRUE(s && WIFEXITED(*s) && WEXITSTATUS(*s) == 0);
  }
}

TEST(Job, BelowMinWorkersWithNobodyReturningTheJobFailsAfterTheRejoinTimeout) {
  // Losing a member below elastic.min_workers pauses the job; with no restarts and nobody
  // joining, it fails when elastic.rejoin_timeout_ms runs out: with a clear reason, never a
  // hang, and nothing left running.
  testing::TempDir dir;
  testing::Job job =
      testing::start_job(dir, "kill", kMlp, 3,
                         {"job.steps=1000000", "elastic.min_workers=3", "elastic.max_restarts=0",
                          "elastic.rejoin_timeout_ms=300"});
  const std::string run_dir = job.run_dir;
  testing::wait_steps(job, 5);
  auto pids = testing::member_pids(dir, job);
  ASSERT_EQ(pids.size(), 3u);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(pids[1], SIGKILL), 0);
  auto st = job.proc->wait(30s);
  ASSERT_TRUE(st) << "troupe run hung after losing an agent";
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("troupe run exited %.2f s after SIGKILL of an agent\n", secs);
  EXPECT_EQ(WEXITSTATUS(*st), 1);
  auto output = testing::lines_of(job.out);
  ASSERT_FALSE(output.empty());
  EXPECT_NE(output.back().find("was lost"), std::string::npos) << output.back();
  EXPECT_NE(output.back().find("elastic.rejoin_timeout_ms = 300"), std::string::npos)
      << output.back();
  auto events = testing::lines_of(run_dir + "/events.jsonl");
  bool paused = false;
  for (auto& e : events) paused |= testing::json_field(e, "event") == "job_paused";
  EXPECT_TRUE(paused);
  EXPECT_EQ(testing::json_field(events.back(), "event"), "job_failed");
  for (int pid : pids) EXPECT_NE(::kill(pid, 0), 0) << "agent " << pid << " is still running";
}

// The local launcher's only agent killed with its restarts spent (elastic.max_restarts = 0): no
// agent is alive or starting, nothing holds the state, and the job fails at once naming the
// give-up, not when elastic.rejoin_timeout_ms (here 120 s) runs out.
TEST(Job, WithEveryAgentGivenUpByTheLauncherTheJobFailsAtOnce) {
  testing::TempDir dir;
  testing::Job job = testing::start_job(
      dir, "given-up", kMlp, 1,
      {"job.steps=1000000", "elastic.max_restarts=0", "elastic.rejoin_timeout_ms=120000"},
      {testing::pace(20000)});
  testing::wait_steps(job, 5);
  ASSERT_EQ(::kill(testing::pid_of(job, "agent-0"), SIGKILL), 0);
  auto st = job.proc->wait(30s);
  ASSERT_TRUE(st) << "the job waited for the rejoin timeout";
  EXPECT_EQ(WEXITSTATUS(*st), 1);
  const std::string end = testing::events_of(job).back();
  EXPECT_EQ(testing::json_field(end, "event"), "job_failed") << end;
  EXPECT_NE(end.find("no agent is left: the launcher gave up on its agents (agent-0 killed by "
                     "signal 9"),
            std::string::npos)
      << end;
}

// One agent given up early on (agent-1, its restarts spent) and the other then stopped (SIGSTOP):
// the pause does not fail the job at once, for the stopped one's launcher ends it and starts it
// again once its grace is over (2 x 2 + 10 s), and the job resumes with it.
TEST(Job, APauseWaitsForALostAgentTheLauncherWillStartAgain) {
  testing::TempDir dir;
  testing::Job job =
      testing::start_job(dir, "one-left", kMlp, 2,
                         {"job.steps=1000000", "elastic.max_restarts=1",
                          "elastic.failure_timeout_ms=2000", "elastic.rejoin_timeout_ms=120000"},
                         {testing::pace(20000)});
  testing::wait_steps(job, 5);
  int victim = testing::pid_of(job, "agent-1");
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  const std::string restarted = testing::wait_event(job, testing::is("agent_restarted"), 30s);
  ASSERT_NE(restarted, "");
  ASSERT_EQ(::kill(std::atoi(testing::json_field(restarted, "pid").c_str()), SIGKILL), 0);
  ASSERT_NE(testing::wait_event(job, testing::is("agent_gave_up"), 30s), "");
  ASSERT_EQ(::kill(testing::pid_of(job, "agent-0"), SIGSTOP), 0);
  ASSERT_NE(testing::wait_event(job, testing::is("job_paused"), 30s), "");
  EXPECT_NE(testing::wait_event(job, testing::is("job_resumed"), 60s), "")
      << testing::text_of(job.out);
  EXPECT_EQ(testing::count_events(job, "job_failed"), 0);
  testing::admin(dir, {"stop", "--run-dir", job.run_dir});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << testing::text_of(job.out);
}

// Its only agent alive gave its worker up (elastic.worker_max_restarts spent: a fault that
// recurs): the pause fails the job at once, naming the fault (it waited rejoin_timeout_ms,
// though nothing of the job's own could train again).
TEST(Job, APauseWhoseAgentsGaveEveryWorkerUpFailsAtOnce) {
  testing::TempDir dir;
  testing::Job job = testing::start_job(
      dir, "given-up", kMlp, 1,
      {"job.steps=1000000", "elastic.worker_max_restarts=0", "elastic.rejoin_timeout_ms=120000"},
      {testing::pace(20000), "TROUPE_TEST_THROW_AGENT=agent-0", "TROUPE_TEST_THROW_AT_STEP=5"});
  auto st = job.proc->wait(60s);
  ASSERT_TRUE(st) << "the job waited for workers that never come";
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(job.out);
  const std::string end = testing::events_of(job).back();
  EXPECT_EQ(testing::json_field(end, "event"), "job_failed") << end;
  EXPECT_NE(end.find("no worker is left: every agent alive gave its workers up"), std::string::npos)
      << end;
  EXPECT_NE(end.find("injected fault at step 4"), std::string::npos) << end;
}

TEST(Job, StatusAndStopAgainstARunningJob) {
  testing::TempDir dir;
  std::string config = write_config(dir, "long.toml", kMlp);
  std::string run_dir = dir.path() + "/long";
  std::string out = dir.path() + "/long.out";
  coordinator::ChildProcess run(
      {{testing::troupe_binary(), "run", config, "--set", "job.steps=1000000", "--set",
        "job.run_dir=\"" + run_dir + "\"", "--set", "cluster.agents=2"},
       out,
       out,
       {}});
  // Wait for a few committed steps.
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (testing::committed_losses(run_dir).size() < 5) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the job made no progress";
    std::this_thread::sleep_for(50ms);
  }
  auto status_out = dir.path() + "/status.out";
  coordinator::ChildProcess status(
      {{testing::troupe_binary(), "status", "--run-dir", run_dir, "--json"},
       status_out,
       status_out,
       {}});
  auto st = status.wait(30s);
  ASSERT_TRUE(st && WIFEXITED(*st) && WEXITSTATUS(*st) == 0);
  std::string json = testing::lines_of(status_out).at(0);
  EXPECT_EQ(testing::json_field(json, "state"), "running") << json;
  EXPECT_EQ(testing::json_field(json, "generation"), "1") << json;
  EXPECT_NE(json.find("\"rank\":1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\":"), std::string::npos) << json;
  // The data plane the members chose, and why.
  EXPECT_EQ(testing::json_field(json, "data_plane"),
            "host-staged over UCX: rank 0 computes on the CPU")
      << json;
  // MFU, naming its peak: 2 workers of 1 thread on this CPU (its clock from /proc/cpuinfo).
  EXPECT_EQ(testing::json_field(json, "peak").rfind("2 x cpu", 0), 0u) << json;
  EXPECT_GT(std::stod(testing::json_field(json, "model_tflops_per_s")), 0) << json;
  if (testing::json_field(json, "mfu") != "null") {
    EXPECT_GT(std::stod(testing::json_field(json, "mfu")), 0) << json;
    EXPECT_LT(std::stod(testing::json_field(json, "mfu")), 1) << json;
  }
  // Each step's model FLOPs: 3 x 2 x (64 x 64 + 64 x 10) per sample, 50 samples, whichever
  // worker computed them; the MFU is that over the step's time and the two workers' peak.
  for (const auto& line : testing::lines_of(run_dir + "/metrics.jsonl")) {
    if (testing::json_field(line, "model_flops").empty()) continue;  // (a checkpoint's line)
    EXPECT_DOUBLE_EQ(std::stod(testing::json_field(line, "model_flops")), 6.0 * 4736 * 50) << line;
    if (testing::json_field(line, "mfu").empty()) continue;
    const double seconds = std::stod(testing::json_field(line, "step_seconds"));
    const double peak = std::stod(testing::json_field(line, "peak_tflops_per_s")) * 1e12;
    const double mfu = 6.0 * 4736 * 50 / seconds / peak;
    EXPECT_NEAR(std::stod(testing::json_field(line, "mfu")), mfu, 1e-4 * mfu) << line;
  }

  // A wrong token is refused.
  std::ofstream(dir.path() + "/wrong.token") << "equiv not-the-token\n";
  std::string addr = testing::lines_of(run_dir + "/coordinator.addr").at(0);
  coordinator::ChildProcess bad({{testing::troupe_binary(), "status", "--coordinator", addr,
                                  "--token-file", dir.path() + "/wrong.token"},
                                 dir.path() + "/bad.out",
                                 dir.path() + "/bad.out",
                                 {}});
  auto bst = bad.wait(60s);
  ASSERT_TRUE(bst && WIFEXITED(*bst));
  EXPECT_NE(WEXITSTATUS(*bst), 0);
  // The answer (the client's own log lines may come after it: look at every line).
  auto bad_out = testing::lines_of(dir.path() + "/bad.out");
  bool said = false;
  for (auto& l : bad_out) said |= l.find("refused: wrong job id or token") != std::string::npos;
  EXPECT_TRUE(said) << (bad_out.empty() ? "(no output)" : bad_out.front());

  coordinator::ChildProcess stop(
      {{testing::troupe_binary(), "stop", "--run-dir", run_dir}, "", "", {}});
  auto sst = stop.wait(30s);
  ASSERT_TRUE(sst && WIFEXITED(*sst) && WEXITSTATUS(*sst) == 0);
  auto rst = run.wait(60s);
  ASSERT_TRUE(rst) << "the job did not stop";
  EXPECT_EQ(WEXITSTATUS(*rst), 0);
  auto events = testing::lines_of(run_dir + "/events.jsonl");
  EXPECT_EQ(testing::json_field(events.back(), "event"), "job_finished");
  EXPECT_EQ(testing::json_field(events.back(), "state"), "stopped");
  EXPECT_EQ(testing::json_field(events.back(), "identical_parameters"), "true");
  // A plain stop with no checkpoint says that nothing resumes or exports from it, and how.
  EXPECT_NE(testing::text_of(out).find("it wrote no checkpoint, so nothing resumes or exports"),
            std::string::npos)
      << testing::text_of(out);
  // The job ended: a command for it says so (not a transport error), and a bad value is named.
  const std::string ended = "no coordinator runs the job in " + run_dir + ": it ended at step ";
  for (std::vector<std::string> args : {std::vector<std::string>{"stop"},
                                        {"checkpoint"},
                                        {"scale", "--workers", "3"},
                                        {"lr", "0.01"}}) {
    args.insert(args.end(), {"--run-dir", run_dir});
    auto [rc, said] = troupe_says(dir, args);
    EXPECT_EQ(rc, 1) << args[0] << ": " << said;
    EXPECT_NE(said.find(ended), std::string::npos) << args[0] << ": " << said;
  }
  // Watching it shows how it ended, as troupe status does.
  for (const char* watch : {"top", "status --watch"}) {
    std::vector<std::string> args{watch == std::string("top") ? "top" : "status"};
    if (args[0] == "status") args.push_back("--watch");
    args.insert(args.end(), {"--run-dir", run_dir});
    auto [rc, said] = troupe_says(dir, args);
    EXPECT_EQ(rc, 0) << watch << ": " << said;
    EXPECT_NE(said.find(": finished (stopped) at step "), std::string::npos)
        << watch << ": " << said;
  }
  auto [export_rc, export_said] = troupe_says(
      dir, {"export", run_dir, "-o", dir.path() + "/m.safetensors", "--batch-of-step", "3"});
  EXPECT_EQ(export_rc, 2) << export_said;
  EXPECT_NE(export_said.find("this run's data.kind is 'synthetic'"), std::string::npos)
      << export_said;
  auto [lr_rc, lr_said] = troupe_says(dir, {"lr", "--run-dir", run_dir, "abc"});
  EXPECT_EQ(lr_rc, 2) << lr_said;
  EXPECT_NE(lr_said.find("abc is not a number in [1e-12, 1000]"), std::string::npos) << lr_said;
}

}  // namespace
}  // namespace troupe
