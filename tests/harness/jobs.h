// `troupe run` jobs in the elasticity and pipeline tests: start one from a config text, watch its
// events.jsonl, act on its agents, and check what every scenario must end with (the job
// finishes, the members agree, the losses equal a static run's, the ledger shows every sample
// once).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/process.h"
#include "tests/harness/harness.h"

namespace troupe::testing {

struct Job {
  std::string run_dir, out;
  std::unique_ptr<coordinator::ChildProcess> proc;
};

// Paces every step of a job (TROUPE_TEST_STEP_DELAY_US; the numbers are unchanged) so that a
// test has time to act between steps.
std::string pace(int step_delay_us);

// `troupe run CONFIG --set job.run_dir=... --set cluster.agents=N --set S... ARGS...` with env.
Job start_job(const TempDir& dir, const std::string& name, const std::string& config_text,
              int agents, const std::vector<std::string>& sets = {},
              const std::vector<std::string>& env = {}, const std::vector<std::string>& args = {});

std::vector<std::string> events_of(const Job& job);
int count_events(const Job& job, const std::string& kind);
// A predicate on an event line: its "event" is kind (and key == value, when given).
std::function<bool(const std::string&)> is(const std::string& kind, const std::string& key = "",
                                           const std::string& value = "");
// The first event matching pred within timeout (at least one look); "" if none.
std::string wait_event(const Job& job, const std::function<bool(const std::string&)>& pred,
                       std::chrono::seconds timeout = std::chrono::seconds(60));
// Waits (at most 60 s) for `steps` committed steps; a gtest failure if they do not come.
void wait_steps(const Job& job, size_t steps);
// The pid of the newest incarnation of an agent named `name`, from its member_joined event; a
// test failure and a pid that matches no process (never 0 or -1) when there is none.
int pid_of(const Job& job, const std::string& name);
// The pid of every agent that ever joined, from the member_joined events, in order (no process
// started: quick where `troupe status` is slow, as under a sanitizer).
std::vector<int> joined_pids(const Job& job);
// The members by rank in the current generation (`troupe status --json`), and their pids.
struct MemberInfo {
  uint64_t agent = 0;  // the agent id (what drain --agent takes)
  std::string name;    // its name (agent-N: the launcher's slot, and its log file)
  int pid = 0;
};
std::vector<MemberInfo> members_of(const TempDir& dir, const Job& job);
std::vector<int> member_pids(const TempDir& dir, const Job& job);
// `troupe agent --join` of a running job, named `name` (logs in DIR/NAME.out); waits (60 s at
// most) for the coordinator to write its address.
std::unique_ptr<coordinator::ChildProcess> join_agent(const TempDir& dir, const Job& job,
                                                      const std::string& name,
                                                      const std::vector<std::string>& env = {});
// The first member's parameter checksum in the job's job_finished event ("" if none).
std::string final_checksum(const Job& job);
// Runs `troupe ARGS...` (status, drain, scale, checkpoint, ...), expects exit expect_rc within
// 60 s; returns what it printed.
std::string admin(const TempDir& dir, std::vector<std::string> args, int expect_rc = 0);

// The job finishes (exit 0) with identical parameters on every member, per-step losses equal to
// `want` within `relative` (0: bitwise; the losses are written at full precision), and a ledger
// with every sample of every step exactly once. Prints the job's events other than committed
// steps.
void expect_same_function(const Job& job, const std::vector<double>& want, int steps,
                          long global_batch, double relative = 1e-4);

}  // namespace troupe::testing
