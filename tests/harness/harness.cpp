#include "tests/harness/harness.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace troupe::testing {

std::string troupe_binary() { return TROUPE_BINARY; }

TempDir::TempDir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-test-XXXXXX").string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (!::testing::Test::HasFailure()) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  } else {
    std::fprintf(stderr, "[harness] kept %s for inspection\n", path_.c_str());
  }
}

namespace {

coordinator::ChildProcess::Options node_options(const TempDir& dir, const std::string& name,
                                                std::vector<std::string> extra) {
  std::vector<std::string> argv{troupe_binary(), "node"};
  bool has_listen = false;
  for (auto& a : extra) has_listen |= a == "--listen";
  if (!has_listen) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  return {argv, "", dir.path() + "/" + name + ".log", {}};
}

}  // namespace

NodeProcess::NodeProcess(const TempDir& dir, const std::string& name,
                         std::vector<std::string> extra)
    : process_(node_options(dir, name, std::move(extra))),
      name_(name),
      log_path_(dir.path() + "/" + name + ".log") {
  auto line = process_.wait_for_line("node ", std::chrono::seconds(15));
  if (!line) throw std::runtime_error(name + ": troupe node did not report its address");
  std::istringstream in(*line);
  std::string word, id_hex, listening;
  in >> word >> id_hex >> listening >> address_;
  node_id_ = std::stoull(id_hex, nullptr, 16);
}

NodeProcess::~NodeProcess() {
  process_.kill_and_reap();
  if (::testing::Test::HasFailure()) {
    std::ifstream in(log_path_);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::fprintf(stderr, "[harness] last lines of %s's log (%s):\n", name_.c_str(),
                 log_path_.c_str());
    for (size_t i = lines.size() > 20 ? lines.size() - 20 : 0; i < lines.size(); ++i)
      std::fprintf(stderr, "  %s\n", lines[i].c_str());
  }
}

std::string json_field(const std::string& line, const std::string& key) {
  auto at = line.find("\"" + key + "\":");
  if (at == std::string::npos) return "";
  at += key.size() + 3;
  if (line[at] == '"') return line.substr(at + 1, line.find('"', at + 1) - at - 1);
  return line.substr(at, line.find_first_of(",}", at) - at);
}

std::vector<std::string> lines_of(const std::string& path) {
  // Only whole lines: a running job's last line may be half-written when it is read (seen: a
  // step_committed line cut inside its loss).
  const std::string text = text_of(path);
  std::vector<std::string> out;
  for (size_t at = 0, end; (end = text.find('\n', at)) != std::string::npos; at = end + 1)
    out.push_back(text.substr(at, end - at));
  return out;
}

std::string text_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream all;
  all << in.rdbuf();
  return all.str();
}

std::vector<double> committed_losses(const std::string& run_dir) {
  // A step committed again after a rollback (steps_rolled_back) counts with its last loss.
  std::map<long, double> by_step;
  for (auto& l : lines_of(run_dir + "/events.jsonl"))
    if (json_field(l, "event") == "step_committed")
      by_step[std::stol(json_field(l, "step"))] = std::stod(json_field(l, "loss"));
  std::vector<double> out;
  for (auto& [step, loss] : by_step) out.push_back(loss);
  return out;
}

void check_ledger(const std::string& run_dir, int steps, long B) {
  std::map<long, std::vector<std::pair<long, long>>> by_step;
  for (auto& l : lines_of(run_dir + "/ledger.jsonl")) {
    auto p = l.find("\"positions\":[[");
    ASSERT_NE(p, std::string::npos) << l;
    // [[a,b],[c,d],...]: every pair.
    const char* at = l.c_str() + p + 13;
    while (*at == '[') {
      long a = 0, b = 0;
      int used = 0;
      ASSERT_EQ(std::sscanf(at, "[%ld,%ld]%n", &a, &b, &used), 2) << l;
      by_step[std::stol(json_field(l, "step"))].push_back({a, b});
      at += used;
      if (*at == ',') ++at;
    }
  }
  ASSERT_EQ(int(by_step.size()), steps);
  for (auto& [step, ranges] : by_step) {
    std::sort(ranges.begin(), ranges.end());
    long at = step * B;
    for (auto& [a, b] : ranges) {
      ASSERT_EQ(a, at) << "step " << step << ": a gap or a sample used twice";
      at = b;
    }
    ASSERT_EQ(at, (step + 1) * B) << "step " << step;
  }
}

bool NodeProcess::alive() {
  if (!process_.running()) return false;
  return !process_.wait(std::chrono::milliseconds(0)).has_value();
}

int connect_loopback(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    if (fd >= 0) ::close(fd);
    return -1;
  }
  return fd;
}

int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

}  // namespace troupe::testing
