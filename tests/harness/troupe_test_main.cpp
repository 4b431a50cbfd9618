// troupe_test: the `troupe` command of the test build. The same dispatch as the release binary,
// plus a fault injector read from TROUPE_TEST_* (env_faults.h) for the agents' workers, and kinds
// of its own as a user's program adds them (test_kinds.h). The integration tests run this
// binary; `troupe run` starts its agents from it too. `troupe_test loop-misuse ADDRESS
// TOKEN_FILE` is a member of a model.kind = "external" job that calls ElasticLoop out of order
// (before its first step and after its last) and prints what it was told, training in between.
// `troupe_test loop-member ADDRESS TOKEN_FILE NAME [dies-at-end]` is a plain member of one; with
// dies-at-end it is killed (_Exit) 300 ms after its last step's commit, before it says its end;
// with nan-at-step-3 its loss at step 3 is nan; with leaves-at-step-5 it asks to leave
// (ElasticLoop::leave) at step 5 and prints the answer; with slow-save its LoopState::save takes
// 8 s (and its steps 2 ms).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "tests/harness/env_faults.h"
#include "tests/harness/test_kinds.h"
#include "workers/elastic_loop.h"

namespace {

int loop_misuse(const char* address, const char* token_file) {
  double state = 0;
  troupe::LoopState s{
      [&] { return std::vector<uint8_t>(sizeof state); },
      [&](const std::vector<uint8_t>&) {},
  };
  troupe::ElasticLoop loop({address, token_file, "misuse"}, s);  // (docs/api.md's form)
  float g = 1;
  try {
    loop.allreduce(&g, 1);
  } catch (const std::logic_error& e) {
    std::printf("before: %s\n", e.what());
  }
  while (auto step = loop.next_step()) {
    g = 1;
    if (!loop.allreduce(&g, 1)) continue;
    if (loop.commit(1.0)) state += g;
  }
  try {
    loop.commit(1.0);
  } catch (const std::logic_error& e) {
    std::printf("after: %s\n", e.what());
  }
  std::fflush(stdout);
  return loop.exit_code();
}

int loop_member(const char* address, const char* token_file, const char* name,
                const std::string& how) {
  const bool dies = how == "dies-at-end", nan = how == "nan-at-step-3",
             leaves = how == "leaves-at-step-5", slow_save = how == "slow-save";
  double state = 0;
  troupe::LoopState s{
      [&] {
        if (slow_save) std::this_thread::sleep_for(std::chrono::seconds(8));
        std::vector<uint8_t> b(sizeof state);
        std::memcpy(b.data(), &state, sizeof state);
        return b;
      },
      [&](const std::vector<uint8_t>& b) { std::memcpy(&state, b.data(), sizeof state); },
  };
  troupe::ElasticLoop loop({address, token_file, name}, s);
  while (auto step = loop.next_step()) {
    // (slow-save's job runs until the join: steps of 2 ms, not a coordinator flooded with reports)
    if (slow_save) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    float g = 1;
    if (!loop.allreduce(&g, 1) || !loop.commit(nan && step->step == 3 ? NAN : 1.0)) continue;
    state += g;
    if (leaves && step->step == 5) {
      const std::string refused = loop.leave();
      std::printf("%s: leave: %s\n", name, refused.empty() ? "accepted" : refused.c_str());
    }
    if (dies && step->step + 1 == loop.job().steps) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (its report goes out)
      std::_Exit(9);
    }
  }
  std::printf("%s: %s (state %g)\n", name, loop.reason().c_str(), state);
  std::fflush(stdout);
  return loop.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "loop-misuse") == 0) return loop_misuse(argv[2], argv[3]);
  if ((argc == 5 || argc == 6) && std::strcmp(argv[1], "loop-member") == 0)
    return loop_member(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : "");
  troupe::cli::Hooks hooks;
  hooks.faults = [] { return troupe::testing::faults_from_environment(); };
  hooks.extensions = troupe::testing::test_kinds();
  return troupe::cli::troupe_main(argc, argv, hooks);
}
