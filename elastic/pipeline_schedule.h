// One pipeline stage's schedule for one step, as a pure list of operations: 1F1B without
// interleaving (as Megatron's): stage s of pp runs min(pp - s - 1, m) forwards to fill the
// pipeline, then one forward and one backward in turn, then the remaining backwards. The
// workers execute the list with a small loop (workers/pipeline_step.cpp); the unit tests check
// it for every pp and m: each micro-batch forward then backward once, in order, no deadlock
// between neighbours, at most pp - s micro-batches in flight on stage s.
//
// Legend: pp stages, s this stage, m micro-batches per step, j a micro-batch.
// Data flow: activations go to the next stage, gradients come back to the previous one. An
// exchange posts at most one send and one receive at once (a sendrecv), so two neighbours that
// exchange in both directions never wait on each other.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::elastic {

// A message of the schedule: an activation travels to the next stage, a gradient to the previous
// one; a receive takes an activation from the previous stage, a gradient from the next.
struct PipeMessage {
  enum class What : uint8_t { activation, gradient } what = What::activation;
  uint32_t micro = 0;
  bool operator==(const PipeMessage& o) const { return what == o.what && micro == o.micro; }
};

struct PipeOp {
  enum class Kind : uint8_t {
    load,      // the first stage: read micro-batch `micro`'s inputs from the data set
    forward,   // run the stage's blocks forward on micro's input
    loss,      // the last stage: score micro's output, giving the output's gradient
    backward,  // run the stage's blocks backward on micro's output gradient
    exchange,  // post `send` and `recv` (either may be absent) and wait for both
  } kind = Kind::forward;
  uint32_t micro = 0;  // for load, forward, loss, backward
  std::optional<PipeMessage> send, recv;
};

// The operations of stage `stage` of `stages` for a step of `micro_batches` micro-batches.
std::vector<PipeOp> one_f_one_b(uint32_t stages, uint32_t stage, uint32_t micro_batches);

// For logs and test messages: "F0 x(>a0) B0 ...".
std::string describe(const std::vector<PipeOp>& ops);

}  // namespace troupe::elastic
