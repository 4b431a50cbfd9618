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
    : path_(path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) throw RunDirError("cannot create the run directory " + path + ": " + ec.message());
  const std::string lock = path + "/run.lock";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw RunDirError("cannot create " + lock + ": " + std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    std::string owner;
    std::getline(std::ifstream(lock), owner);
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw RunDirError("the run directory " + path + " is in use by another job" +
                      (owner.empty() ? "" : " (" + owner + ")") + "; choose another job.run_dir");
  }
  if (!resuming && fs::exists(path + "/events.jsonl")) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw RunDirError("the run directory " + path +
                      " already holds a job's logs (events.jsonl); choose another job.run_dir "
                      "(an earlier run's results are never appended to)");
  }
  const std::string owner = "job '" + job_name + "', pid " + std::to_string(getpid()) + " on " +
                            host() + ", since " + now_text() + "\n";
  if (::ftruncate(lock_fd_, 0) != 0 ||
      ::pwrite(lock_fd_, owner.data(), owner.size(), 0) != ssize_t(owner.size())) {
    const std::string why = std::strerror(errno);
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw RunDirError("cannot write " + lock + ": " + why);
  }
}

RunDirectory::~RunDirectory() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

}  // namespace troupe::coordinator
