// A file-based rendezvous for benchmarks and multi-process tests: each member writes its address
// to DIR/PREFIX.RANK (atomically, by rename) and waits until all are there. Real jobs exchange
// addresses over the control plane instead.
#pragma once

#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace troupe::bench {

inline std::vector<std::string> file_rendezvous(const std::string& dir, const std::string& prefix,
                                                int rank, int world, const std::string& address,
                                                std::chrono::milliseconds timeout) {
  std::string path = dir + "/" + prefix + "." + std::to_string(rank);
  {
    std::ofstream out(path + ".tmp");
    out << address;
  }
  if (::rename((path + ".tmp").c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot write " + path);
  std::vector<std::string> all(world);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < world; ++r) {
    std::string p = dir + "/" + prefix + "." + std::to_string(r);
    while (true) {
      std::ifstream in(p);
      if (in) {
        std::stringstream ss;
        ss << in.rdbuf();
        all[r] = ss.str();
        if (!all[r].empty()) break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        throw std::runtime_error("rendezvous: rank " + std::to_string(r) + " did not show up in " +
                                 dir);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  return all;
}

}  // namespace troupe::bench
