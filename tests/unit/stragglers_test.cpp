// elastic::StragglerDetector: slower than factor x the others' median for N steps in a row.
#include "elastic/stragglers.h"

#include <gtest/gtest.h>

#include <cmath>

namespace troupe::elastic {
namespace {

TEST(Stragglers, ASlowRankIsReportedOnceAfterNConsecutiveSlowSteps) {
  StragglerDetector d({2.0, 3});
  EXPECT_TRUE(d.observe({0.010, 0.030, 0.011}).empty());
  EXPECT_TRUE(d.observe({0.010, 0.030, 0.011}).empty());
  auto s = d.observe({0.010, 0.030, 0.011});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1u);
  EXPECT_DOUBLE_EQ(s[0].median, 0.0105);
  EXPECT_EQ(s[0].steps, 3u);
  EXPECT_TRUE(d.observe({0.010, 0.030, 0.011}).empty());  // reported once
  EXPECT_TRUE(d.observe({0.010, 0.011, 0.011}).empty());  // fast again: counting starts over
  EXPECT_TRUE(d.observe({0.010, 0.030, 0.011}).empty());
  EXPECT_TRUE(d.observe({0.010, 0.030, 0.011}).empty());
  EXPECT_EQ(d.observe({0.010, 0.030, 0.011}).size(), 1u);
}

TEST(Stragglers, AFastStepBreaksTheRunAndTwoRanksCompareWithEachOther) {
  StragglerDetector d({1.5, 2});
  EXPECT_TRUE(d.observe({0.01, 0.02}).empty());
  EXPECT_TRUE(d.observe({0.01, 0.012}).empty());
  EXPECT_TRUE(d.observe({0.01, 0.02}).empty());
  auto s = d.observe({0.01, 0.02});
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].rank, 1u);
}

// Steps of microseconds (a program's own loop): twice as slow by a microsecond is jitter.
TEST(Stragglers, SlowerByLessThanAMillisecondIsNoStraggler) {
  StragglerDetector d({2.0, 3});
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(d.observe({2.4e-6, 1.1e-6}).empty());
  for (int i = 0; i < 10; ++i) EXPECT_TRUE(d.observe({0.0015, 0.0007}).empty());
  EXPECT_TRUE(d.observe({0.0025, 0.0009}).empty());
  EXPECT_TRUE(d.observe({0.0025, 0.0009}).empty());
  EXPECT_EQ(d.observe({0.0025, 0.0009}).size(), 1u);
}

TEST(Stragglers, NoReportsNoStragglersAndResetForgets) {
  StragglerDetector d({2.0, 2});
  const double none = std::nan("");
  EXPECT_TRUE(d.observe({0.01, none}).empty());
  EXPECT_TRUE(d.observe({none, 0.05}).empty());  // nothing to compare with
  EXPECT_TRUE(d.observe({0.0, 0.0}).empty());
  EXPECT_TRUE(d.observe({0.01, 0.05}).empty());
  d.reset();  // a new generation: rank 1 is another worker now
  EXPECT_TRUE(d.observe({0.01, 0.05}).empty());
  EXPECT_EQ(d.observe({0.01, 0.05}).size(), 1u);
}

}  // namespace
}  // namespace troupe::elastic
