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

#include <deque>
#include <mutex>

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

}  // namespace troupe::actors
