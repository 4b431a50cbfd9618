#include "elastic/membership.h"

#include <algorithm>

namespace troupe::elastic {

Share data_share(uint64_t B, uint32_t rank, uint32_t world) {
  if (world == 0 || rank >= world) return {};
  uint64_t n = world, r = rank, base = B / n, rem = B % n;
  uint64_t begin = r * base + std::min(r, rem);
  return {begin, begin + base + (r < rem ? 1 : 0)};
}

Share micro_batch_share(uint64_t B, uint64_t micro, uint32_t rank, uint32_t world) {
  if (micro == 0) return {};
  Share s = data_share(B / micro, rank, world);
  return {s.begin * micro, s.end * micro};
}

namespace {

// The least workers, named by what sets it (a pipeline's stages were said to be min_workers).
std::string least(const MembershipOptions& o) {
  if (o.min_is_budget_stages)
    return "the " + std::to_string(o.min_workers) +
           " pipeline stages parallel.max_params_per_worker needs (a worker each)";
  return o.min_is_stages
             ? "parallel.pipeline_stages = " + std::to_string(o.min_workers) + " (a worker each)"
             : "elastic.min_workers = " + std::to_string(o.min_workers);
}

}  // namespace

MembershipDecision decide_membership(Clock::time_point now, const MembershipState& s,
                                     const MembershipOptions& o) {
  MembershipDecision d;
  std::vector<uint64_t> alive;
  for (const auto& m : s.members)
    if (m.alive) alive.push_back(m.id);
  const bool lost = alive.size() != s.members.size();
  // Candidates: survivors first (keeping their order), then those waiting, in arrival order.
  std::vector<uint64_t> candidates = alive;
  for (uint64_t w : s.waiting)
    if (std::find(candidates.begin(), candidates.end(), w) == candidates.end())
      candidates.push_back(w);
  const size_t cap =
      o.max_workers ? std::min<size_t>(o.max_workers, candidates.size()) : candidates.size();

  if (cap < o.min_workers) {
    if (s.paused && now - s.paused_since > o.rejoin_timeout) {
      d.kind = MembershipDecision::Kind::fail;
      d.reason = "only " + std::to_string(cap) + " worker(s), fewer than " + least(o) +
                 ", for longer than elastic.rejoin_timeout_ms = " +
                 std::to_string(o.rejoin_timeout.count());
    } else {
      d.kind = MembershipDecision::Kind::pause;
      d.reason = std::to_string(cap) + " worker(s) available, " + least(o);
    }
    return d;
  }
  // Enough members. A new generation if someone was lost, someone can be admitted, or we were
  // paused; otherwise (only standbys above max_workers) keep going.
  const bool admits = cap > alive.size();
  if (!lost && !admits && !s.paused) {
    if (!s.waiting.empty()) {
      d.standbys = s.waiting;
      d.reason = "at elastic.max_workers; " + std::to_string(s.waiting.size()) + " standby(s)";
    }
    return d;
  }
  d.kind = MembershipDecision::Kind::new_generation;
  d.members.assign(candidates.begin(), candidates.begin() + long(cap));
  d.standbys.assign(candidates.begin() + long(cap), candidates.end());
  d.reason = std::string(lost       ? "member(s) lost"
                         : s.paused ? "resuming after a pause"
                                    : "member(s) joined") +
             ": generation " + std::to_string(s.generation + 1) + " with " + std::to_string(cap) +
             " worker(s)";
  return d;
}

}  // namespace troupe::elastic
