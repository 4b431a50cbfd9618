#include "coordinator/exit_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::coordinator {

struct ExitWatcher::State {
  std::function<void(uint64_t)> on_exit;
  int wake_fd = -1;
  std::mutex mu;
  std::vector<std::pair<uint64_t, int>> added;  // (id, pidfd) not yet picked up by the thread
  bool stop = false;

  void wake() {
    uint64_t one = 1;
    (void)!::write(wake_fd, &one, sizeof one);
  }
  ~State() {
    for (auto& [id, fd] : added) ::close(fd);
    if (wake_fd >= 0) ::close(wake_fd);
  }
};

ExitWatcher::ExitWatcher(std::function<void(uint64_t)> on_exit)
    : state_(std::make_shared<State>()) {
  state_->on_exit = std::move(on_exit);
  state_->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state_->wake_fd < 0)
    throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([state = state_] { loop(state); });
}

ExitWatcher::~ExitWatcher() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->wake();
  // From inside on_exit (the last owner went on the watcher's own thread) it cannot join
  // itself: the thread ends on its own once on_exit returns (it holds the state).
  if (thread_.get_id() == std::this_thread::get_id())
    thread_.detach();
  else
    thread_.join();
}

void ExitWatcher::watch(uint64_t id, pid_t pid) {
  // (glibc 2.36 declares pidfd_open without C linkage for C++: the system call directly.)
  int fd = int(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw std::runtime_error(std::string("pidfd_open: ") + std::strerror(errno));
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->added.push_back({id, fd});
  }
  state_->wake();
}

void ExitWatcher::loop(const std::shared_ptr<State>& s) {
  std::vector<std::pair<uint64_t, int>> watched;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->stop) break;
      watched.insert(watched.end(), s->added.begin(), s->added.end());
      s->added.clear();
    }
    std::vector<pollfd> fds{{s->wake_fd, POLLIN, 0}};
    for (auto& [id, fd] : watched) fds.push_back({fd, POLLIN, 0});
    // No deadline needed: the destructor's eventfd write ends the wait.
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      uint64_t n;
      (void)!::read(s->wake_fd, &n, sizeof n);
    }
    for (size_t i = fds.size(); i-- > 1;) {
      if (!fds[i].revents) continue;
      const uint64_t id = watched[i - 1].first;
      ::close(watched[i - 1].second);
      watched.erase(watched.begin() + long(i - 1));
      s->on_exit(id);
    }
  }
  for (auto& [id, fd] : watched) ::close(fd);
}

}  // namespace troupe::coordinator
