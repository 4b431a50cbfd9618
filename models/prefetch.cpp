#include "models/prefetch.h"

#include <chrono>
#include <stdexcept>
#include <utility>

namespace troupe::models {

BatchPrefetcher::BatchPrefetcher(const Dataset& data, uint64_t seed)
    : data_(data),
      sampler_(seed, data.size()),
      own_(seed, data.size()),
      thread_([this] { run(); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void BatchPrefetcher::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (wanted_ && !ready_); });
    if (stop_) return;
    const uint64_t first = first_, last = last_;
    lock.unlock();
    Batch b;
    std::exception_ptr error;
    try {
      b = make_batch(data_, sampler_, first, last);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (wanted_ && first_ == first && last_ == last) {  // (still the one expected)
      batch_ = std::move(b);
      error_ = error;
      ready_ = true;
      cv_.notify_all();
    }
  }
}

void BatchPrefetcher::expect(uint64_t first, uint64_t last) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    wanted_ = true;
    ready_ = false;
    first_ = first;
    last_ = last;
  }
  cv_.notify_all();
}

Batch BatchPrefetcher::take(uint64_t first, uint64_t last) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!wanted_ || first_ != first || last_ != last) {
    wanted_ = false;  // (an expectation not met: whatever it assembles is dropped)
    lock.unlock();
    ++misses_;
    return make_batch(data_, own_, first, last);
  }
  // Assembly reads memory-mapped or in-memory data and ends in bounded time; the deadline only
  // turns a bug into an error instead of a hang.
  if (!cv_.wait_for(lock, std::chrono::seconds(120), [&] { return ready_ || stop_; }))
    throw std::runtime_error("the batch prefetcher took over 120 s for one micro-batch");
  wanted_ = false;
  ready_ = false;
  ++hits_;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::move(batch_);
}

}  // namespace troupe::models
