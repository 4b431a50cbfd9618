// Runs n ranks of a UcxCommunicator as threads in one process (the same UCX backend as between
// processes: each rank has its own UCX worker and talks through UCX, or through the segments of
// the shared-memory allreduce, never through the process's own memory).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/ucx_communicator.h"

namespace troupe::testing {

// options_of(rank): each rank's options (they may differ, to test that the ranks agree).
inline void run_world_each(int n, const std::function<comm::UcxCommOptions(int)>& options_of,
                           const std::function<void(comm::UcxCommunicator&)>& body,
                           uint64_t generation = 1) {
  std::vector<std::unique_ptr<comm::UcxCommunicator>> comms;
  std::vector<std::string> addresses;
  for (int r = 0; r < n; ++r) {
    comms.push_back(std::make_unique<comm::UcxCommunicator>(generation, options_of(r)));
    addresses.push_back(comms.back()->address());
  }
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[r]->connect(r, addresses, std::chrono::seconds(30));
        body(*comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r)
    if (errors[r]) std::rethrow_exception(errors[r]);
}

inline void run_world(int n, const comm::UcxCommOptions& options,
                      const std::function<void(comm::UcxCommunicator&)>& body,
                      uint64_t generation = 1) {
  run_world_each(
      n, [&](int) { return options; }, body, generation);
}

}  // namespace troupe::testing
