// A block's training state as bytes: parameters, optimizer moments, step and data cursor. The
// unit of checkpoints and of state transfer to a joining worker.
//
// Layout (little-endian): "TRPBLK01", u32 version, u32 kind length, kind, u64 block index,
// u64 param count, u64 step, u64 cursor, u8 moments (0, 1 or 2), then the float arrays.
#pragma once

#include <cstdint>
#include <string>
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
// The same into a buffer kept from an earlier save (a checkpoint's staging copy): when the size
// is unchanged it is a plain copy into memory already touched.
void save_block_state_into(std::vector<uint8_t>& into, Block& block, size_t index, Optimizer& opt,
                           const BlockState& s);
// Restores into block and opt; throws std::invalid_argument naming the mismatch (magic, version,
// kind, index, size, truncation). On a throw, nothing was modified.
BlockState load_block_state(const std::vector<uint8_t>& bytes, Block& block, size_t index,
                            Optimizer& opt);
// The same from a file, read straight into the block's and the optimizer's buffers (no staging
// copy: a restore reads each byte once). Throws std::runtime_error naming the file.
BlockState load_block_state_file(const std::string& path, Block& block, size_t index,
                                 Optimizer& opt);
// The parameter count a block state file's header says (a model's shape read back from its
// checkpoint: the GPT's vocabulary is its embedding block's count / d_model - context). Throws
// std::runtime_error naming the file.
uint64_t block_state_param_count(const std::string& path);

}  // namespace troupe::models
