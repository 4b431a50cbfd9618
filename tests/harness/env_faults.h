// The test build's fault injector (workers::FaultInjector), configured from the environment of
// the `troupe_test` process, so the multi-process tests can inject faults into agents started by
// `troupe run`. The release `troupe` has none of this.
//
//   TROUPE_TEST_STEP_DELAY_US     every step of every worker waits this long first (pacing)
//   TROUPE_TEST_THROW_AGENT       with TROUPE_TEST_THROW_AT_STEP: device 0 of the agent of this
//   TROUPE_TEST_THROW_AT_STEP     name throws once when it reaches this step (counting from 1)
//   TROUPE_TEST_EXIT_AGENT        with TROUPE_TEST_EXIT_AT_STEP: that agent's process exits (9)
//   TROUPE_TEST_EXIT_AT_STEP      when it reaches this step (from 1), in every incarnation
//   TROUPE_TEST_STATE_DELAY_MS    a state transfer this agent sends pauses this long after its
//                                 first buffer
//   TROUPE_TEST_STATE_DELAY_FILE  with the delay: the pause lasts while this file exists (at most
//                                 the delay)
//   TROUPE_TEST_CHECKPOINT_DELAY_MS  an agent's first checkpoint write pauses this long after its
//                                 first shard
//   TROUPE_TEST_CHECKPOINT_DELAY_AGENT  with the delay: only this agent's
//   TROUPE_TEST_SLOW_AGENT        with TROUPE_TEST_SLOW_STEP_US: that agent's workers wait this
//   TROUPE_TEST_SLOW_STEP_US      long more before every step (a straggler: counted as compute)
//   TROUPE_TEST_GUARDED_DEVICE    1: every worker computes on a stand-in device the host cannot
//                                 read (tests/harness/guarded_compute.h): the host-staged paths
//   TROUPE_TEST_PERTURB_AGENT     that agent's workers change a parameter before the job's final
//                                 checksum (the members then end different)
#pragma once

#include <memory>

#include "workers/faults.h"

namespace troupe::testing {

// Null when none of the variables is set.
std::shared_ptr<workers::FaultInjector> faults_from_environment();

}  // namespace troupe::testing
