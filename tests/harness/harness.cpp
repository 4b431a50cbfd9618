#include "tests/harness/harness.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

bool NodeProcess::alive() {
  if (!process_.running()) return false;
  return !process_.wait(std::chrono::milliseconds(0)).has_value();
}

}  // namespace troupe::testing
