// Scale, drain and the launcher's restarts as pure decisions: every branch is a table row.
#include "elastic/scaling.h"

#include <gtest/gtest.h>

#include "elastic/restart_policy.h"

namespace troupe::elastic {
namespace {

using namespace std::chrono_literals;
using Kind = ScaleDecision::Kind;

ScaleLimits limits(uint32_t min = 1, uint32_t max = 0, bool launch = true) {
  ScaleLimits l;
  l.min_workers = min;
  l.max_workers = max;
  l.can_launch = launch;
  l.launcher = launch ? "local" : "external";
  return l;
}

// Agents 0..3 joined in order; 0-2 are members, 3 a standby; one worker each.
const std::vector<LiveAgent> kAgents{{0, 1, true}, {1, 1, true}, {2, 1, true}, {3, 1, false}};

TEST(Scale, GrowingAsksTheLocalLauncherForTheMissingAgents) {
  auto d = decide_scale(6, kAgents, limits());
  EXPECT_EQ(d.kind, Kind::launch);
  EXPECT_EQ(d.agents_to_launch, 2u);
  ScaleLimits two = limits();
  two.workers_per_agent = 2;
  EXPECT_EQ(decide_scale(8, kAgents, two).agents_to_launch, 2u);  // 4 more workers: 2 agents
  // A size agents of 2 workers do not reach from 4 (it went to 8, saying "2 agent(s)"): refused
  // with the sizes they do.
  auto odd = decide_scale(7, kAgents, two);
  EXPECT_EQ(odd.kind, Kind::refuse);
  EXPECT_NE(odd.reason.find("7 worker(s) is not a size the launcher's agents of 2 workers "
                            "(cluster.devices_per_agent) reach from 4: ask for 6 or 8"),
            std::string::npos)
      << odd.reason;
  EXPECT_NE(decide_scale(5, kAgents, two).reason.find("reach from 4: ask for 6"),
            std::string::npos);
}

// `troupe scale --workers 100000` with the local launcher: refused, not 100000 processes here.
TEST(Scale, GrowingPastWhatTheMachineRunsIsInvalid) {
  ScaleLimits l = limits();
  l.machine_cores = 2;
  l.machine_workers = 16;
  EXPECT_EQ(decide_scale(16, kAgents, l).kind, Kind::launch);
  auto d = decide_scale(100000, kAgents, l);
  EXPECT_EQ(d.kind, Kind::invalid);
  EXPECT_NE(d.reason.find("2 core(s) (at most 16 workers)"), std::string::npos) << d.reason;
  EXPECT_EQ(decide_scale(2, kAgents, l).kind, Kind::drain);  // (shrinking is not bounded)
}

TEST(Scale, GrowingWithAnExternalLauncherIsRefusedWithWhatToDo) {
  auto d = decide_scale(6, kAgents, limits(1, 0, false));
  EXPECT_EQ(d.kind, Kind::invalid);  // (troupe scale exits 2: it can never be done there)
  EXPECT_NE(d.reason.find("troupe agent --join"), std::string::npos) << d.reason;
  EXPECT_NE(d.reason.find("; the job has 4 worker(s)"), std::string::npos) << d.reason;
}

TEST(Scale, ShrinkingDrainsStandbysFirstThenTheNewestMembers) {
  auto d = decide_scale(2, kAgents, limits());
  EXPECT_EQ(d.kind, Kind::drain);
  EXPECT_EQ(d.drain, (std::vector<uint32_t>{3, 2}));
}

TEST(Scale, ShrinkingNeverGoesBelowTheTarget) {
  // The newest agent has 2 workers: to go from 4 to 3 the one-worker agent 1 goes instead.
  std::vector<LiveAgent> a{{0, 1, true}, {1, 1, true}, {2, 2, true}};
  auto d = decide_scale(3, a, limits());
  EXPECT_EQ(d.drain, (std::vector<uint32_t>{1}));
}

// Agents of two workers each cannot leave an odd number: refused with the sizes they can leave
// (it said "nothing to do: " and the job stayed at 4).
TEST(Scale, ASizeNoSetOfAgentsLeavesIsRefusedWithTheNearestOnes) {
  std::vector<LiveAgent> a{{0, 2, true}, {1, 2, true}, {2, 2, true}};
  auto d = decide_scale(3, a, limits());
  EXPECT_EQ(d.kind, Kind::refuse);
  EXPECT_TRUE(d.drain.empty());
  EXPECT_EQ(d.reason,
            "no set of agents leaves exactly 3 worker(s): an agent leaves with all its workers "
            "(6 in 3 agents); the nearest sizes: 2 or 4");
  const std::string five = decide_scale(5, a, limits()).reason;
  EXPECT_EQ(five.substr(five.size() - 20), "the nearest sizes: 4") << five;
  EXPECT_EQ(decide_scale(4, a, limits()).drain, (std::vector<uint32_t>{2}));
}

// Agents of 3, 3, 1 and 1 workers to 2: the newest first takes both ones and misses; the two
// threes leave exactly 2 (it was refused as if no set could).
TEST(Scale, ASizeSomeSetOfAgentsLeavesIsReachedWhenTheNewestFirstMissIt) {
  std::vector<LiveAgent> a{{0, 3, true}, {1, 3, true}, {2, 1, true}, {3, 1, true}};
  auto d = decide_scale(2, a, limits());
  EXPECT_EQ(d.kind, Kind::drain) << d.reason;
  EXPECT_EQ(d.drain, (std::vector<uint32_t>{1, 0}));
  // The nearest sizes offered are within elastic.max_workers.
  std::vector<LiveAgent> two{{0, 2, true}, {1, 2, true}, {2, 2, true}};
  const std::string r = decide_scale(3, two, limits(1, 3)).reason;
  EXPECT_EQ(r.substr(r.size() - 22), "; the nearest sizes: 2") << r;
}

TEST(Scale, TheSameSizeDoesNothing) {
  auto d = decide_scale(4, kAgents, limits());
  EXPECT_EQ(d.kind, Kind::nothing);
  EXPECT_EQ(d.reason, "the job has 4 worker(s)");
}

// Agents the launcher started count as the job's before they join: the same scale asked again
// (an autoscaler's loop) launches no more; a larger one launches only the rest; a smaller one
// would leave them joining above the target: refused until they have joined.
TEST(Scale, AgentsStillStartingCountAsTheJobs) {
  auto same = decide_scale(6, kAgents, limits(), 2);
  EXPECT_EQ(same.kind, Kind::nothing);
  EXPECT_EQ(same.reason, "the job has 4 worker(s) and 2 starting");
  auto more = decide_scale(7, kAgents, limits(), 2);
  EXPECT_EQ(more.kind, Kind::launch);
  EXPECT_EQ(more.agents_to_launch, 1u);
  for (uint32_t n : {5u, 3u}) {
    auto fewer = decide_scale(n, kAgents, limits(), 2);
    EXPECT_EQ(fewer.kind, Kind::refuse) << n;
    EXPECT_NE(fewer.reason.find("2 worker(s) the launcher started have not joined yet"),
              std::string::npos)
        << fewer.reason;
  }
}

TEST(Scale, TargetsOutsideTheLimitsAreInvalid) {
  auto low = decide_scale(1, kAgents, limits(2));
  EXPECT_EQ(low.kind, Kind::invalid);
  EXPECT_NE(low.reason.find("fewer than the job needs: 2"), std::string::npos) << low.reason;
  auto high = decide_scale(9, kAgents, limits(1, 8));
  EXPECT_EQ(high.kind, Kind::invalid);
  EXPECT_NE(high.reason.find("elastic.max_workers = 8"), std::string::npos) << high.reason;
}

TEST(Drain, AnAgentLeavesUnlessTooFewWouldRemain) {
  EXPECT_EQ(decide_drain(1, kAgents, limits()).kind, Kind::drain);
  auto refused = decide_drain(1, kAgents, limits(4));
  EXPECT_EQ(refused.kind, Kind::refuse);
  EXPECT_NE(refused.reason.find("fewer workers than the job needs"), std::string::npos);
  EXPECT_EQ(decide_drain(9, kAgents, limits()).kind, Kind::invalid);
}

TEST(RestartPolicy, ACleanExitIsDone) {
  EXPECT_EQ(decide_restart({}, 0, true).kind, RestartDecision::Kind::done);
}

TEST(RestartPolicy, FailuresRestartWithADoublingBoundedBackoffThenGiveUp) {
  RestartPolicy p{5, 100ms, 1000ms};
  std::vector<int64_t> waits;
  for (int64_t r = 0; r < 5; ++r) {
    auto d = decide_restart(p, r, false);
    ASSERT_EQ(d.kind, RestartDecision::Kind::restart);
    waits.push_back(d.backoff.count());
  }
  EXPECT_EQ(waits, (std::vector<int64_t>{100, 200, 400, 800, 1000}));
  auto d = decide_restart(p, 5, false);
  EXPECT_EQ(d.kind, RestartDecision::Kind::give_up);
  EXPECT_NE(d.reason.find("elastic.max_restarts"), std::string::npos);
  EXPECT_EQ(decide_restart(RestartPolicy{0}, 0, false).kind, RestartDecision::Kind::give_up);
  EXPECT_EQ(decide_restart(RestartPolicy{100, 100ms, 5000ms}, 90, false).backoff, 5000ms);
}

}  // namespace
}  // namespace troupe::elastic
