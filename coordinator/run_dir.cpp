#include "coordinator/run_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

namespace troupe::coordinator {
namespace {

namespace fs = std::filesystem;

std::string safe_name(const std::string& name) {
  std::string out;
  for (unsigned char c : name)
    out.push_back(std::isalnum(c) || c == '.' || c == '-' || c == '_' ? char(c) : '_');
  if (out.empty() || out[0] == '.') out.insert(out.begin(), '_');
  return out.substr(0, 128);
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

std::string host() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// Locks `lock` (created): the open descriptor (the lock lives as long as it does), or -1 with
// `holder` set to what its live owner wrote. Throws RunDirError when it cannot be created.
int take_lock(const std::string& lock, std::string& holder) {
  const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw RunDirError("cannot create " + lock + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    std::getline(std::ifstream(lock), holder);
    ::close(fd);
    return -1;
  }
  return fd;
}

// Writes who holds the lock `fd` (of file `lock`) into it; closes it and throws when it cannot.
void write_owner(int& fd, const std::string& lock, const std::string& owner) {
  if (::ftruncate(fd, 0) == 0 &&
      ::pwrite(fd, owner.data(), owner.size(), 0) == ssize_t(owner.size()))
    return;
  const std::string why = std::strerror(errno);
  ::close(fd);
  fd = -1;
  throw RunDirError("cannot write " + lock + ": " + why);
}

}  // namespace

std::string default_run_dir(const std::string& name) {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/" + safe_name(name) + "-" + buf + "-" + std::to_string(getpid());
}

bool run_dir_in_use(const std::string& path) {
  const int fd = ::open((path + "/run.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

RunDirectory::RunDirectory(const std::string& path, const std::string& job_name, bool resuming)
    : path_(path), job_name_(job_name) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw RunDirError("cannot create the run directory " + path + ": " + ec.message());
  std::string holder;
  lock_fd_ = take_lock(path + "/run.lock", holder);
  if (lock_fd_ < 0)
    throw RunDirError(
        "the run directory " + path + " is in use by another job" +
        (holder.empty() ? "" : " (" + holder + ")") +
        (resuming ? "; it goes on there: troupe status --run-dir " + path + " shows how far"
                  : "; choose another job.run_dir"));
  if (!resuming && fs::exists(path + "/events.jsonl", ec)) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw RunDirError("the run directory " + path +
                      " already holds a job's logs (events.jsonl); choose another job.run_dir "
                      "(an earlier run's results are never appended to), or go on with that run: "
                      "troupe run " +
                      path + "/config.toml --resume " + path);
  }
  write_owner(lock_fd_, path + "/run.lock", owner());
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
  if (checkpoints_fd_ >= 0) ::close(checkpoints_fd_);
}

std::string RunDirectory::owner() const {
  return "job '" + job_name_ + "', pid " + std::to_string(getpid()) + " on " + host() + ", since " +
         now_text() + "\n";
}

void RunDirectory::claim_checkpoints(const std::string& dir,
                                     const std::function<std::optional<uint64_t>()>& earlier) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw RunDirError("checkpoint.dir: cannot create " + dir + ": " + ec.message());
  std::string holder;
  const std::string lock = dir + "/.claim.lock";
  checkpoints_fd_ = take_lock(lock, holder);
  if (checkpoints_fd_ < 0)
    throw RunDirError("checkpoint.dir " + dir + " is in use by another job" +
                      (holder.empty() ? "" : " (" + holder + ")") +
                      ": their checkpoints of one step would be one directory; choose another "
                      "checkpoint.dir");
  if (const auto step = earlier ? earlier() : std::nullopt) {
    ::close(checkpoints_fd_);
    checkpoints_fd_ = -1;
    throw RunDirError("checkpoint.dir " + dir +
                      " holds an earlier run's checkpoints (the newest: " + "step " +
                      std::to_string(*step) +
                      "): a new run would overwrite and prune them; go on from one of them "
                      "(--resume) or choose another checkpoint.dir");
  }
  write_owner(checkpoints_fd_, lock, owner());
}

}  // namespace troupe::coordinator
