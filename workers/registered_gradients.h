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

#include <map>
#include <memory>
#include <string>

#include "comm/shared_arena.h"
#include "models/model.h"

namespace troupe::workers {

// What else a step sums in place besides the gradients, carved from the same arena
// (InPlaceBuffers): the integers of parallel.deterministic's exact sums (the largest block's) or
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

// The buffers of what else a step sums in place (AlsoSummed), carved from a worker's arena and
// kept from one generation to the next: given back, their pages would be faulted in again at the
// next generation's first step, by this rank and by every other that maps them. They stay until
// the worker goes (a standby's too). One taker per key at a time (a second take() while the first
// taker holds the buffer throws std::logic_error).
class InPlaceBuffers {
 public:
  static constexpr size_t kExactSums = 0;  // the keys: ExactSum's integers
  static constexpr size_t kHalves = 1;     // + b: GradientSum's bf16 copy of block b
  explicit InPlaceBuffers(std::shared_ptr<comm::SharedArena> arena = nullptr)
      : arena_(std::move(arena)) {}
  // Buffer `key`: `numel` floats in the arena (host memory `compute` runs on), zeros when new;
  // the one an earlier call took when it has this size (its contents as left), else a new one
  // (the old given back first). Undefined when there is no arena or no room left in it (then the
  // caller uses memory of its own and the sum stages copies).
  models::Tensor take(size_t key, size_t numel, models::Compute& compute);

 private:
  std::shared_ptr<comm::SharedArena> arena_;
  std::map<size_t, models::Tensor> kept_;
};

}  // namespace troupe::workers
