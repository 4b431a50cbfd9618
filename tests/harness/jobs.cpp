#include "tests/harness/jobs.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

namespace troupe::testing {

using namespace std::chrono_literals;

std::string pace(int step_delay_us) {
  return "TROUPE_TEST_STEP_DELAY_US=" + std::to_string(step_delay_us);
}

Job start_job(const TempDir& dir, const std::string& name, const std::string& config_text,
              int agents, const std::vector<std::string>& sets, const std::vector<std::string>& env,
              const std::vector<std::string>& args) {
  Job j;
  std::string config = dir.path() + "/" + name + ".toml";
  std::ofstream(config) << config_text;
  j.run_dir = dir.path() + "/" + name;
  j.out = j.run_dir + ".out";
  std::vector<std::string> argv{troupe_binary(),
                                "run",
                                config,
                                "--set",
                                "job.run_dir=\"" + j.run_dir + "\"",
                                "--set",
                                "cluster.agents=" + std::to_string(agents)};
  for (auto& s : sets) {
    argv.push_back("--set");
    argv.push_back(s);
  }
  argv.insert(argv.end(), args.begin(), args.end());
  j.proc = std::make_unique<coordinator::ChildProcess>(
      coordinator::ChildProcess::Options{argv, j.out, j.out, env});
  return j;
}

std::vector<std::string> events_of(const Job& job) {
  return lines_of(job.run_dir + "/events.jsonl");
}

int count_events(const Job& job, const std::string& kind) {
  int n = 0;
  for (auto& e : events_of(job)) n += json_field(e, "event") == kind;
  return n;
}

std::function<bool(const std::string&)> is(const std::string& kind, const std::string& key,
                                           const std::string& value) {
  return [=](const std::string& e) {
    return json_field(e, "event") == kind && (key.empty() || json_field(e, key) == value);
  };
}

std::string wait_event(const Job& job, const std::function<bool(const std::string&)>& pred,
                       std::chrono::seconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {  // at least one look, even with a zero timeout
    for (auto& e : events_of(job))
      if (pred(e)) return e;
    if (std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(10ms);
  }
  return "";
}

void wait_steps(const Job& job, size_t steps) {
  auto deadline = std::chrono::steady_clock::now() + 60s;
  while (committed_losses(job.run_dir).size() < steps) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no progress";
    std::this_thread::sleep_for(10ms);
  }
}

int pid_of(const Job& job, const std::string& name) {
  int pid = 0;
  for (auto& e : events_of(job))
    if (json_field(e, "event") == "member_joined" && json_field(e, "name") == name)
      pid = std::atoi(json_field(e, "pid").c_str());
  // Never 0 (kill(0, ...) signals the test's own process group) nor -1 (every process).
  if (pid <= 0) ADD_FAILURE() << "no pid for agent '" << name << "' in " << job.run_dir;
  return pid > 0 ? pid : INT32_MAX;
}

std::vector<int> joined_pids(const Job& job) {
  std::vector<int> pids;
  for (auto& e : events_of(job)) {
    if (json_field(e, "event") != "member_joined") continue;
    const int pid = std::atoi(json_field(e, "pid").c_str());
    if (pid > 0 && std::find(pids.begin(), pids.end(), pid) == pids.end()) pids.push_back(pid);
  }
  return pids;
}

std::vector<MemberInfo> members_of(const TempDir& dir, const Job& job) {
  std::string out = dir.path() + "/status.out";
  std::remove(out.c_str());  // (the child appends: the last call's answer must not be read)
  coordinator::ChildProcess status(
      {{troupe_binary(), "status", "--run-dir", job.run_dir, "--json"}, out, out, {}});
  status.wait(30s);
  std::vector<MemberInfo> members;
  auto lines = lines_of(out);
  if (lines.empty()) return members;
  auto json = nlohmann::json::parse(lines[0], nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.contains("members")) return members;
  for (const auto& m : json["members"])  // (not standbys)
    members.push_back({m.value("agent", uint64_t(0)), m.value("name", ""), m.value("pid", 0)});
  return members;
}

std::vector<int> member_pids(const TempDir& dir, const Job& job) {
  std::vector<int> pids;
  for (const auto& m : members_of(dir, job)) pids.push_back(m.pid);
  return pids;
}

std::unique_ptr<coordinator::ChildProcess> join_agent(const TempDir& dir, const Job& job,
                                                      const std::string& name,
                                                      const std::vector<std::string>& env) {
  // (The coordinator writes its address once it listens: a join right after start_job waits.)
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (lines_of(job.run_dir + "/coordinator.addr").empty() &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(50ms);
  std::string addr = lines_of(job.run_dir + "/coordinator.addr").at(0);
  std::string out = dir.path() + "/" + name + ".out";
  return std::make_unique<coordinator::ChildProcess>(
      coordinator::ChildProcess::Options{{troupe_binary(), "agent", "--join", addr, "--token-file",
                                          job.run_dir + "/job.token", "--name", name},
                                         out,
                                         out,
                                         env});
}

std::string final_checksum(const Job& job) {
  auto events = events_of(job);
  if (events.empty()) return "";
  const std::string& last = events.back();
  auto at = last.find("\"checksums\":[\"");
  if (at == std::string::npos) return "";
  at += 14;
  return last.substr(at, last.find('"', at) - at);
}

std::string admin(const TempDir& dir, std::vector<std::string> args, int expect_rc) {
  std::string out = dir.path() + "/admin.out";
  args.insert(args.begin(), troupe_binary());
  coordinator::ChildProcess p({args, out, out, {}});
  auto st = p.wait(60s);
  EXPECT_TRUE(st) << args[1] << " did not answer";
  auto lines = lines_of(out);
  if (st) {
    EXPECT_EQ(WEXITSTATUS(*st), expect_rc) << (lines.empty() ? "" : lines.back());
  }
  return text_of(out);
}

void expect_same_function(const Job& job, const std::vector<double>& want, int steps,
                          long global_batch, double relative) {
  auto st = job.proc->wait(120s);
  ASSERT_TRUE(st) << "the job did not finish";
  auto out = lines_of(job.out);
  EXPECT_EQ(WEXITSTATUS(*st), 0) << (out.empty() ? "" : out.back());
  auto events = events_of(job);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(json_field(events.back(), "event"), "job_finished") << events.back();
  EXPECT_EQ(json_field(events.back(), "identical_parameters"), "true") << events.back();
  auto got = committed_losses(job.run_dir);
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (relative == 0) {
      ASSERT_EQ(got[i], want[i]) << "step " << i << " (bitwise)";
    }
    ASSERT_NEAR(got[i], want[i], relative * std::abs(want[i])) << "step " << i;
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::max(1e-300, std::abs(want[i])));
  }
  std::printf("losses: the largest relative difference from the reference is %.3g\n", worst);
  check_ledger(job.run_dir, steps, global_batch);
  for (auto& e : events) {
    auto kind = json_field(e, "event");
    if (kind != "step_committed" && kind != "job_started") std::printf("%s\n", e.c_str());
  }
}

}  // namespace troupe::testing
