#include "coordinator/events.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace troupe::coordinator {

std::string text_field(const nlohmann::json& j, const char* key, const std::string& otherwise) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_string() ? it->get<std::string>() : otherwise;
}

double number_field(const nlohmann::json& j, const char* key, double otherwise) {
  const auto it = j.is_object() ? j.find(key) : j.end();
  return it != j.end() && it->is_number() ? it->get<double>() : otherwise;
}

uint64_t count_field(const nlohmann::json& j, const char* key) {
  const double x = number_field(j, key);
  return x >= 0 && x < 0x1p63 ? uint64_t(x) : 0;
}

std::vector<std::string> event_lines(const std::string& run_dir) {
  std::vector<std::string> out;
  const std::string path = run_dir + "/events.jsonl";
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(std::move(line));
  return out;
}

double unix_seconds() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return double(tv.tv_sec) + double(tv.tv_usec) * 1e-6;
}

Json& Json::str(const std::string& k, const std::string& v) {
  object_[k] = v;
  return *this;
}
Json& Json::num(const std::string& k, double v) {
  object_[k] = std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
  return *this;
}
Json& Json::integer(const std::string& k, long long v) {
  object_[k] = v;
  return *this;
}
Json& Json::boolean(const std::string& k, bool v) {
  object_[k] = v;
  return *this;
}
Json& Json::value(const std::string& k, nlohmann::ordered_json v) {
  object_[k] = std::move(v);
  return *this;
}

namespace {

// A line a process killed mid-write left at the end of a file it appends to: cut back to the last
// whole line, so that the next line starts on its own (a resume glued its first event onto it).
void cut_partial_line(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size == 0) return;
  off_t end = st.st_size;
  char buf[4096];
  while (end > 0) {
    const off_t from = end > off_t(sizeof buf) ? end - off_t(sizeof buf) : 0;
    const ssize_t n = ::pread(fd, buf, size_t(end - from), from);
    if (n != end - from) return;  // (unreadable: left as it is)
    for (ssize_t i = n; i-- > 0;)
      if (buf[i] == '\n') {
        if (from + i + 1 < st.st_size) (void)!::ftruncate(fd, from + i + 1);
        return;
      }
    end = from;
  }
  (void)!::ftruncate(fd, 0);  // (no whole line at all)
}

}  // namespace

RunLog::RunLog(const std::string& dir, bool ledger) : dir_(dir) {
  auto open = [&](File& f, const char* name) {
    f.path = dir + "/" + name;
    f.fd = ::open(f.path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f.fd < 0) throw std::runtime_error("cannot write " + f.path + ": " + std::strerror(errno));
    cut_partial_line(f.fd);
  };
  open(events_, "events.jsonl");
  open(metrics_, "metrics.jsonl");
  if (ledger) open(ledger_, "ledger.jsonl");
}

RunLog::~RunLog() {
  for (File* f : {&events_, &metrics_, &ledger_})
    if (f->fd >= 0) ::close(f->fd);
}

// The whole line, or (a write that fails part way) nothing: cut back to the size before it.
void RunLog::append(File& f, const std::string& line) {
  if (f.fd < 0) return;
  const std::string text = line + "\n";
  struct stat st {};
  const off_t before = ::fstat(f.fd, &st) == 0 ? st.st_size : -1;
  size_t done = 0;
  ssize_t n = 0;
  while (done < text.size() && (n = ::write(f.fd, text.data() + done, text.size() - done)) > 0)
    done += size_t(n);
  if (done == text.size()) return;
  const std::string why = n < 0 ? std::strerror(errno) : "nothing written (disk full?)";
  if (before >= 0 && ::ftruncate(f.fd, before) != 0) {
    // (could not cut it back either: the next reader sees the partial line; said below)
  }
  if (failed_) return;
  failed_ = true;
  if (on_error_) on_error_("cannot write " + f.path + ": " + why);
}

// {"ts":..., "event": name, <fields>}
void RunLog::event(const std::string& name, const Json& fields) {
  nlohmann::ordered_json j = {{"ts", unix_seconds()}, {"event", name}};
  for (auto& [k, v] : fields.object().items()) j[k] = v;
  append(events_, j.dump());
  for (const auto& f : observers_) f(j);
}

void RunLog::metric(const Json& fields) {
  nlohmann::ordered_json j = {{"ts", unix_seconds()}};
  for (auto& [k, v] : fields.object().items()) j[k] = v;
  append(metrics_, j.dump());
  for (const auto& f : observers_) f(j);
}

void RunLog::ledger(const Json& fields) { append(ledger_, fields.text()); }

bool RunLog::drop_ledger_from(uint64_t step) {
  if (ledger_.fd < 0) return true;
  const std::string tmp = ledger_.path + ".tmp";
  std::ifstream in(ledger_.path);
  std::ofstream out(tmp);
  for (std::string line; std::getline(in, line);) {
    // Every line starts {"step":N,
    auto at = line.find("\"step\":");
    if (at != std::string::npos && std::strtoull(line.c_str() + at + 7, nullptr, 10) >= step)
      continue;
    out << line << "\n";
  }
  out.close();
  if (!in.eof() || !out) return false;  // the old ledger stays as it was
  ::close(ledger_.fd);
  const bool renamed = std::rename(tmp.c_str(), ledger_.path.c_str()) == 0;
  ledger_.fd = ::open(ledger_.path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  return renamed && ledger_.fd >= 0;
}

}  // namespace troupe::coordinator
