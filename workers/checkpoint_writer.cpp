#include "workers/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "comm/checksum.h"

namespace troupe::workers {
namespace {

std::string why(const std::string& what, const std::string& path) {
  return what + " " + path + ": " + std::strerror(errno);
}

// Writes bytes to path through path.tmp: written, fsynced, renamed. "" or why not.
std::string write_durably(const std::string& path, const std::vector<uint8_t>& bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return why("cannot create", tmp);
  size_t at = 0;
  while (at < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + at, bytes.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::string w = why("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return w;
    }
    at += size_t(n);
  }
  if (::fsync(fd) != 0) {
    std::string w = why("cannot fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return w;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return why("cannot rename", tmp);
  return "";
}

std::string fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return why("cannot open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? "" : why("cannot fsync", dir);
}

}  // namespace

CheckpointWriter::~CheckpointWriter() { wait(); }

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::start(uint64_t step, std::string directory, std::vector<Shard> shards,
                             double blocking_seconds) {
  wait();
  result_ = Written{step, std::move(directory), {}, blocking_seconds, 0, "", {}};
  taken_ = false;
  done_.store(false, std::memory_order_release);
  thread_ = std::thread([this, s = std::move(shards)]() mutable { write(std::move(s)); });
}

std::optional<CheckpointWriter::Written> CheckpointWriter::take_finished() {
  if (taken_ || busy()) return std::nullopt;
  wait();
  taken_ = true;
  return result_;
}

void CheckpointWriter::write(std::vector<Shard> shards) {
  const auto t0 = std::chrono::steady_clock::now();
  std::error_code ec;
  std::filesystem::create_directories(result_.directory, ec);
  if (ec) result_.error = "cannot create " + result_.directory + ": " + ec.message();
  for (auto& s : shards) {
    if (!result_.error.empty()) break;
    const std::string file = shard_file_name(s.block);
    result_.error = write_durably(result_.directory + "/" + file, s.bytes);
    result_.shards.push_back(
        {s.block, file, s.bytes.size(), comm::fnv1a(s.bytes.data(), s.bytes.size())});
    if (mid_write_ && result_.shards.size() == 1) mid_write_();
  }
  result_.buffers = std::move(shards);
  if (result_.error.empty()) result_.error = fsync_dir(result_.directory);
  result_.write_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  done_.store(true, std::memory_order_release);
}

}  // namespace troupe::workers
