// The pipeline-parallel planner and migration, without threads or clocks: plans are checked
// against closed forms and against brute-force enumeration of every contiguous partition.
#include "elastic/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

namespace troupe::elastic {
namespace {

std::vector<BlockCost> uniform(size_t n, double flops = 1, uint64_t bytes = 100) {
  return std::vector<BlockCost>(n, BlockCost{flops, bytes, 0});
}

std::vector<BlockCost> from_costs(const std::vector<double>& flops, uint64_t bytes = 100) {
  std::vector<BlockCost> b;
  for (double f : flops) b.push_back({f, bytes, 0});
  return b;
}

PlanOptions options(uint32_t pp = 0, uint64_t B = 64, uint32_t m = 4, uint64_t limit = 0) {
  PlanOptions o;
  o.pipeline_stages = pp;
  o.global_batch = B;
  o.micro_batches = m;
  o.max_params_per_worker = limit;
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every contiguous partition into `parts` non-empty parts, in lexicographic order of begins; the
// first with the smallest max (same left-to-right double sums as the planner) wins.
Partition brute_force(const std::vector<double>& cost, const std::vector<uint64_t>& bytes,
                      uint32_t parts, uint64_t max_bytes) {
  Partition best;
  const size_t n = cost.size();
  if (parts == 0 || parts > n) return best;
  std::vector<uint32_t> begin{0};
  std::function<void()> rec = [&] {
    if (begin.size() == parts) {
      double worst = 0;
      for (size_t k = 0; k < parts; ++k) {
        const size_t end = k + 1 < parts ? begin[k + 1] : n;
        double s = 0;
        uint64_t by = 0;
        for (size_t i = begin[k]; i < end; ++i) s += cost[i], by += bytes[i];
        if (max_bytes && by > max_bytes) return;
        worst = std::max(worst, s);
      }
      if (!best.ok || worst < best.max_cost) best = {true, begin, worst};
      return;
    }
    const size_t left = parts - begin.size();  // parts still to open
    for (size_t b = begin.back() + 1; b + left <= n; ++b) {
      begin.push_back(uint32_t(b));
      rec();
      begin.pop_back();
    }
  };
  rec();
  return best;
}

std::vector<uint64_t> bytes_of(const std::vector<BlockCost>& b) {
  std::vector<uint64_t> c;
  for (const auto& x : b) c.push_back(x.param_bytes);
  return c;
}

// The stage each block belongs to, checked for shape: pp stages, contiguous, non-empty.
void expect_well_formed(const Plan& p, uint32_t W, const std::vector<BlockCost>& blocks,
                        const PlanOptions& o) {
  ASSERT_TRUE(p.ok) << p.reason;
  EXPECT_GE(p.dp, 1u);
  EXPECT_GE(p.pp, 1u);
  EXPECT_LE(p.dp * p.pp, W);
  EXPECT_LE(p.dp, o.global_batch);
  EXPECT_EQ(p.num_blocks, blocks.size());
  ASSERT_EQ(p.stage_begin.size(), p.pp);
  ASSERT_EQ(p.stage_param_bytes.size(), p.pp);
  EXPECT_EQ(p.stage_begin[0], 0u);
  for (uint32_t s = 0; s < p.pp; ++s) {
    EXPECT_LT(p.stage_block_begin(s), p.stage_block_end(s)) << "stage " << s << " is empty";
    uint64_t by = 0;
    for (uint32_t b = p.stage_block_begin(s); b < p.stage_block_end(s); ++b)
      by += blocks[b].param_bytes;
    EXPECT_EQ(p.stage_param_bytes[s], by);
    if (o.max_params_per_worker) {
      EXPECT_LE(by, o.max_params_per_worker);
    }
  }
  EXPECT_EQ(p.stage_block_end(p.pp - 1), blocks.size());
  if (o.pipeline_stages) {
    EXPECT_EQ(p.pp, o.pipeline_stages);
  }
  EXPECT_DOUBLE_EQ(p.bubble, double(p.pp - 1) / double(o.micro_batches + p.pp - 1));
}

// --- partition ---------------------------------------------------------------------------------

TEST(PlannerPartition, UniformBlocksSplitEvenly) {
  const std::vector<double> c(8, 1.0);
  const std::vector<uint64_t> b(8, 10);
  EXPECT_EQ(partition_blocks(c, b, 1, 0).begin, (std::vector<uint32_t>{0}));
  EXPECT_EQ(partition_blocks(c, b, 2, 0).begin, (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(partition_blocks(c, b, 4, 0).begin, (std::vector<uint32_t>{0, 2, 4, 6}));
  EXPECT_EQ(partition_blocks(c, b, 8, 0).begin, (std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(partition_blocks(c, b, 4, 0).max_cost, 2.0);
  EXPECT_FALSE(partition_blocks(c, b, 9, 0).ok);  // more parts than blocks
  EXPECT_FALSE(partition_blocks(c, b, 0, 0).ok);
}

TEST(PlannerPartition, CanonicalIsTheLexicographicallyEarliestOptimum) {
  // 8 equal blocks in 3 parts: the optimum is 3; early stages as short as it allows.
  auto p = partition_blocks(std::vector<double>(8, 1.0), std::vector<uint64_t>(8, 0), 3, 0);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.max_cost, 3.0);
  EXPECT_EQ(p.begin, (std::vector<uint32_t>{0, 2, 5}));
  // 1..9 in 3 parts: optimum 17 = 8 + 9.
  auto q = partition_blocks({1, 2, 3, 4, 5, 6, 7, 8, 9}, std::vector<uint64_t>(9, 0), 3, 0);
  ASSERT_TRUE(q.ok);
  EXPECT_EQ(q.max_cost, 17.0);
  EXPECT_EQ(q.begin, (std::vector<uint32_t>{0, 5, 7}));
}

// The fewest workers of pipeline_stages = "auto" under parallel.max_params_per_worker (a scale
// or a loss below them formed a generation that could not plan: the job rolled back to its seed).
TEST(PlannerPartition, FewestStagesWithinABudget) {
  EXPECT_EQ(fewest_stages({10, 10, 10, 10}, 0), 1u);   // (no budget)
  EXPECT_EQ(fewest_stages({10, 10, 10, 10}, 40), 1u);  // (all of it)
  EXPECT_EQ(fewest_stages({10, 10, 10, 10}, 39), 2u);
  EXPECT_EQ(fewest_stages({10, 10, 10, 10}, 10), 4u);
  EXPECT_EQ(fewest_stages({25, 10, 10, 25}, 30), 3u);  // 25 | 10 10 | 25
  EXPECT_EQ(fewest_stages({}, 30), 1u);                // (the blocks not known yet)
}

TEST(PlannerPartition, ASingleHeavyBlockBoundsTheOptimum) {
  auto p = partition_blocks({1, 1, 10, 1, 1}, std::vector<uint64_t>(5, 0), 3, 0);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.max_cost, 10.0);
  // {1} first would leave {1, 10, 1, 1} for two parts of at most 10: impossible.
  EXPECT_EQ(p.begin, (std::vector<uint32_t>{0, 2, 3}));
}

TEST(PlannerPartition, MatchesBruteForceOnRandomCosts) {
  std::mt19937_64 rng(20240611);
  int cases = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + rng() % 9;
    const bool integral = trial % 2 == 0;
    std::vector<double> cost(n);
    std::vector<uint64_t> bytes(n);
    for (size_t i = 0; i < n; ++i) {
      cost[i] = integral ? double(rng() % 10) : std::uniform_real_distribution<>(0, 3)(rng);
      bytes[i] = 1 + rng() % 50;
    }
    const uint64_t limit = trial % 3 == 0 ? 0 : 50 + rng() % 100;
    for (uint32_t parts = 1; parts <= n + 1; ++parts) {
      const Partition want = brute_force(cost, bytes, parts, limit);
      const Partition got = partition_blocks(cost, bytes, parts, limit);
      ASSERT_EQ(got.ok, want.ok) << "trial " << trial << " parts " << parts;
      if (!want.ok) continue;
      ++cases;
      EXPECT_EQ(got.max_cost, want.max_cost) << "trial " << trial << " parts " << parts;
      EXPECT_EQ(got.begin, want.begin) << "trial " << trial << " parts " << parts;
    }
  }
  EXPECT_GT(cases, 1000);  // the generator reaches feasible cases, not only failures
}

TEST(PlannerPartition, RespectsTheByteLimit) {
  // Cost alone would cut 2 + 2; bytes force the heavy block alone.
  auto p = partition_blocks({1, 1, 1, 1}, {10, 10, 80, 10}, 3, 90);
  ASSERT_TRUE(p.ok);
  EXPECT_EQ(p.begin, (std::vector<uint32_t>{0, 1, 2}));  // earliest feasible optimum (max 2)
  EXPECT_EQ(p.max_cost, 2.0);
  EXPECT_FALSE(partition_blocks({1, 1, 1, 1}, {10, 10, 80, 10}, 1, 90).ok);
  EXPECT_FALSE(partition_blocks({1, 1}, {100, 1}, 2, 90).ok);  // one block alone is too big
}

// --- plan --------------------------------------------------------------------------------------

TEST(Planner, UniformBlocksAutoIsPureDataParallelOnEveryWorldSize) {
  // Without communication costs, a bubble can only hurt: pp = 1, every worker a replica.
  const auto blocks = uniform(8, 2.0);
  for (uint32_t W = 1; W <= 8; ++W) {
    const auto o = options(0, 64, 4);
    const Plan p = plan_pipeline(W, blocks, o);
    expect_well_formed(p, W, blocks, o);
    EXPECT_EQ(p.pp, 1u) << "W " << W;
    EXPECT_EQ(p.dp, W);
    const double share = double((64 + W - 1) / W);
    EXPECT_DOUBLE_EQ(p.max_stage_cost, 16.0 * share);
    EXPECT_DOUBLE_EQ(p.step_cost, 16.0 * share);
    EXPECT_EQ(p.bubble, 0.0);
    EXPECT_FALSE(p.cost_in_seconds);
  }
}

TEST(Planner, UniformBlocksFixedStagesOnEveryWorldSize) {
  const auto blocks = uniform(8, 1.0);
  for (uint32_t W = 1; W <= 8; ++W) {
    for (uint32_t pp : {1u, 2u, 4u, 8u}) {
      const auto o = options(pp, 64, 4);
      const Plan p = plan_pipeline(W, blocks, o);
      if (pp > W) {
        EXPECT_FALSE(p.ok);
        EXPECT_TRUE(contains(p.reason, "only " + std::to_string(W) + " worker(s)")) << p.reason;
        continue;
      }
      expect_well_formed(p, W, blocks, o);
      EXPECT_EQ(p.dp, W / pp) << "W " << W << " pp " << pp;
      for (uint32_t s = 0; s < pp; ++s) EXPECT_EQ(p.stage_begin[s], s * (8 / pp));
      const double share = double((64 + p.dp - 1) / p.dp);
      EXPECT_DOUBLE_EQ(p.max_stage_cost, 8.0 / pp * share);
      EXPECT_DOUBLE_EQ(p.step_cost, 8.0 / pp * share * (4.0 + pp - 1) / 4.0);
    }
  }
}

TEST(Planner, FixedStagesOnWorldSizesThatDoNotDivideLeaveStandbys) {
  const auto blocks = uniform(6);
  const Plan five = plan_pipeline(5, blocks, options(2, 12, 2));
  expect_well_formed(five, 5, blocks, options(2, 12, 2));
  EXPECT_EQ(five.dp, 2u);
  EXPECT_EQ(five.workers_used(), 4u);
  EXPECT_TRUE(placement_of_rank(five, 4).standby);
  EXPECT_TRUE(contains(five.reason, "1 standby")) << five.reason;
  const Plan seven = plan_pipeline(7, blocks, options(2, 12, 2));
  EXPECT_EQ(seven.dp, 3u);
  EXPECT_EQ(seven.pp, 2u);
  EXPECT_TRUE(placement_of_rank(seven, 6).standby);
  EXPECT_FALSE(placement_of_rank(seven, 5).standby);
  // Uneven shares are fine: B = 7 on dp = 3 gives 3, 2, 2; the slowest replica takes 3.
  const Plan uneven = plan_pipeline(7, blocks, options(2, 7, 2));
  EXPECT_EQ(uneven.dp, 3u);
  EXPECT_DOUBLE_EQ(uneven.max_stage_cost, 3.0 * 3);
}

TEST(Planner, DataParallelIsCappedByTheGlobalBatchAndPipeliningUsesTheRest) {
  // B = 3: at most 3 replicas. 8 unit blocks, m = 4, W = 8:
  //   pp 1 dp 3: 8 * 1 = 8;  pp 2 dp 3: 4 * 1 * 5/4 = 5;  pp 4 dp 2: 2 * 2 * 7/4 = 7;
  //   pp 3 dp 2: 3 * 2 * 6/4 = 9;  pp 8 dp 1: 1 * 3 * 11/4 = 8.25.
  const auto blocks = uniform(8);
  const Plan p = plan_pipeline(8, blocks, options(0, 3, 4));
  expect_well_formed(p, 8, blocks, options(0, 3, 4));
  EXPECT_EQ(p.pp, 2u);
  EXPECT_EQ(p.dp, 3u);
  EXPECT_DOUBLE_EQ(p.step_cost, 5.0);
  const Plan one = plan_pipeline(8, blocks, options(1, 1, 1));
  EXPECT_EQ(one.dp, 1u);  // B = 1: one replica, 7 standbys
}

TEST(Planner, UnevenCostsGiveBalancedStages) {
  const auto blocks = from_costs({1, 2, 3, 4, 5, 6, 7, 8, 9});
  const auto o = options(3, 30, 6);
  const Plan p = plan_pipeline(6, blocks, o);
  expect_well_formed(p, 6, blocks, o);
  EXPECT_EQ(p.stage_begin, (std::vector<uint32_t>{0, 5, 7}));
  EXPECT_EQ(p.dp, 2u);
  EXPECT_DOUBLE_EQ(p.max_stage_cost, 17.0 * 15);
  EXPECT_EQ(p.stage_cost, (std::vector<double>{15.0 * 15, 13.0 * 15, 17.0 * 15}));
}

TEST(Planner, AutoPlanIsTheCheapestLayoutOnRandomModels) {
  // For small random models, enumerate every (pp, dp) with the brute-force partition and require
  // the plan to be no worse than the best of them.
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 150; ++trial) {
    const size_t n = 1 + rng() % 7;
    std::vector<BlockCost> blocks(n);
    for (auto& b : blocks) {
      b.measured_s_per_sample = 0.001 * double(1 + rng() % 20);
      b.param_bytes = 1000 * (1 + rng() % 20);
    }
    PlanOptions o = options(0, 1 + rng() % 40, 1 + uint32_t(rng() % 8));
    o.allreduce_bytes_per_s = trial % 2 ? 1e6 * double(1 + rng() % 100) : 0;
    o.max_params_per_worker = trial % 3 == 0 ? 0 : 20000 + 1000 * (rng() % 40);
    const uint32_t W = 1 + uint32_t(rng() % 9);
    const Plan p = plan_pipeline(W, blocks, o);
    std::vector<double> cost;
    for (const auto& b : blocks) cost.push_back(b.measured_s_per_sample);
    const auto bytes = bytes_of(blocks);
    double best = std::numeric_limits<double>::infinity();
    for (uint32_t pp = 1; pp <= std::min<size_t>(W, n); ++pp) {
      const Partition part = brute_force(cost, bytes, pp, o.max_params_per_worker);
      if (!part.ok) continue;
      uint64_t max_bytes = 0;
      for (uint32_t s = 0; s < pp; ++s) {
        uint64_t by = 0;
        for (size_t i = part.begin[s]; i < (s + 1 < pp ? part.begin[s + 1] : n); ++i)
          by += bytes[i];
        max_bytes = std::max(max_bytes, by);
      }
      for (uint64_t dp = 1; dp <= std::min<uint64_t>(W / pp, o.global_batch); ++dp) {
        const double share = double((o.global_batch + dp - 1) / dp);
        double step = part.max_cost * share * double(o.micro_batches + pp - 1) / o.micro_batches;
        if (o.allreduce_bytes_per_s > 0)
          step += 2.0 * double(dp - 1) / double(dp) * double(max_bytes) / o.allreduce_bytes_per_s;
        best = std::min(best, step);
      }
    }
    if (std::isinf(best)) {
      EXPECT_FALSE(p.ok) << "trial " << trial;
      EXPECT_FALSE(p.reason.empty());
      continue;
    }
    expect_well_formed(p, W, blocks, o);
    EXPECT_TRUE(p.cost_in_seconds);
    EXPECT_LE(p.step_cost, best * (1 + 1e-9)) << "trial " << trial << ": " << p.reason;
    EXPECT_GE(p.step_cost, best * (1 - 1e-9)) << "trial " << trial << ": " << p.reason;
  }
}

TEST(Planner, MemoryBudgetForcesPipelining) {
  // 8 blocks of 100 bytes, 250 bytes per worker: at least 4 stages of at most 2 blocks.
  const auto blocks = uniform(8, 1.0, 100);
  const auto o = options(0, 64, 8, 250);
  const Plan p = plan_pipeline(8, blocks, o);
  expect_well_formed(p, 8, blocks, o);
  EXPECT_EQ(p.pp, 4u);
  EXPECT_EQ(p.dp, 2u);
  for (uint64_t b : p.stage_param_bytes) EXPECT_LE(b, 250u);
  // W = 5: pp 4, dp 1, one standby.
  const Plan five = plan_pipeline(5, blocks, o);
  EXPECT_EQ(five.pp, 4u);
  EXPECT_EQ(five.dp, 1u);
  // Too few workers to hold the model at all.
  const Plan three = plan_pipeline(3, blocks, o);
  EXPECT_FALSE(three.ok);
  EXPECT_EQ(three.reason,
            "the model's 800 parameter bytes need at least 4 stage(s) of at most the 250 bytes "
            "a worker may hold (parallel.max_params_per_worker, 4 bytes a parameter), but only 3 "
            "worker(s) and 8 "
            "block(s)");
  // A fixed pp below what the budget allows.
  const Plan fixed = plan_pipeline(8, blocks, options(2, 64, 8, 250));
  EXPECT_FALSE(fixed.ok);
  EXPECT_TRUE(contains(fixed.reason, "need at least 4 stage(s)")) << fixed.reason;
  EXPECT_TRUE(contains(fixed.reason, "pipeline_stages = 2")) << fixed.reason;
}

TEST(Planner, MemoryBudgetChangesTheBoundariesNotOnlyTheStageCount) {
  // Cost alone splits {0, 1} | {2, 3}, but blocks 0 and 1 together exceed the 100-byte budget.
  std::vector<BlockCost> blocks{{1, 60, 0}, {1, 60, 0}, {1, 10, 0}, {1, 10, 0}};
  const auto o = options(2, 8, 4, 100);
  const Plan p = plan_pipeline(2, blocks, o);
  expect_well_formed(p, 2, blocks, o);
  EXPECT_EQ(p.stage_begin, (std::vector<uint32_t>{0, 1}));  // {0} | {1, 2, 3}: 60 and 80 bytes
  EXPECT_EQ(p.stage_param_bytes, (std::vector<uint64_t>{60, 80}));
}

TEST(Planner, ImpossibleCasesSayWhyWithTheNumbers) {
  const auto blocks = uniform(4, 1.0, 100);
  EXPECT_EQ(plan_pipeline(0, blocks, options()).reason, "no workers (W = 0)");
  EXPECT_FALSE(plan_pipeline(0, blocks, options()).ok);
  EXPECT_EQ(plan_pipeline(2, {}, options()).reason, "the model has no blocks");
  EXPECT_EQ(plan_pipeline(8, blocks, options(5)).reason,
            "pipeline_stages = 5 but the model has only 4 block(s)");
  EXPECT_EQ(plan_pipeline(3, blocks, options(4)).reason,
            "pipeline_stages = 4 but only 3 worker(s)");
  auto big = blocks;
  big[3].param_bytes = 500;
  const Plan p = plan_pipeline(4, big, options(0, 64, 4, 400));
  EXPECT_FALSE(p.ok);
  EXPECT_EQ(p.reason,
            "block 3 has 500 parameter bytes, more than the 400 bytes a worker may hold "
            "(parallel.max_params_per_worker, 4 bytes a parameter)");
  EXPECT_EQ(plan_pipeline(2, blocks, options(0, 0)).reason, "global batch B = 0");
  EXPECT_EQ(plan_pipeline(2, blocks, options(0, 8, 0)).reason, "micro_batches m = 0");
  auto bad = blocks;
  bad[1].flops_per_sample = -1;
  EXPECT_TRUE(contains(plan_pipeline(2, bad, options()).reason, "block 1 has an invalid cost"));
  bad[1].flops_per_sample = std::nan("");
  EXPECT_FALSE(plan_pipeline(2, bad, options()).ok);
  PlanOptions o = options();
  o.allreduce_bytes_per_s = -5;
  EXPECT_FALSE(plan_pipeline(2, blocks, o).ok);
  EXPECT_EQ(plan_pipeline(2, blocks, o).dp, 0u);  // a failed plan carries no layout
  EXPECT_TRUE(plan_pipeline(2, blocks, o).stage_begin.empty());
}

TEST(Planner, SameInputsSamePlan) {
  std::mt19937_64 rng(99);
  std::vector<BlockCost> blocks(40);
  for (auto& b : blocks) b = {double(1 + rng() % 1000) * 1e9, 1000 + rng() % 100000, 0};
  PlanOptions o = options(0, 256, 8, 600000);
  o.worker_flops_per_s = 1e14;
  o.allreduce_bytes_per_s = 1e9;
  const Plan a = plan_pipeline(16, blocks, o);
  ASSERT_TRUE(a.ok) << a.reason;
  for (int i = 0; i < 3; ++i) {
    const Plan b = plan_pipeline(16, blocks, o);
    EXPECT_EQ(b.dp, a.dp);
    EXPECT_EQ(b.pp, a.pp);
    EXPECT_EQ(b.stage_begin, a.stage_begin);
    EXPECT_EQ(b.step_cost, a.step_cost);
    EXPECT_EQ(b.stage_param_bytes, a.stage_param_bytes);
    EXPECT_EQ(b.reason, a.reason);
  }
}

TEST(Planner, MeasuredTimesReplaceFlopsOnlyWhenGivenForEveryBlock) {
  // FLOPs say uniform; the measurements say block 0 is as slow as the other three together.
  std::vector<BlockCost> blocks{{1, 10, 3.0}, {1, 10, 1.0}, {1, 10, 1.0}, {1, 10, 1.0}};
  const auto o = options(2, 4, 4);
  const Plan p = plan_pipeline(2, blocks, o);
  ASSERT_TRUE(p.ok) << p.reason;
  EXPECT_TRUE(p.cost_in_seconds);
  EXPECT_EQ(p.stage_begin, (std::vector<uint32_t>{0, 1}));
  EXPECT_DOUBLE_EQ(p.max_stage_cost, 3.0 * 4);
  blocks[2].measured_s_per_sample = 0;  // one missing: FLOPs for all
  const Plan f = plan_pipeline(2, blocks, o);
  ASSERT_TRUE(f.ok) << f.reason;
  EXPECT_FALSE(f.cost_in_seconds);
  EXPECT_EQ(f.stage_begin, (std::vector<uint32_t>{0, 2}));
}

TEST(Planner, WorkerFlopsTurnCostsIntoSeconds) {
  const auto blocks = uniform(4, 2e12);
  PlanOptions o = options(1, 8, 1);
  o.worker_flops_per_s = 1e12;
  const Plan p = plan_pipeline(2, blocks, o);
  ASSERT_TRUE(p.ok) << p.reason;
  EXPECT_TRUE(p.cost_in_seconds);
  EXPECT_DOUBLE_EQ(p.step_cost, 8.0 * 4);  // 4 blocks x 2 s x share 4
  EXPECT_TRUE(contains(p.reason, " s")) << p.reason;
}

TEST(Planner, AllreduceTermFavoursPipeliningWhenBandwidthIsLow) {
  // 4 blocks, 1 s/sample and 1e9 bytes each; B = 8, m = 8, W = 4, 1e9 bytes/s:
  //   pp 1 dp 4: 4 * 2 + 2 * 3/4 * 4 = 14;   pp 2 dp 2: 2 * 4 * 9/8 + 2 * 1/2 * 2 = 11;
  //   pp 4 dp 1: 1 * 8 * 11/8 + 0 = 11  -> the tie goes to the smaller pp.
  std::vector<BlockCost> blocks(4, BlockCost{0, 1000000000, 1.0});
  PlanOptions o = options(0, 8, 8);
  o.allreduce_bytes_per_s = 1e9;
  const Plan p = plan_pipeline(4, blocks, o);
  expect_well_formed(p, 4, blocks, o);
  EXPECT_EQ(p.pp, 2u);
  EXPECT_EQ(p.dp, 2u);
  EXPECT_DOUBLE_EQ(p.step_cost, 11.0);
  // Ignoring communication, data parallelism wins.
  o.allreduce_bytes_per_s = 0;
  const Plan q = plan_pipeline(4, blocks, o);
  EXPECT_EQ(q.pp, 1u);
  EXPECT_EQ(q.dp, 4u);
  EXPECT_DOUBLE_EQ(q.step_cost, 8.0);
  // Costs in FLOPs (no worker_flops_per_s): bandwidth cannot be mixed in and is ignored.
  std::vector<BlockCost> flops(4, BlockCost{1.0, 1000000000, 0});
  o.allreduce_bytes_per_s = 1e9;
  const Plan r = plan_pipeline(4, flops, o);
  EXPECT_FALSE(r.cost_in_seconds);
  EXPECT_EQ(r.pp, 1u);
  EXPECT_DOUBLE_EQ(r.step_cost, 8.0);
}

TEST(Planner, CommunicationCanLeaveWorkersIdle) {
  // One block: pp = 1 only. Doubling dp halves compute but a slow allreduce costs more.
  std::vector<BlockCost> blocks(1, BlockCost{0, 1000, 1.0});
  PlanOptions o = options(0, 2, 1);
  o.allreduce_bytes_per_s = 1;  // dp 2: 1 + 2 * 1/2 * 1000 = 1001 > 2
  const Plan p = plan_pipeline(2, blocks, o);
  ASSERT_TRUE(p.ok) << p.reason;
  EXPECT_EQ(p.dp, 1u);
  EXPECT_DOUBLE_EQ(p.step_cost, 2.0);
}

// --- rank placement ----------------------------------------------------------------------------

TEST(PlannerPlacement, RanksAreReplicaMajor) {
  const Plan p = plan_pipeline(7, uniform(6), options(2, 12, 2));  // dp 3 x pp 2, 1 standby
  ASSERT_TRUE(p.ok) << p.reason;
  std::set<std::pair<uint32_t, uint32_t>> seen;
  for (uint32_t r = 0; r < 6; ++r) {
    const Placement at = placement_of_rank(p, r);
    EXPECT_FALSE(at.standby);
    EXPECT_EQ(at.stage, r % 2);
    EXPECT_EQ(at.replica, r / 2);
    EXPECT_EQ(rank_of(p, at.stage, at.replica), r);
    seen.insert({at.stage, at.replica});
  }
  EXPECT_EQ(seen.size(), 6u);  // every (stage, replica) exactly once
  EXPECT_TRUE(placement_of_rank(p, 6).standby);
  EXPECT_TRUE(placement_of_rank(p, 100).standby);
  EXPECT_TRUE(placement_of_rank(Plan{}, 0).standby);
}

}  // namespace
}  // namespace troupe::elastic
