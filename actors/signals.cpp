#include "actors/signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <thread>

namespace troupe::actors {
namespace {

// One watcher per process at a time (the handler has no other way to reach it).
std::atomic<int> pipe_write{-1};
int pipe_read = -1;

// When each signal was last taken (CLOCK_MONOTONIC ns; 0: never).
constexpr int kSlots = 65;
std::atomic<int64_t> last_taken_ns[kSlots];

// Whether this arrival repeats the last one of the same signal (async-signal-safe: lock-free
// atomics; handlers on two threads at once agree through the exchange).
bool repeats(int sig) {
  if (sig <= 0 || sig >= kSlots) return false;
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  const int64_t now = int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  int64_t last = last_taken_ns[sig].load();
  do {  // (two threads may take the same signal at once: one of them takes it)
    if (last != 0 && now - last < int64_t(kRepeatWindowMs) * 1000000) return true;
  } while (!last_taken_ns[sig].compare_exchange_weak(last, now));
  return false;
}

void on_signal(int sig) {
  if (repeats(sig)) return;
  const int fd = pipe_write.load();
  const unsigned char byte = static_cast<unsigned char>(sig);
  if (fd >= 0) (void)!::write(fd, &byte, 1);  // async-signal-safe; a full pipe drops it
}

bool hangup_ignored = false;  // SIGHUP was ignored when the watcher started (nohup): it stays so

void install(void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (!hangup_ignored) sigaction(SIGHUP, &sa, nullptr);
}

}  // namespace

SignalWatcher::SignalWatcher() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0) {
    pipe_read = fds[0];
    pipe_write.store(fds[1]);
  }
  struct sigaction old {};
  hangup_ignored = sigaction(SIGHUP, nullptr, &old) == 0 && old.sa_handler == SIG_IGN;
  install(&on_signal);
}

SignalWatcher::~SignalWatcher() {
  install(SIG_DFL);
  const int w = pipe_write.exchange(-1);
  if (w >= 0) ::close(w);
  if (pipe_read >= 0) ::close(pipe_read);
  pipe_read = -1;
}

// Moves what the handler wrote into pending_ (called with mu_ held).
void SignalWatcher::drain_pipe() {
  unsigned char buf[64];
  for (ssize_t n; pipe_read >= 0 && (n = ::read(pipe_read, buf, sizeof buf)) > 0;)
    for (ssize_t i = 0; i < n; ++i) {
      pending_.push_back(buf[i]);
      if (count_++ == 0) first_ = buf[i];
    }
}

int SignalWatcher::next() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_pipe();
  if (pending_.empty()) return 0;
  int sig = pending_.front();
  pending_.pop_front();
  return sig;
}

int SignalWatcher::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<SignalWatcher*>(this)->drain_pipe();
  return count_;
}

int SignalWatcher::first() const {
  std::lock_guard<std::mutex> lock(mu_);
  const_cast<SignalWatcher*>(this)->drain_pipe();
  return first_;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

TeardownDeadline::~TeardownDeadline() { done_->store(true); }

void TeardownDeadline::arm(std::chrono::milliseconds after, int code, std::string who) {
  std::thread([after, code, who = std::move(who), done = done_] {
    const auto until = std::chrono::steady_clock::now() + after;
    while (std::chrono::steady_clock::now() < until) {
      if (done->load()) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (done->load()) return;
    std::fprintf(stderr,
                 "%s: its control plane did not shut down within %lld ms: exiting without it\n",
                 who.c_str(), static_cast<long long>(after.count()));
    std::fflush(nullptr);
    std::_Exit(code);
  }).detach();
}

}  // namespace troupe::actors
