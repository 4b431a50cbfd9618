// The signal watcher: signals taken in the order they came, and a signal delivered twice at once
// (as `timeout` delivers its SIGTERM, to the process and to its group) taken once.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "actors/signals.h"

namespace troupe::actors {
namespace {

// The signals taken within a second (the handler writes to a pipe the watcher reads).
std::vector<int> taken(SignalWatcher& w, size_t expected) {
  std::vector<int> got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (got.size() < expected && std::chrono::steady_clock::now() < until) {
    if (int sig = w.next()) got.push_back(sig);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return got;
}

TEST(SignalWatcher, ASignalDeliveredTwiceAtOnceIsTakenOnceAndALaterOneAgain) {
  SignalWatcher w;
  ASSERT_EQ(::raise(SIGTERM), 0);
  ASSERT_EQ(::raise(SIGTERM), 0);  // (at once: `timeout`'s second delivery)
  ASSERT_EQ(::raise(SIGINT), 0);   // another signal is another request
  EXPECT_EQ(taken(w, 2), (std::vector<int>{SIGTERM, SIGINT}));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(w.next(), 0) << "the repeat was taken";
  EXPECT_EQ(w.count(), 2);
  EXPECT_EQ(w.first(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(kRepeatWindowMs + 50));
  ASSERT_EQ(::raise(SIGTERM), 0);  // a person's second SIGTERM, later: it counts
  EXPECT_EQ(taken(w, 1), std::vector<int>{SIGTERM});
  EXPECT_EQ(w.count(), 3);
}

}  // namespace
}  // namespace troupe::actors
