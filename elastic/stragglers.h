// Stragglers, as a pure decision over committed steps: a worker whose compute time (forward and
// backward, not the waits: every member's step time is the same in a synchronous job) exceeds
// `factor` times the median of the others' (and that by a millisecond at least) for `steps`
// consecutive committed steps is a straggler. It is reported once, and again only after it has been
// fast for a step. Ranks name workers within one generation: reset() when the membership changes.
// No clock, no I/O.
//
// Where it applies: data-parallel members, which compute the same work (shares differ by one
// sample at most). Pipeline stages compute different blocks, so their times are not comparable
// and the caller does not feed them (docs/design.md, "Observability").
//
// Thread-safety: none; one owner.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::elastic {

struct StragglerPolicy {
  double factor = 2.0;  // elastic.straggler_factor
  uint32_t steps = 20;  // elastic.straggler_steps
  // Slower by less than this is jitter, not a straggler: a loop's steps of microseconds were
  // reported as stragglers (2.4 us against 1.1 us) every few thousand steps.
  double min_excess_seconds = 1e-3;
};

struct Straggler {
  uint32_t rank = 0;
  double seconds = 0;  // its compute time in the step that made it one
  double median = 0;   // the others' median then
  uint32_t steps = 0;  // consecutive slow steps
};

class StragglerDetector {
 public:
  explicit StragglerDetector(StragglerPolicy policy) : policy_(policy) {}

  // One committed step: each rank's compute seconds (NaN or negative: it did not report). The
  // ranks that just became stragglers.
  std::vector<Straggler> observe(const std::vector<double>& seconds);
  void reset() { slow_.clear(); }

 private:
  StragglerPolicy policy_;
  std::vector<uint32_t> slow_;  // consecutive slow steps, by rank
};

}  // namespace troupe::elastic
