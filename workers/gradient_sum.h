// The gradient reductions of a data-parallel step, block by block (each block's flat gradient
// buffer is one bucket): summed over the members in f32, or in bf16 (parallel.reduce_dtype: half
// the bytes moved, each partial sum rounded), over the generation's device plane when it has
// one (in place in device memory, once the device has written the block: its fence), else
// host-staged over the host communicator.
//
// Thread-safety: prepare() and finish() on the worker's thread (they call its Compute);
// reduce() on one thread at a time (the reducer's while the worker's computes the next block).
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "models/model.h"
#include "workers/registered_gradients.h"

namespace troupe::workers {

class GradientSum {
 public:
  // in_place: where the bf16 copies go when it has room (read in place by the others:
  // workers/registered_gradients.h; the f32 gradients are there already; null: memory of the
  // device's).
  GradientSum(models::Model& model, bool bf16, std::chrono::milliseconds timeout,
              InPlaceBuffers* in_place = nullptr);
  // Once block b's backward is enqueued: its bf16 copy, and the fence a reduction over the
  // device plane waits for (device_plane may be null).
  void prepare(size_t b, comm::Communicator* device_plane);
  // Block b summed over the members; returns whether it went over the device plane.
  bool reduce(size_t b, comm::Communicator& host, comm::Communicator* device_plane);
  // After every reduce(): the bf16 sums back into the gradients (nothing in f32).
  void finish();

 private:
  models::Tensor& bucket(size_t b);  // what reduce() sums: the gradients or their bf16 copy
  models::Model& model_;
  const bool bf16_;
  const std::chrono::milliseconds timeout_;
  InPlaceBuffers* in_place_;
  std::vector<models::Tensor> half_;  // per block: bf16 bits, two to a float element
  std::vector<std::unique_ptr<models::Compute::Fence>> ready_;
  std::vector<size_t> prepared_;
};

}  // namespace troupe::workers
