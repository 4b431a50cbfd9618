// The point-to-point tags of the workers' data-plane messages: one checked list. Each is a
// constexpr comm::Tag, so a value that does not fit the wire's tag field fails to compile
// (comm/communicator.h); two uses never share a value (the static_asserts below).
#pragma once

#include "comm/communicator.h"

namespace troupe::workers::tags {

constexpr comm::Tag kPipeline{1};  // activations forward, gradients back between stages
constexpr comm::Tag kState{2};     // parameters and optimizer moments at a generation's start
constexpr comm::Tag kBackup{3};    // a pipeline stage's backup to the next stage's worker

static_assert(!(kPipeline == kState) && !(kPipeline == kBackup) && !(kState == kBackup),
              "every use has its own tag");

}  // namespace troupe::workers::tags
