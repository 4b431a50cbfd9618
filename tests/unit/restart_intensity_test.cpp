#include "actors/restart_intensity.h"

#include <gtest/gtest.h>

namespace troupe::actors {
namespace {

using namespace std::chrono_literals;
using Clock = RestartIntensity::Clock;

TEST(RestartIntensity, AllowsNRestartsInTheWindowThenEscalates) {
  RestartIntensity r(3, 10s);
  Clock::time_point t{};
  EXPECT_TRUE(r.allow_restart(t));
  EXPECT_TRUE(r.allow_restart(t + 1s));
  EXPECT_TRUE(r.allow_restart(t + 2s));
  EXPECT_FALSE(r.allow_restart(t + 3s));
}

TEST(RestartIntensity, OldRestartsLeaveTheWindow) {
  RestartIntensity r(2, 10s);
  Clock::time_point t{};
  EXPECT_TRUE(r.allow_restart(t));
  EXPECT_TRUE(r.allow_restart(t + 5s));
  EXPECT_FALSE(r.allow_restart(t + 9s));
  EXPECT_TRUE(r.allow_restart(t + 11s));  // the first one is older than 10 s now
  EXPECT_EQ(r.recent_restarts(), 2);
}

TEST(RestartIntensity, ZeroMeansNeverRestart) {
  RestartIntensity r(0, 10s);
  EXPECT_FALSE(r.allow_restart(Clock::time_point{}));
}

}  // namespace
}  // namespace troupe::actors
