// SIGINT, SIGTERM and SIGHUP (unless ignored, as under nohup) as events a process handles in its
// own time: a handler (whichever thread
// the kernel picks: libraries such as OpenBLAS start threads before main) writes the signal
// into a pipe, and the process asks for them with next() (a job finishes its step and writes its
// final event instead of dying mid-line). The default actions come back when it goes; children
// exec'd meanwhile get them anyway (exec resets caught signals).
// A signal that arrives again within kRepeatWindowMs of its last taken arrival is the same
// request, taken once: `timeout` and `kill 0` deliver it twice at once (to the process and to
// its group); a second Ctrl-C pressed by a person comes later and counts.
//
// Thread-safety: next(), count() and first() from any thread; one watcher per process.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

namespace troupe::actors {

constexpr int kRepeatWindowMs = 200;

class SignalWatcher {
 public:
  SignalWatcher();
  ~SignalWatcher();  // stops watching; the signals stay blocked (the process is ending)
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  // The next signal that arrived and was not taken yet; 0 when none.
  int next();
  // Every signal that arrived so far (taken or not); the first of them (0: none).
  int count() const;
  int first() const;

 private:
  void drain_pipe();

  mutable std::mutex mu_;
  std::deque<int> pending_;
  int count_ = 0, first_ = 0;
};

// "SIGINT", "SIGTERM", "SIGHUP", or "a signal".
const char* signal_name(int signal);

// The last resort of a process whose work is done: what is left is CAF's teardown, which waits
// for every actor without a deadline (one blocked in a hung file system, a detached actor held
// for good). Armed, it exits the process with `code` past `after`, saying `who`'s control plane
// did not shut down; destroyed first (declared before the actor system: gone with it), it does
// nothing (a program that embeds Troupe goes on).
class TeardownDeadline {
 public:
  TeardownDeadline() = default;
  ~TeardownDeadline();
  TeardownDeadline(const TeardownDeadline&) = delete;
  TeardownDeadline& operator=(const TeardownDeadline&) = delete;
  void arm(std::chrono::milliseconds after, int code, std::string who);

 private:
  std::shared_ptr<std::atomic<bool>> done_ = std::make_shared<std::atomic<bool>>(false);
};

}  // namespace troupe::actors
