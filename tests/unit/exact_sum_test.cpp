// The fixed-point sums of parallel.deterministic, without processes: any grouping of the same
// micro-batches gives the same bits, the result is as accurate as a float sum, nothing overflows
// at the largest values the scale allows.
#include "workers/exact_sum.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "workers/host_staging.h"

namespace troupe::workers {
namespace {

// Gradients of T micro-batches with magnitudes spread over many orders, like real ones.
std::vector<std::vector<float>> micro_batches(size_t T, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-30, 2);
  std::vector<std::vector<float>> g(T, std::vector<float>(n));
  for (auto& m : g)
    for (auto& x : m) x = std::ldexp(normal(rng), exponent(rng));
  return g;
}

double max_abs(const std::vector<std::vector<float>>& g) {
  double m = 0;
  for (const auto& v : g)
    for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// The fixed-point sum of the micro-batches grouped as `groups` (sizes), each group summed on its
// own (a rank's micro-batches), then the groups' integers added (the allreduce).
std::vector<float> grouped_sum(const std::vector<std::vector<float>>& g,
                               const std::vector<size_t>& groups) {
  const size_t n = g[0].size();
  const int e = fixed_point_exponent(max_abs(g), g.size());
  std::vector<int64_t> total(n, 0);
  size_t at = 0;
  for (size_t size : groups) {
    std::vector<int64_t> acc(n, 0);
    for (size_t j = at; j < at + size; ++j) add_fixed_point(acc.data(), g[j].data(), n, e);
    for (size_t i = 0; i < n; ++i) total[i] += acc[i];
    at += size;
  }
  std::vector<float> out(n);
  from_fixed_point(out.data(), total.data(), n, e);
  return out;
}

TEST(ExactSum, EveryGroupingOfTheMicroBatchesGivesTheSameBits) {
  auto g = micro_batches(7, 4096, 1);
  const auto one = grouped_sum(g, {7});
  for (const std::vector<size_t>& groups :
       {std::vector<size_t>{1, 1, 1, 1, 1, 1, 1}, {3, 4}, {4, 3}, {2, 2, 3}, {1, 6}, {5, 1, 1}})
    EXPECT_EQ(grouped_sum(g, groups), one);
  // Float sums of the same numbers in two orders differ (what the mode is for).
  size_t differ = 0;
  for (size_t i = 0; i < g[0].size(); ++i) {
    float a = 0, b = 0;
    for (size_t j = 0; j < 7; ++j) a += g[j][i];
    for (size_t j = 7; j-- > 0;) b += g[j][i];
    differ += a != b;
  }
  EXPECT_GT(differ, 0u);
}

TEST(ExactSum, AsAccurateAsAFloatSum) {
  auto g = micro_batches(5, 4096, 2);
  const auto got = grouped_sum(g, {5});
  const double m = max_abs(g);
  for (size_t i = 0; i < got.size(); ++i) {
    double exact = 0;
    for (const auto& v : g) exact += double(v[i]);
    // float rounding of the result, plus at most T / 2 units of 2^-e (<= 2^-47 m for T = 5)
    // from the conversions
    const double tolerance = std::fabs(exact) * 0x1p-24 + m * 0x1p-45;
    EXPECT_LE(std::fabs(double(got[i]) - exact), tolerance) << i;
  }
}

TEST(ExactSum, TheLargestValuesOfTheLargestSumDoNotOverflow) {
  for (uint64_t T : {1u, 2u, 3u, 5u, 64u, 1000u}) {
    for (double m : {1e-30, 0.75, 1.0, 3.0e5}) {
      const float x = float(m);
      const int e = fixed_point_exponent(double(x), T);
      int64_t acc = 0;
      for (uint64_t j = 0; j < T; ++j) add_fixed_point(&acc, &x, 1, e);
      EXPECT_GT(acc, 0) << "T " << T << " max " << m;
      float back = 0;
      from_fixed_point(&back, &acc, 1, e);
      EXPECT_FLOAT_EQ(back, float(double(x) * double(T))) << "T " << T << " max " << m;
    }
  }
  EXPECT_EQ(fixed_point_exponent(0.0, 4), 0);  // an all-zero block
}

TEST(ExactSum, LossesInFixedPointAddUpExactlyInAnyOrder) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 0.5);
  std::vector<double> parts(40);
  for (auto& p : parts) p = fixed_point_loss(u(rng));
  double forward = 0, backward = 0, pairs = 0;
  for (double p : parts) forward += p;
  for (size_t i = parts.size(); i-- > 0;) backward += parts[i];
  for (size_t i = 0; i < parts.size(); i += 2) pairs += parts[i] + parts[i + 1];
  EXPECT_EQ(forward, backward);
  EXPECT_EQ(forward, pairs);
  EXPECT_NEAR(loss_from_fixed_point(fixed_point_loss(2.5)), 2.5, 1e-9);
}

}  // namespace
}  // namespace troupe::workers

namespace troupe::workers {
namespace {

// What a step sums in place besides the gradients stays in the arena from one generation to the
// next (the same pages: not given back and faulted in again by every rank that maps them).
TEST(InPlaceBuffers, KeepEachBufferFromOneGenerationToTheNext) {
  std::string why;
  auto arena = comm::SharedArena::create(16 * comm::SharedArena::kAlign, &why);
  ASSERT_TRUE(arena) << why;
  InPlaceBuffers buffers(arena);
  models::Compute& cpu = compute_of(models::Tensor());
  float* first = nullptr;
  {
    models::Tensor t = buffers.take(InPlaceBuffers::kExactSums, 5000, cpu);  // a generation's
    ASSERT_TRUE(t.defined());
    first = t.data();
    EXPECT_EQ(first[4999], 0.0f);
    first[4999] = 7;
  }  // (the generation's sums are gone)
  {
    models::Tensor again = buffers.take(InPlaceBuffers::kExactSums, 5000, cpu);
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(again.data()[4999], 7.0f);  // (its contents as left: the caller zeroes them)
    EXPECT_GE(arena->offset_of(again.data(), 5000 * sizeof(float)), 0);
    EXPECT_THROW(buffers.take(InPlaceBuffers::kExactSums, 5000, cpu), std::logic_error);  // held
  }
  // Another size (a pipeline stage of other blocks): a new buffer, the old one's room given back
  // first (16 pages: 14 fit only where the 5 were).
  models::Tensor larger = buffers.take(InPlaceBuffers::kExactSums, 14000, cpu);
  ASSERT_TRUE(larger.defined());
  EXPECT_EQ(larger.data(), first);
  EXPECT_EQ(larger.data()[4999], 0.0f);
  models::Tensor half = buffers.take(InPlaceBuffers::kHalves + 3, 100, cpu);  // another key
  ASSERT_TRUE(half.defined());
  EXPECT_NE(half.data(), first);
  EXPECT_FALSE(buffers.take(InPlaceBuffers::kHalves, 4096, cpu).defined());  // no room left
  EXPECT_FALSE(InPlaceBuffers().take(InPlaceBuffers::kExactSums, 10, cpu).defined());  // no arena
}

}  // namespace
}  // namespace troupe::workers
