#include "tests/harness/env_faults.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

#include "models/model.h"
#include "tests/harness/guarded_compute.h"
#include "tests/harness/guarded_link.h"

namespace troupe::testing {
namespace {

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : 0;
}

class EnvFaults : public workers::FaultInjector {
 public:
  EnvFaults()
      : step_delay_us_(env_int("TROUPE_TEST_STEP_DELAY_US")),
        throw_at_step_(uint64_t(env_int("TROUPE_TEST_THROW_AT_STEP"))),
        exit_at_step_(uint64_t(env_int("TROUPE_TEST_EXIT_AT_STEP"))),
        state_delay_ms_(env_int("TROUPE_TEST_STATE_DELAY_MS")),
        checkpoint_delay_ms_(env_int("TROUPE_TEST_CHECKPOINT_DELAY_MS")),
        slow_us_(env_int("TROUPE_TEST_SLOW_STEP_US")),
        join_delay_ms_(env_int("TROUPE_TEST_JOIN_DELAY_MS")) {
    if (const char* a = std::getenv("TROUPE_TEST_SLOW_AGENT")) slow_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_THROW_AGENT")) throw_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_EXIT_AGENT")) exit_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_PERTURB_AGENT")) perturb_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_CLAIM_AGENT")) claim_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_WIDEN_AGENT")) widen_agent_ = a;
    if (const char* a = std::getenv("TROUPE_TEST_JOIN_DELAY_AGENT")) join_delay_agent_ = a;
    if (const char* f = std::getenv("TROUPE_TEST_JOIN_DELAY_FILE")) join_delay_file_ = f;
    claim_applied_ = uint64_t(env_int("TROUPE_TEST_CLAIM_APPLIED"));
    claim_blocks_ = uint64_t(env_int("TROUPE_TEST_CLAIM_BLOCKS"));
    relay_applied_ = uint64_t(env_int("TROUPE_TEST_RELAY_APPLIED"));
    if (const char* f = std::getenv("TROUPE_TEST_STATE_DELAY_FILE")) state_delay_file_ = f;
    if (const char* a = std::getenv("TROUPE_TEST_CHECKPOINT_DELAY_AGENT"))
      checkpoint_delay_agent_ = a;
    guarded_device_ = env_int("TROUPE_TEST_GUARDED_DEVICE") > 0;
    guarded_plane_ = env_int("TROUPE_TEST_GUARDED_PLANE") > 0;
  }
  bool any() const {
    return step_delay_us_ > 0 || (throw_at_step_ > 0 && !throw_agent_.empty()) ||
           state_delay_ms_ > 0 || checkpoint_delay_ms_ > 0 || !perturb_agent_.empty() ||
           guarded_device_ || (slow_us_ > 0 && !slow_agent_.empty()) || !claim_agent_.empty() ||
           !widen_agent_.empty() || (exit_at_step_ > 0 && !exit_agent_.empty()) ||
           (join_delay_ms_ > 0 && !join_delay_agent_.empty());
  }

  // TROUPE_TEST_GUARDED_DEVICE=1: every worker computes on a device the host cannot read; all
  // of them on one (they share a "GPU": host-staged), or with TROUPE_TEST_GUARDED_PLANE=1 each on
  // its own, their gradients summed over the stand-in device plane (guarded_link.h).
  std::shared_ptr<models::Compute> device_for(const std::string& agent, uint32_t device) override {
    if (!guarded_device_) return nullptr;
    if (!guarded_plane_) return std::make_shared<GuardedCompute>();
    return std::make_shared<GuardedCompute>("guarded-" + std::to_string(::getpid()) + "-" + agent +
                                            "-" + std::to_string(device));
  }
  std::unique_ptr<comm::Communicator> device_link(models::Compute& compute,
                                                  comm::Communicator& host,
                                                  std::function<bool()> abandoned) override {
    auto* guarded = dynamic_cast<GuardedCompute*>(&compute);
    return guarded && guarded_plane_ ? guarded_link(*guarded, host, std::move(abandoned)) : nullptr;
  }

  void before_checksum(const std::string& agent, uint32_t, float* parameters,
                       size_t count) override {
    if (agent == perturb_agent_ && count > 0) parameters[0] += 1.0f;
  }

  void before_ready(const std::string& agent, uint32_t, uint64_t& applied,
                    uint32_t& blocks) override {
    if (agent != claim_agent_) return;
    if (claim_applied_ > 0) applied = claim_applied_;
    if (claim_blocks_ > 0) blocks = uint32_t(claim_blocks_);
  }

  // Another program's model: its first layer wider (an mlp's first hidden layer by one, a gpt's
  // d_model by a head).
  void model(const std::string& agent, uint32_t, models::ModelSpec& m) override {
    if (agent != widen_agent_) return;
    if (m.kind == "mlp" && m.mlp_sizes.size() > 2) m.mlp_sizes[1] += 1;
    if (m.kind == "gpt") m.d_model += m.heads;
  }

  void relayed_applied(const std::string& agent, uint32_t, uint64_t& applied) override {
    if (agent == claim_agent_ && relay_applied_ > 0) applied = relay_applied_;
  }

  void before_step(const std::string& agent, uint32_t device, uint64_t step) override {
    // Once per agent process: the restarted worker does not fail again.
    if (device == 0 && agent == throw_agent_ && step + 1 == throw_at_step_ &&
        !thrown_.exchange(true))
      throw std::runtime_error("injected fault at step " + std::to_string(step) +
                               " (TROUPE_TEST_THROW_AT_STEP)");
    if (agent == exit_agent_ && step + 1 == exit_at_step_) {        // (every incarnation)
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // (its last report goes out)
      std::_Exit(9);
    }
    if (step_delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(step_delay_us_));
    if (slow_us_ > 0 && agent == slow_agent_)
      std::this_thread::sleep_for(std::chrono::microseconds(slow_us_));
  }

  void mid_state_transfer(const std::string&, uint32_t) override {
    if (state_delay_ms_ <= 0) return;
    if (state_delay_file_.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(state_delay_ms_));
      return;
    }
    const auto until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(state_delay_ms_);
    while (::access(state_delay_file_.c_str(), F_OK) == 0 &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // TROUPE_TEST_JOIN_DELAY_MS, or with TROUPE_TEST_JOIN_DELAY_FILE while that file exists (at
  // most the delay: a test releases the agent when it has done what it does meanwhile).
  void before_join(const std::string& agent) override {
    if (agent != join_delay_agent_) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(join_delay_ms_);
    while (std::chrono::steady_clock::now() < until &&
           (join_delay_file_.empty() || ::access(join_delay_file_.c_str(), F_OK) == 0))
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  void mid_checkpoint_write(const std::string& agent, uint32_t) override {
    if (checkpoint_delay_ms_ > 0 &&
        (checkpoint_delay_agent_.empty() || agent == checkpoint_delay_agent_) &&
        !checkpoint_delayed_.exchange(true))
      std::this_thread::sleep_for(std::chrono::milliseconds(checkpoint_delay_ms_));
  }

 private:
  int64_t step_delay_us_;
  uint64_t throw_at_step_, exit_at_step_;
  int64_t state_delay_ms_, checkpoint_delay_ms_, slow_us_, join_delay_ms_;
  std::string throw_agent_, perturb_agent_, slow_agent_, state_delay_file_, claim_agent_,
      widen_agent_, exit_agent_, join_delay_agent_, join_delay_file_, checkpoint_delay_agent_;
  uint64_t claim_applied_ = 0, claim_blocks_ = 0, relay_applied_ = 0;
  bool guarded_device_ = false, guarded_plane_ = false;
  std::atomic<bool> thrown_{false}, checkpoint_delayed_{false};
};

}  // namespace

std::shared_ptr<workers::FaultInjector> faults_from_environment() {
  auto f = std::make_shared<EnvFaults>();
  return f->any() ? f : nullptr;
}

}  // namespace troupe::testing
