// The NCCL backend of the Communicator (CUDA device memory). Compiled when the CUDA toolkit and
// NCCL are found (TROUPE_HAVE_CUDA); without them, make_nccl_communicator() throws.
//
// Elasticity lives in three NCCL calls:
//   - init is non-blocking (ncclCommInitRankConfig with blocking = 0) and polled against a
//     deadline: a member that never arrives makes init fail with timed_out, not hang;
//   - every operation is enqueued on the communicator's stream and then polled
//     (cudaStreamQuery + ncclCommGetAsyncError), never waited on with a blocking sync;
//   - any failure, deadline or abort() ends in ncclCommAbort: never ncclCommDestroy with dead
//     peers (a collective that would hang).
// The unique id comes from the caller (rank 0 makes it with nccl_unique_id(); the control plane
// carries it to the others).
//
// Thread-safety: as Communicator: one thread runs operations; abort() from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace troupe::comm {

struct NcclOptions {
  std::chrono::milliseconds timeout{30000};  // init and each operation
  int device = 0;
  // True once the caller knows the generation is over (a member is gone: NCCL between GPUs may
  // never notice a dead peer). An operation still waiting `abandon_after` past its start then
  // fails with peer_lost instead of waiting out its timeout; one that completes is unaffected.
  std::function<bool()> abandoned;
  std::chrono::milliseconds abandon_after{200};
};

// A new NCCL unique id as hex (rank 0 creates it; works without a GPU).
std::string nccl_unique_id();

// Initialises this rank's member of a generation's NCCL communicator. Throws Error: timed_out,
// peer_lost (NCCL reported a remote error), invalid_input, io (CUDA/NCCL unavailable).
std::unique_ptr<Communicator> make_nccl_communicator(uint64_t generation, int rank, int size,
                                                     const std::string& unique_id_hex,
                                                     const NcclOptions& options = {});

}  // namespace troupe::comm
