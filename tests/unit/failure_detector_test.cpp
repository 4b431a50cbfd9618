#include "actors/failure_detector.h"

#include <gtest/gtest.h>

#include <map>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using Clock = FailureDetector::Clock;

TEST(FailureDetector, SilentNodeExpiresAfterTheTimeoutOnly) {
  FailureDetector d(1000ms);
  Clock::time_point t0{};
  d.watch(1, t0);
  EXPECT_TRUE(d.expire(t0 + 1000ms).empty());  // exactly the timeout: not yet
  auto gone = d.expire(t0 + 1001ms);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].node, 1u);
  EXPECT_EQ(gone[0].silent_for, 1001ms);
  EXPECT_FALSE(d.watching(1));
  EXPECT_TRUE(d.expire(t0 + 5000ms).empty());  // reported once
}

TEST(FailureDetector, HeartbeatsKeepANodeAlive) {
  FailureDetector d(1000ms);
  Clock::time_point t{};
  d.watch(7, t);
  for (int i = 0; i < 50; ++i) {
    t += 400ms;
    d.heard(7, t);
    EXPECT_TRUE(d.expire(t).empty());
  }
}

TEST(FailureDetector, OnlyTheSilentNodeExpires) {
  FailureDetector d(500ms);
  Clock::time_point t0{};
  d.watch(1, t0);
  d.watch(2, t0);
  d.heard(2, t0 + 400ms);
  auto gone = d.expire(t0 + 600ms);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].node, 1u);
  EXPECT_TRUE(d.watching(2));
}

TEST(FailureDetector, AnExpiredNodeIsNotRevivedByALateHeartbeat) {
  FailureDetector d(500ms);
  Clock::time_point t0{};
  d.watch(3, t0);
  ASSERT_EQ(d.expire(t0 + 600ms).size(), 1u);
  d.heard(3, t0 + 700ms);  // the SIGCONTed process speaks again
  EXPECT_FALSE(d.watching(3));
}

TEST(FailureDetector, OutOfOrderTimesNeverMoveLastHeardBackwards) {
  FailureDetector d(500ms);
  Clock::time_point t0{};
  d.watch(4, t0 + 400ms);
  d.heard(4, t0);  // older observation
  EXPECT_TRUE(d.expire(t0 + 800ms).empty());
}

// The detector's process stopped for 4 s (a paused VM, SIGSTOP, a starved scheduler) heard no
// one either: the nodes are not expired for that gap; the silence before it stays counted.
TEST(FailureDetector, ItsOwnGapIsNotTheOthersSilence) {
  FailureDetector d(1000ms, 100ms);
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  d.watch(1, t0);
  d.watch(2, t0);
  for (auto t = t0; t <= t0 + 800ms; t += 100ms) {
    d.heard(1, t);
    EXPECT_TRUE(d.expire(t).empty());
  }
  const auto woken = t0 + 4800ms;
  EXPECT_TRUE(d.expire(woken).empty()) << "expired for the detector's own gap";
  EXPECT_TRUE(d.watching(1) && d.watching(2));
  // Node 2 was silent 800 ms before the gap, and the gap counts one interval: 101 ms more and it
  // is gone; node 1 (heard at 800 ms) 800 ms later.
  auto gone = d.expire(woken + 101ms);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].node, 2u);
  EXPECT_EQ(gone[0].silent_for, 1001ms);
  for (auto t = woken + 200ms; t <= woken + 800ms; t += 100ms) EXPECT_TRUE(d.expire(t).empty());
  EXPECT_EQ(d.expire(woken + 901ms).size(), 1u);
}

// Checks that always come late (a tick delayed past the threshold while the process runs) still
// count an interval each: a silent node expires, later, never not at all.
TEST(FailureDetector, ChecksThatAlwaysComeLateStillExpireASilentNode) {
  FailureDetector d(1000ms, 100ms);
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  d.watch(1, t0);
  int checks = 0;
  for (auto t = t0 + 650ms; d.watching(1) && checks < 20; t += 650ms, ++checks) d.expire(t);
  EXPECT_FALSE(d.watching(1)) << "never expired";
  EXPECT_LE(checks, 12);
}

// Checks as far apart as the interval (a slow heartbeat) are the detector's own pace, not a gap.
TEST(FailureDetector, ChecksAtItsIntervalForgiveNothing) {
  FailureDetector d(1500ms, 1000ms);
  const Clock::time_point t0 = Clock::time_point{} + 1h;
  d.watch(1, t0);
  EXPECT_TRUE(d.expire(t0 + 1000ms).empty());
  auto gone = d.expire(t0 + 2000ms);
  ASSERT_EQ(gone.size(), 1u);
  EXPECT_EQ(gone[0].silent_for, 2000ms);
}

TEST(FailureDetector, SilencesSayHowLongEachWatchedNodeHasBeenQuiet) {
  FailureDetector d(500ms);
  Clock::time_point t0{};
  d.watch(1, t0);
  d.watch(2, t0);
  d.heard(2, t0 + 300ms);
  std::map<uint64_t, std::chrono::milliseconds> by_node;
  for (const auto& s : d.silences(t0 + 400ms)) by_node[s.node] = s.silent_for;
  EXPECT_EQ(by_node, (std::map<uint64_t, std::chrono::milliseconds>{{1, 400ms}, {2, 100ms}}));
  d.expire(t0 + 600ms);  // node 1 is gone: no longer listed
  ASSERT_EQ(d.silences(t0 + 600ms).size(), 1u);
  EXPECT_EQ(d.silences(t0 + 600ms)[0].node, 2u);
}

}  // namespace
}  // namespace troupe::actors
