// The state transfer at a generation's start: executes this rank's part of an
// elastic::Migration (every member computed the same one): restores the blocks it rolls back to
// its own snapshot or backup, sends the batches it is the source of (from its live buffers, its
// snapshot or its backup, as the migration says) and receives those it lacks, point to point
// over the generation's communicator, every buffer of a batch in flight at once.
#pragma once

#include <cstdint>
#include <functional>

#include "comm/communicator.h"
#include "elastic/generation.h"
#include "workers/block_state.h"
#include "workers/stage_backups.h"

namespace troupe::workers {

// What a state transfer moved, as seen by one rank.
struct StateTransfer {
  bool needed = false;  // this rank lacked blocks it needs (and received them)
  uint64_t bytes = 0;   // received
  uint32_t blocks = 0;  // blocks received
  double seconds = 0;
};

// mid_send (may be empty): called after the first buffer of each batch this rank sends (a test's
// fault injection: a transfer caught in the middle). `device` (may be null): the generation's
// device plane (workers/device_plane.h): the batches go over it, device to device.
StateTransfer execute_migration(comm::Communicator& comm, const elastic::Migration& migration,
                                uint64_t start_step, BlockStates& states, StageBackups& backups,
                                const std::function<void()>& mid_send,
                                comm::Communicator* device = nullptr);

}  // namespace troupe::workers
