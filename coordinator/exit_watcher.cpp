#include "coordinator/exit_watcher.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace troupe::coordinator {

ExitWatcher::ExitWatcher(std::function<void(uint64_t)> on_exit) : on_exit_(std::move(on_exit)) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  thread_ = std::thread([this] { loop(); });
}

ExitWatcher::~ExitWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
  thread_.join();
  for (auto& [id, fd] : added_) ::close(fd);
  ::close(wake_fd_);
}

void ExitWatcher::watch(uint64_t id, pid_t pid) {
  // (glibc 2.36 declares pidfd_open without C linkage for C++: the system call directly.)
  int fd = int(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) throw std::runtime_error(std::string("pidfd_open: ") + std::strerror(errno));
  {
    std::lock_guard<std::mutex> lock(mu_);
    added_.push_back({id, fd});
  }
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void ExitWatcher::loop() {
  std::vector<std::pair<uint64_t, int>> watched;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
      watched.insert(watched.end(), added_.begin(), added_.end());
      added_.clear();
    }
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    for (auto& [id, fd] : watched) fds.push_back({fd, POLLIN, 0});
    // No deadline needed: the destructor's eventfd write ends the wait.
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof n);
    }
    for (size_t i = fds.size(); i-- > 1;) {
      if (!fds[i].revents) continue;
      const uint64_t id = watched[i - 1].first;
      ::close(watched[i - 1].second);
      watched.erase(watched.begin() + long(i - 1));
      on_exit_(id);
    }
  }
  for (auto& [id, fd] : watched) ::close(fd);
}

}  // namespace troupe::coordinator
