#include "workers/generation_board.h"

namespace troupe::workers {

void GenerationBoard::start(actors::GenerationStart g) {
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = std::move(g);
  cv_.notify_all();
}

void GenerationBoard::stop_at_next_step(bool with_checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  if (with_checkpoint) checkpoint_at_stop_.store(true);
  stop_.store(true);
  cv_.notify_all();
}

void GenerationBoard::checkpoint_at_step(uint64_t step) {
  uint64_t seen = checkpoint_at_.load();
  while (step > seen && !checkpoint_at_.compare_exchange_weak(seen, step)) {
  }
}

void GenerationBoard::leave(uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  leave_.store(generation);
  cv_.notify_all();
}

void GenerationBoard::shut_down(int exit_code, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return;
  shutdown_ = true;
  exit_code_ = exit_code;
  reason_ = reason;
  stop_.store(true);
  cv_.notify_all();
}

void GenerationBoard::rejoined(uint64_t next_generation) {
  std::lock_guard<std::mutex> lock(mu_);
  latest_.reset();  // (the lost coordinator's generations are over; the new one numbers its own)
  // Its stop too: the run taken over goes on to job.steps unless the new one asks again (kept,
  // every member ended a step later, and the take-over's job ended there "completed").
  if (!shutdown_) stop_.store(false), checkpoint_at_stop_.store(false);
  next_generation_.store(next_generation);
  rejoins_.fetch_add(1);
  cv_.notify_all();
}

std::optional<actors::GenerationStart> GenerationBoard::await(uint64_t want,
                                                              uint64_t rejoins_seen) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] {
    return (latest_ && latest_->generation >= want) || shutdown_ || rejoins_.load() != rejoins_seen;
  });
  if (shutdown_ || rejoins_.load() != rejoins_seen) return std::nullopt;
  return latest_;
}

void GenerationBoard::await_reason(uint64_t generation, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout,
               [&] { return stop_.load() || leave_.load() == generation || shutdown_; });
}

bool GenerationBoard::await_shutdown(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return shutdown_; });
}

bool GenerationBoard::await_end(uint64_t generation) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return shutdown_ || leave_.load() == generation; });
  return shutdown_;
}

bool GenerationBoard::shutting_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}

uint64_t GenerationBoard::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (latest_) return latest_->generation;
  const uint64_t next = next_generation_.load();  // (rejoined: before the new coordinator's first)
  return next > 0 ? next - 1 : 0;
}

int GenerationBoard::exit_code() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exit_code_;
}

std::string GenerationBoard::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

}  // namespace troupe::workers
