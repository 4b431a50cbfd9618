// Runs reductions on its own thread, in the order pushed (parallel.overlap_reduce): a block's
// gradient is reduced while the backward pass computes the next block's.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::workers {

// The communicator is used by one thread at a time: the reducer during the backward pass, the
// worker after finish().
class Reducer {
 public:
  explicit Reducer(std::function<void(size_t)> reduce) : reduce_(std::move(reduce)) {
    thread_ = std::thread([this] { loop(); });
  }
  ~Reducer() {
    if (thread_.joinable()) {
      push(kStop);
      thread_.join();
    }
  }
  void push(size_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(block);
    cv_.notify_one();
  }
  // Waits for every pushed reduction; rethrows the first failure.
  void finish() {
    push(kStop);
    thread_.join();
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static constexpr size_t kStop = SIZE_MAX;
  void loop() {
    while (true) {
      size_t b;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty(); });
        b = queue_.front();
        queue_.pop_front();
      }
      if (b == kStop) return;
      if (error_) continue;  // after a failure, drain without reducing
      try {
        reduce_(b);
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
  std::function<void(size_t)> reduce_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace troupe::workers
