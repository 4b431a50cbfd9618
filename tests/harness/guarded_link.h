// The device plane of a stand-in device (tests/harness/guarded_compute.h), in NCCL's place: a
// Communicator that takes the device's addresses, as NCCL takes a GPU's, and moves their bytes
// over the generation's host communicator. The worker's device-plane path (gradients summed in
// place in device memory, after the device's fence) then runs without a GPU; a host-staged
// pointer handed to it is not the device's and aborts the process (GuardedCompute::real).
//
// Thread-safety: as the host communicator (the reducer thread uses it while the worker thread
// computes: GuardedCompute's address map is locked).
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"
#include "tests/harness/guarded_compute.h"

namespace troupe::testing {

// `abandoned`: the generation's (workers/device_plane.h); its operations are waited on as NCCL's.
std::unique_ptr<comm::Communicator> guarded_link(GuardedCompute& device, comm::Communicator& host,
                                                 std::function<bool()> abandoned);

}  // namespace troupe::testing
