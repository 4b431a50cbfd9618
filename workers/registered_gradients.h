// A CPU worker's gradients in shared memory the other workers of its host map (registered
// buffers: comm/shared_arena.h), so the host communicator's in-place allreduce of a block's
// gradients reads the others' straight from their buffers instead of staging copies
// (comm/shm_allreduce.h: 2.5 x the bytes of memory traffic per rank instead of 4.5 x with two
// ranks, from the size comm::peer_lines() gives). The arena is created once per worker and given
// to every generation's communicator (UcxCommOptions::registered); a member without one (a GPU
// worker, a loop of its own) makes every rank stage, as before.
//
// Thread-safety: register_gradients() before the model computes; the memory as any tensor's.
#pragma once

#include <memory>
#include <string>

#include "comm/shared_arena.h"
#include "models/model.h"

namespace troupe::workers {

// What else a step sums in place besides the gradients, carved from the same arena
// (arena_tensor): the integers of parallel.deterministic's exact sums (the largest block's) or
// the bf16 copies of parallel.reduce_dtype = "bf16" (every block's).
struct AlsoSummed {
  bool exact_sums = false;
  bool bf16_copies = false;
};

// Moves the gradients of every block of `model` that lives in host memory into one new arena
// with room for `also`; they read zeros after (call it before a backward). Returns the arena, or
// null and why when the system refuses one or no block's gradients are on the host (the
// gradients stay where they are).
std::shared_ptr<comm::SharedArena> register_gradients(models::Model& model, AlsoSummed also,
                                                      std::string* why);

// `numel` floats of zeros in `arena` (host memory `compute` runs on), for a sum read in place by
// the others; undefined when there is no arena or no room left in it (then the caller uses
// memory of its own and the sum stages copies).
models::Tensor arena_tensor(const std::shared_ptr<comm::SharedArena>& arena, size_t numel,
                            models::Compute& compute);

}  // namespace troupe::workers
