// A block's training state as bytes: parameters, optimizer moments, step and data cursor. The
// unit of checkpoints and of state transfer to a joining worker.
//
// Layout (little-endian): "TRPBLK01", u32 version, u32 kind length, kind, u64 block index,
// u64 param count, u64 step, u64 cursor, u8 moments (0, 1 or 2), then the float arrays.
#pragma once

#include <cstdint>
#include <vector>

#include "models/blocks.h"
#include "models/optim.h"

namespace troupe::models {

struct BlockState {
  uint64_t step = 0;    // the next step to run
  uint64_t cursor = 0;  // the next global sample position
};

std::vector<uint8_t> save_block_state(Block& block, size_t index, Optimizer& opt,
                                      const BlockState& s);
// Restores into block and opt; throws std::invalid_argument naming the mismatch (magic, version,
// kind, index, size, truncation). On a throw, nothing was modified.
BlockState load_block_state(const std::vector<uint8_t>& bytes, Block& block, size_t index,
                            Optimizer& opt);

}  // namespace troupe::models
