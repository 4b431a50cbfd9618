#include "actors/failure_detector.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::actors
