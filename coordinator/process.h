// A child process with one owner: started in its own process group, ended (SIGKILL to the group)
// when the owner goes away, whatever happened. Used by the local launcher, the demo, the
// benchmarks and the multi-process tests.
//
// Thread-safety: none; one owner.
#pragma once

#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <optional>
#include <string>
#include <vector>

namespace troupe::coordinator {

class ChildProcess {
 public:
  struct Options {
    std::vector<std::string> argv;  // argv[0] is the program path
    std::string stdout_path;        // empty: a pipe readable with read_line()
    std::string stderr_path;        // empty: inherit
    std::vector<std::string> env;   // extra NAME=VALUE entries (replacing inherited ones)
    // Sent to the child when the thread that started it ends (the owner died, however): SIGKILL
    // by default; the local launcher's agents get SIGHUP, to say why they leave.
    int parent_death_signal = SIGKILL;
  };

  explicit ChildProcess(const Options& options);  // throws std::runtime_error if it cannot start
  ~ChildProcess();                                // SIGKILLs the group and reaps, if still running
  ChildProcess(ChildProcess&& other) noexcept;
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  bool signal(int sig);  // to the child's process group

  // Reads one line of the child's stdout pipe; nullopt at EOF or past the deadline.
  std::optional<std::string> read_line(std::chrono::milliseconds timeout);
  // Reads lines until one starts with prefix; returns it, or nullopt.
  std::optional<std::string> wait_for_line(const std::string& prefix,
                                           std::chrono::milliseconds timeout);

  // Waits for exit up to timeout; returns the exit status as from waitpid (or nullopt). With
  // `usage`, the child's own resources (wait4: its peak resident memory, not the largest of
  // every child this process has waited for, as getrusage(RUSAGE_CHILDREN) says).
  std::optional<int> wait(std::chrono::milliseconds timeout, struct rusage* usage = nullptr);
  // SIGKILLs the group and reaps it.
  void kill_and_reap();
  bool running() const { return pid_ > 0 && !reaped_; }

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  bool reaped_ = false;
  std::string pending_;
};

// The path of the running executable (for spawning oneself).
std::string self_executable();

}  // namespace troupe::coordinator
