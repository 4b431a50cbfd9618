#include "data/set_directory.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

namespace troupe::data {

namespace fs = std::filesystem;

namespace {

// Removes OUT.partial-PID directories whose process is gone (an interrupted prepare's).
void remove_stale_partials(const std::string& out) {
  const fs::path p(out);
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  const std::string prefix = p.filename().string() + ".partial-";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(parent, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string pid = name.substr(prefix.size());
    if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
    if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

// --out names a directory to be (its missing parents made too): the nearest existing one above
// it must be a directory this process may write in.
void check_can_create(const std::string& out) {
  std::error_code ec;
  fs::path above = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : fs::path(".");
  while (!fs::exists(above, ec) && above != ".")  // (a relative path's top: the working one)
    above = above.has_parent_path() && above != above.parent_path() ? above.parent_path()
                                                                    : fs::path(".");
  if (!fs::is_directory(above, ec))
    throw std::invalid_argument("--out '" + out + "': " + above.string() + " is not a directory");
  if (::access(above.c_str(), W_OK | X_OK) != 0)
    throw std::invalid_argument("--out '" + out + "': cannot create it in " + above.string() +
                                ": " + std::strerror(errno));
}

}  // namespace

std::string new_set_directory(const std::string& given) {
  std::string out = given;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty()) throw std::invalid_argument("--out: the data set's directory is required");
  if (const fs::path name = fs::path(out).filename(); name == "." || name == ".." || out == "/")
    throw std::invalid_argument("--out '" + given +
                                "': name the data set's own directory (a new one), not '" +
                                name.string() + "'");
  std::error_code ec;
  if (fs::exists(out, ec))
    throw std::invalid_argument("--out '" + out +
                                "' exists: a data set is written once (remove it or choose "
                                "another directory)");
  check_can_create(out);
  return out;
}

std::string make_partial(const std::string& out) {
  remove_stale_partials(out);
  const std::string partial = out + ".partial-" + std::to_string(::getpid());
  std::error_code ec;
  fs::create_directories(fs::path(partial).parent_path(), ec);
  if (!fs::create_directory(partial, ec) || ec)
    throw std::runtime_error("--out '" + out + "': cannot create " + partial + ": " +
                             (ec ? ec.message() : "it exists"));
  return partial;
}

void sync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  const bool ok = fd >= 0 && ::fsync(fd) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) throw std::runtime_error("cannot sync " + path + ": " + std::strerror(err));
}

void publish(const std::string& partial, const std::string& out, std::mutex* publishing,
             bool* published) {
  std::unique_lock<std::mutex> lock;
  if (publishing) lock = std::unique_lock<std::mutex>(*publishing);
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, out.c_str(), RENAME_NOREPLACE) != 0)
    throw std::runtime_error("--out '" + out + "': cannot move " + partial +
                             " there: " + std::strerror(errno) +
                             (errno == EEXIST || errno == ENOTEMPTY
                                  ? " (it appeared meanwhile: another prepare's or import's?)"
                                  : ""));
  if (published) *published = true;
  const fs::path parent = fs::path(out).has_parent_path() ? fs::path(out).parent_path() : ".";
  const int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {  // (the rename durable; the set is in place whatever this says)
    ::fsync(fd);
    ::close(fd);
  }
}

}  // namespace troupe::data
