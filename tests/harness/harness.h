// The multi-process test harness: starts `troupe` processes in their own process groups, reads
// their event lines with deadlines, signals them by PID, and always ends them (RAII), printing
// the tail of their logs when the test failed.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/process.h"

namespace troupe::testing {

// A fresh directory under the system temp dir, removed at the end unless the test failed.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A `troupe node` child process.
class NodeProcess {
 public:
  NodeProcess(const TempDir& dir, const std::string& name, std::vector<std::string> extra_args);
  ~NodeProcess();

  uint64_t node_id() const { return node_id_; }
  const std::string& address() const { return address_; }
  pid_t pid() const { return process_.pid(); }
  bool signal(int sig) { return process_.signal(sig); }
  // The next stdout line starting with prefix, within timeout.
  std::optional<std::string> wait_for_line(const std::string& prefix,
                                           std::chrono::milliseconds timeout) {
    return process_.wait_for_line(prefix, timeout);
  }
  bool alive();

 private:
  coordinator::ChildProcess process_;
  std::string name_;
  std::string log_path_;
  uint64_t node_id_ = 0;
  std::string address_;
};

std::string troupe_binary();

// A TCP connection to 127.0.0.1:port (a file descriptor; -1 if refused).
int connect_loopback(int port);
// A loopback port free when asked (bound to port 0, then released), for a program that cannot
// listen on port 0 and say where (Prometheus).
int free_loopback_port();

// Run-directory readers shared by the job and elasticity tests.
std::string json_field(const std::string& line, const std::string& key);  // a top-level scalar
std::vector<std::string> lines_of(const std::string& path);
std::string text_of(const std::string& path);  // the whole file (a log, a command's output)
// step_committed losses by step (a step redone after a rollback: its last commit).
std::vector<double> committed_losses(const std::string& run_dir);
// Every committed step used exactly its global batch: positions [s*B, (s+1)*B), each once.
void check_ledger(const std::string& run_dir, int steps, long global_batch);

}  // namespace troupe::testing
