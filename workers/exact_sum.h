// parallel.deterministic: gradient sums whose bits do not depend on how the global batch was
// split among workers, stages or micro-batch loops.
//
// Floating-point addition is not associative, so a sum over workers in another order (another
// world size, a join, a scale) gives other low bits, and AdamW carries them on. Here the global
// batch is cut into global micro-batches (batch.micro samples each, the same cut at every world
// size); each is computed alone, from zeroed gradients. Each micro-batch's gradient is turned
// into 64-bit fixed point with one scale per block that every rank agrees on (from the largest
// magnitude of the step, an exact max gathered from everyone), the integers are added (integer
// addition is associative: any grouping, any order, the same result), and the sum is turned back
// into floats. The loss is summed the same way. What each micro-batch computes depends only on
// the parameters and its samples, so the step's result is the same bits whatever the layout.
//
// The scale: for a block whose largest |g| over the step is below 2^E, and T micro-batches in
// the global batch, every value is multiplied by 2^(51 - E - ceil(log2 T)) and rounded to the
// nearest integer: every partial sum of T of them stays below 2^51 (so it converts back to
// double exactly, and the conversions vectorise), and values within 2^-(27 - log2 T) of the
// block's largest keep every bit of their float; smaller ones are rounded to a fixed absolute
// step of at most 2^-50 of the largest (a float sum rounds them relative to the running sum). A
// non-finite gradient anywhere makes the block's sum NaN on every rank, as a float sum would.
//
// Thread-safety: none; one worker's thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "models/model.h"
#include "workers/registered_gradients.h"

namespace troupe::workers {

constexpr int kFixedPointBits = 51;
// The exponent e of the fixed-point scale 2^e for a block whose largest magnitude is max_abs
// (finite, >= 0) and a sum of `terms` micro-batches.
int fixed_point_exponent(double max_abs, uint64_t terms);
// acc[i] += round(g[i] * 2^e)
void add_fixed_point(int64_t* acc, const float* g, size_t n, int e);
// g[i] = acc[i] * 2^-e
void from_fixed_point(float* g, const int64_t* acc, size_t n, int e);
// A loss in fixed point (2^-32 resolution), as an integer-valued double: while the total stays
// below 2^20, sums of them are exact in double, in any order.
double fixed_point_loss(double loss);
double loss_from_fixed_point(double sum);

// The per-step gradient sum of the blocks [first, last) of a model.
class ExactSum {
 public:
  // terms: the global micro-batches of a step (batch.global / batch.micro). in_place: where the
  // integer sums go when it has room (read in place by the others: workers/registered_gradients.h;
  // null: this object's own memory).
  ExactSum(models::Model& model, uint32_t first, uint32_t last, uint64_t terms,
           InPlaceBuffers* in_place = nullptr);

  // After a micro-batch's backward: its gradient moves aside and the blocks' are zeroed, so the
  // next micro-batch starts from zero. (The last micro-batch's may stay in the blocks.)
  void keep();
  // Every member calls it once per step (a member without micro-batches too: it adds zeros).
  // Leaves the blocks holding the exact sum of every micro-batch of every member.
  // has_gradient: false when this member computed no micro-batch this step (the blocks' buffers
  // are then read as zeros).
  void reduce(comm::Communicator& comm, bool has_gradient);

 private:
  double local_max(uint32_t b, bool has_gradient) const;
  int64_t* zeroed_sums(size_t count);  // in the arena when it has room, else in own_

  models::Model& model_;
  uint32_t first_, last_;
  uint64_t terms_;
  size_t kept_ = 0;                                     // micro-batches moved aside this step
  std::vector<std::vector<std::vector<float>>> stash_;  // [micro][block - first]
  InPlaceBuffers* in_place_;
  size_t most_ = 0;        // the largest block's gradient elements
  models::Tensor shared_;  // the integer sums in the arena (two floats an integer)
  std::vector<int64_t> own_;
};

}  // namespace troupe::workers
