#include "coordinator/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>

extern char** environ;

namespace troupe::coordinator {

using Clock = std::chrono::steady_clock;

ChildProcess::ChildProcess(const Options& options) {
  if (options.argv.empty()) throw std::runtime_error("ChildProcess: empty argv");
  int pipefd[2] = {-1, -1};
  if (options.stdout_path.empty() && pipe2(pipefd, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  // Everything the child needs is prepared before fork (no allocation after it).
  std::vector<char*> argv;
  for (auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // The extra entries replace inherited ones of the same name (getenv takes the first).
  auto name_of = [](const std::string& e) { return e.substr(0, e.find('=') + 1); };
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) {
    const std::string entry(*e);
    if (std::none_of(options.env.begin(), options.env.end(),
                     [&](const std::string& x) { return name_of(x) == name_of(entry); }))
      env_strings.push_back(entry);
  }
  for (auto& e : options.env) env_strings.push_back(e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    setpgid(0, 0);
    // The default signal mask: a parent that takes SIGINT/SIGTERM with sigwait blocks them, and
    // a mask survives exec.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // And SIGPIPE's default action: troupe run ignores it (its console may go away), and an
    // ignored signal stays ignored across exec.
    ::signal(SIGPIPE, SIG_DFL);
    // Die with the parent, however it ends (a SIGKILLed test must not leave children behind).
    prctl(PR_SET_PDEATHSIG, options.parent_death_signal);
    if (getppid() != parent) _exit(127);
    if (options.stdout_path.empty()) {
      dup2(pipefd[1], STDOUT_FILENO);
    } else {
      int fd = open(options.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, STDOUT_FILENO);
    }
    if (!options.stderr_path.empty()) {
      int fd = open(options.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
    }
    // Nothing else of the parent's goes with the child: its listening sockets (UCX's, the
    // gate's), the run lock, pipes. (UCX opens some descriptors without close-on-exec.)
    ::syscall(SYS_close_range, 3, ~0U, 0);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  setpgid(pid_, pid_);  // also from the parent, so the group exists before we signal it
  if (pipefd[1] >= 0) close(pipefd[1]);
  stdout_fd_ = pipefd[0];
}

ChildProcess::ChildProcess(ChildProcess&& other) noexcept
    : pid_(other.pid_),
      stdout_fd_(other.stdout_fd_),
      reaped_(other.reaped_),
      pending_(std::move(other.pending_)) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

ChildProcess::~ChildProcess() {
  kill_and_reap();
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

bool ChildProcess::signal(int sig) {
  if (!running()) return false;
  return ::kill(-pid_, sig) == 0 || ::kill(pid_, sig) == 0;
}

void ChildProcess::kill_and_reap() {
  if (!running()) return;
  ::kill(-pid_, SIGKILL);
  ::kill(pid_, SIGKILL);
  // (A process in an uninterruptible sleep, a hung mount's fsync, ends only when that returns:
  // not waited for past 5 s. Nothing is asked of it again: it stays this process's zombie.)
  if (!wait(std::chrono::seconds(5)) && ::kill(pid_, 0) == 0)  // (not reaped, and still there)
    std::fprintf(stderr,
                 "troupe: pid %d did not end within 5 s of SIGKILL (in an uninterruptible "
                 "sleep?): left behind\n",
                 int(pid_));
  reaped_ = true;
}

std::optional<int> ChildProcess::wait(std::chrono::milliseconds timeout, struct rusage* usage) {
  if (pid_ <= 0) return std::nullopt;
  auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t r = wait4(pid_, &status, WNOHANG, usage);
    if (r == pid_) {
      reaped_ = true;
      return status;
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    if (Clock::now() >= deadline) return std::nullopt;
    usleep(2000);
  }
}

std::optional<std::string> ChildProcess::read_line(std::chrono::milliseconds timeout) {
  if (stdout_fd_ < 0) return std::nullopt;
  auto deadline = Clock::now() + timeout;
  while (true) {
    auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd pfd{stdout_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return std::nullopt;
    char buf[4096];
    ssize_t n = ::read(stdout_fd_, buf, sizeof buf);
    if (n <= 0) return std::nullopt;
    pending_.append(buf, static_cast<size_t>(n));
  }
}

std::optional<std::string> ChildProcess::wait_for_line(const std::string& prefix,
                                                       std::chrono::milliseconds timeout) {
  auto deadline = Clock::now() + timeout;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    auto line = read_line(left);
    if (!line) return std::nullopt;
    if (line->rfind(prefix, 0) == 0) return line;
  }
}

std::string self_executable() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw std::runtime_error("cannot read /proc/self/exe");
  buf[n] = '\0';
  return buf;
}

}  // namespace troupe::coordinator
