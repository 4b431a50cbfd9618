// The next micro-batch, assembled on a background thread while the current one computes.
//
// The trainer takes the batch of positions [first, last) and says which it expects next (the
// step's next micro-batch, or the next step's first for the same share). A take that matches the
// expected range waits for it (already done, unless assembly is slower than the compute it
// overlapped); any other range is assembled at once on the caller's thread, so a changed share
// (a new generation) costs one synchronous batch, never a wrong one. The batch of a range is
// the same either way: the data set's fill is a pure function of the sample.
//
// Thread-safety: take() and expect() from one thread (the worker's); the background thread has
// its own sampler and only reads the data set (Dataset::fill is const).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>

#include "models/data.h"

namespace troupe::models {

class BatchPrefetcher {
 public:
  BatchPrefetcher(const Dataset& data, uint64_t seed);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // The batch of global positions [first, last). Rethrows what assembling it threw.
  Batch take(uint64_t first, uint64_t last);
  // Starts assembling [first, last) in the background (replacing an expectation not taken).
  void expect(uint64_t first, uint64_t last);

  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }

 private:
  void run();

  const Dataset& data_;
  GlobalSampler sampler_;  // the background thread's
  GlobalSampler own_;      // the caller's, for a range not expected
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, wanted_ = false, ready_ = false;
  uint64_t first_ = 0, last_ = 0;  // the expected range
  Batch batch_;
  std::exception_ptr error_;
  uint64_t hits_ = 0, misses_ = 0;
  std::thread thread_;  // (last: started once the rest is built)
};

}  // namespace troupe::models
