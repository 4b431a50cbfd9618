// Tells when child processes exit, without polling: one thread waits in poll(2) on each child's
// pidfd (Linux 5.3+) and an eventfd (a new child, or the end), and calls on_exit(id) once for
// every child that exited. It does not reap: the child's owner (ChildProcess) does.
//
// Thread-safety: watch() from any thread; on_exit runs on the watcher's thread. The watcher may
// be destroyed from inside on_exit (the thread then ends on its own: its state is shared).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <thread>

namespace troupe::coordinator {

class ExitWatcher {
 public:
  explicit ExitWatcher(std::function<void(uint64_t id)> on_exit);
  ~ExitWatcher();  // stops the thread; children still running are no longer watched
  ExitWatcher(const ExitWatcher&) = delete;
  ExitWatcher& operator=(const ExitWatcher&) = delete;

  // Watches pid; on_exit(id) when it exits (at once if it already has). Throws
  // std::runtime_error when the kernel cannot give a pidfd.
  void watch(uint64_t id, pid_t pid);

 private:
  struct State;
  static void loop(const std::shared_ptr<State>& state);

  std::shared_ptr<State> state_;
  std::thread thread_;
};

}  // namespace troupe::coordinator
