// Membership and data decisions of the elastic protocol, as pure functions:
// decide(now, state, options) -> {decision, reason}. No threads, no clock reads, no I/O: the
// coordinator feeds them what it observed and acts on what they return; the tests feed them
// every situation (failures, joins, standbys, shrink below the minimum, rejoin timeout).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::elastic {

using Clock = std::chrono::steady_clock;

// The half-open range of a step's global sample positions that rank r of n uses: the global
// batch B is fixed and split as evenly as it goes (the first B % n ranks take one more), so the
// union over ranks is [0, B) whatever n is. Positions are relative to the step's first.
struct Share {
  uint64_t begin = 0, end = 0;
  uint64_t size() const { return end - begin; }
};
Share data_share(uint64_t global_batch, uint32_t rank, uint32_t world_size);
// parallel.deterministic: a share of whole global micro-batches (`micro` samples each; the
// global batch a multiple of it), the micro-batches split as data_share splits samples. A rank
// past the micro-batch count gets none.
Share micro_batch_share(uint64_t global_batch, uint64_t micro, uint32_t rank, uint32_t world_size);

struct Member {
  uint64_t id = 0;            // the coordinator's member (worker) id
  bool alive = true;          // false once failed, left or drained
  uint64_t applied_step = 0;  // the next step it would run (steps applied so far)
};

struct MembershipState {
  uint64_t generation = 0;
  std::vector<Member> members;    // of the current generation
  std::vector<uint64_t> waiting;  // joined, not yet members (joiners and standbys)
  bool paused = false;
  Clock::time_point paused_since{};
};

struct MembershipOptions {
  uint32_t min_workers = 1;
  uint32_t max_workers = 0;  // 0: no maximum
  std::chrono::milliseconds rejoin_timeout{30000};
  bool min_is_stages =
      false;  // min_workers is a fixed pipeline's stages (above elastic.min_workers)
  // min_workers is the fewest stages of pipeline_stages = "auto" within
  // parallel.max_params_per_worker (above elastic.min_workers)
  bool min_is_budget_stages = false;
};

struct MembershipDecision {
  enum class Kind {
    keep,            // nothing to do
    new_generation,  // open generation+1 with `members`
    pause,           // below min_workers: wait for members
    fail,            // paused longer than the rejoin timeout: the job fails
  } kind = Kind::keep;
  std::vector<uint64_t>
      members;  // for new_generation: the next generation's members, in rank order
  std::vector<uint64_t> standbys;  // for new_generation: joined but above max_workers
  std::string reason;
};

// What to do after the coordinator observed failures, leaves or joins (already applied to state:
// failed members have alive = false, joiners are in `waiting`).
MembershipDecision decide_membership(Clock::time_point now, const MembershipState& state,
                                     const MembershipOptions& options);

}  // namespace troupe::elastic
