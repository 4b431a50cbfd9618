// The elastic decisions, without threads or clocks: every situation is a table row.
#include "elastic/membership.h"

#include <gtest/gtest.h>

#include <set>

namespace troupe::elastic {
namespace {

using namespace std::chrono_literals;
using Kind = MembershipDecision::Kind;

TEST(DataShare, CoversTheGlobalBatchExactlyOnceForEveryWorldSize) {
  for (uint64_t B : {1u, 7u, 32u, 50u, 512u}) {
    for (uint32_t n = 1; n <= 9 && n <= B; ++n) {
      uint64_t at = 0, smallest = UINT64_MAX, largest = 0;
      for (uint32_t r = 0; r < n; ++r) {
        Share s = data_share(B, r, n);
        EXPECT_EQ(s.begin, at) << "B " << B << " n " << n << " r " << r;
        at = s.end;
        smallest = std::min(smallest, s.size());
        largest = std::max(largest, s.size());
      }
      EXPECT_EQ(at, B);
      EXPECT_LE(largest - smallest, 1u);  // balanced
    }
  }
  EXPECT_EQ(data_share(10, 3, 3).size(), 0u);  // not a rank
}

TEST(DataShare, DeterministicSharesAreWholeGlobalMicroBatches) {
  for (uint64_t micro : {1u, 6u, 8u}) {
    for (uint64_t B : {micro, 5 * micro, 12 * micro}) {
      for (uint32_t n = 1; n <= 9; ++n) {
        uint64_t at = 0;
        for (uint32_t r = 0; r < n; ++r) {
          Share s = micro_batch_share(B, micro, r, n);
          EXPECT_EQ(s.begin, at) << "B " << B << " micro " << micro << " n " << n << " r " << r;
          EXPECT_EQ(s.begin % micro, 0u);
          EXPECT_EQ(s.size() % micro, 0u);
          at = s.end;
        }
        EXPECT_EQ(at, B);  // more ranks than micro-batches: the last ones get none
      }
    }
  }
}

MembershipState state(std::vector<Member> members, std::vector<uint64_t> waiting = {}) {
  MembershipState s;
  s.generation = 4;
  s.members = std::move(members);
  s.waiting = std::move(waiting);
  return s;
}

TEST(Membership, NothingChangedKeeps) {
  auto d = decide_membership({}, state({{1}, {2}, {3}}), {2, 0, 1000ms});
  EXPECT_EQ(d.kind, Kind::keep);
}

TEST(Membership, ALostMemberOpensAGenerationOfSurvivors) {
  auto d = decide_membership({}, state({{1}, {2, false}, {3}}), {2, 0, 1000ms});
  EXPECT_EQ(d.kind, Kind::new_generation);
  EXPECT_EQ(d.members, (std::vector<uint64_t>{1, 3}));
  EXPECT_NE(d.reason.find("generation 5"), std::string::npos) << d.reason;
}

TEST(Membership, TwoLostAtOnceOneGeneration) {
  auto d = decide_membership({}, state({{1}, {2, false}, {3, false}, {4}}), {1, 0, 1000ms});
  EXPECT_EQ(d.kind, Kind::new_generation);
  EXPECT_EQ(d.members, (std::vector<uint64_t>{1, 4}));
}

TEST(Membership, JoinersAreAdmittedAfterTheSurvivors) {
  auto d = decide_membership({}, state({{1}, {2}}, {7, 8}), {1, 0, 1000ms});
  EXPECT_EQ(d.kind, Kind::new_generation);
  EXPECT_EQ(d.members, (std::vector<uint64_t>{1, 2, 7, 8}));
}

TEST(Membership, AboveMaxWorkersJoinersWaitAsStandbysAndReplaceALostMember) {
  auto full = decide_membership({}, state({{1}, {2}}, {7}), {1, 2, 1000ms});
  EXPECT_EQ(full.kind, Kind::keep);
  EXPECT_EQ(full.standbys, (std::vector<uint64_t>{7}));
  auto d = decide_membership({}, state({{1}, {2, false}}, {7}), {1, 2, 1000ms});
  EXPECT_EQ(d.kind, Kind::new_generation);
  EXPECT_EQ(d.members, (std::vector<uint64_t>{1, 7}));
  EXPECT_TRUE(d.standbys.empty());
}

TEST(Membership, BelowMinWorkersPausesThenFailsAfterTheRejoinTimeout) {
  Clock::time_point t0{};
  auto s = state({{1}, {2, false}, {3, false}});
  auto d = decide_membership(t0, s, {2, 0, 1000ms});
  EXPECT_EQ(d.kind, Kind::pause);
  s.paused = true;
  s.paused_since = t0;
  EXPECT_EQ(decide_membership(t0 + 999ms, s, {2, 0, 1000ms}).kind, Kind::pause);
  auto f = decide_membership(t0 + 1001ms, s, {2, 0, 1000ms});
  EXPECT_EQ(f.kind, Kind::fail);
  EXPECT_NE(f.reason.find("elastic.min_workers = 2"), std::string::npos) << f.reason;
  // Where a pipeline's stages set the least, they are named (it said elastic.min_workers = 2,
  // a key the user never set).
  MembershipOptions stages{2, 0, 1000ms};
  stages.min_is_stages = true;
  EXPECT_EQ(decide_membership(t0 + 1001ms, s, stages).reason,
            "only 1 worker(s), fewer than parallel.pipeline_stages = 2 (a worker each), for "
            "longer than elastic.rejoin_timeout_ms = 1000");
  EXPECT_EQ(decide_membership(t0, state({{1}, {2, false}}), stages).reason,
            "1 worker(s) available, parallel.pipeline_stages = 2 (a worker each)");
  // So are the fewest stages "auto" needs within parallel.max_params_per_worker.
  MembershipOptions budget{2, 0, 1000ms};
  budget.min_is_budget_stages = true;
  EXPECT_EQ(decide_membership(t0, state({{1}, {2, false}}), budget).reason,
            "1 worker(s) available, the 2 pipeline stages parallel.max_params_per_worker needs (a "
            "worker each)");
  // A member returns in time: resume with a new generation.
  s.waiting = {9};
  auto r = decide_membership(t0 + 500ms, s, {2, 0, 1000ms});
  EXPECT_EQ(r.kind, Kind::new_generation);
  EXPECT_EQ(r.members, (std::vector<uint64_t>{1, 9}));
}

TEST(Membership, ARejoiningMemberIsNotCountedTwice) {
  auto d = decide_membership({}, state({{1}, {2, false}}, {1, 5}), {1, 0, 1000ms});
  EXPECT_EQ(d.members, (std::vector<uint64_t>{1, 5}));
}

}  // namespace
}  // namespace troupe::elastic
