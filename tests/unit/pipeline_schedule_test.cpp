// The 1F1B schedule as data: for every pp and m, all stages are run together in a simulation
// with rendezvous semantics (a send completes only when its receiver has posted the receive, as
// UCX's large messages do): nothing deadlocks, every message arrives where and in the order it is
// expected, each micro-batch runs forward then backward once and in order, and stage s never has
// more than pp - s micro-batches in flight.
#include "elastic/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace troupe::elastic {
namespace {

using Kind = PipeOp::Kind;
using What = PipeMessage::What;

struct StageRun {
  std::vector<PipeOp> ops;
  size_t at = 0;
  bool sent = false, received = false;  // halves of the current exchange that completed
  std::set<uint32_t> inputs, outputs, grads_out, grads_in;  // what the stage has computed or got
  std::vector<uint32_t> forwards, backwards;
  size_t max_in_flight = 0;
  bool done() const { return at == ops.size(); }
  const PipeOp* head() const { return done() ? nullptr : &ops[at]; }
};

// Runs a compute op if its inputs are there; returns false when it must wait (which, for
// compute ops, is a schedule bug: the test fails on it).
void compute(StageRun& st, const PipeOp& op, uint32_t s, uint32_t pp) {
  const uint32_t j = op.micro;
  switch (op.kind) {
    case Kind::load:
      ASSERT_EQ(s, 0u) << "only the first stage loads";
      st.inputs.insert(j);
      break;
    case Kind::forward:
      ASSERT_TRUE(st.inputs.count(j)) << "stage " << s << " forward " << j << " without input";
      st.outputs.insert(j);
      st.forwards.push_back(j);
      break;
    case Kind::loss:
      ASSERT_EQ(s + 1, pp) << "only the last stage scores";
      ASSERT_TRUE(st.outputs.count(j)) << "loss of " << j << " before its forward";
      st.grads_out.insert(j);
      break;
    case Kind::backward:
      ASSERT_TRUE(st.grads_out.count(j)) << "stage " << s << " backward " << j << " w/o gradient";
      ASSERT_TRUE(std::count(st.forwards.begin(), st.forwards.end(), j));
      st.grads_in.insert(j);
      st.backwards.push_back(j);
      break;
    case Kind::exchange:
      break;
  }
  st.max_in_flight = std::max(st.max_in_flight, st.forwards.size() - st.backwards.size());
}

// Tries to complete the send half of stage s's current exchange against its neighbour's head.
bool try_send(std::vector<StageRun>& run, uint32_t s) {
  StageRun& st = run[s];
  const PipeMessage& m = *st.head()->send;
  const bool up = m.what == What::activation;
  EXPECT_TRUE(up ? st.outputs.count(m.micro) : st.grads_in.count(m.micro))
      << "stage " << s << " sends what it has not computed";
  const uint32_t peer = up ? s + 1 : s - 1;
  if (peer >= run.size()) {
    ADD_FAILURE() << "stage " << s << " sends past the pipeline's end";
    return false;
  }
  StageRun& other = run[peer];
  const PipeOp* h = other.head();
  // Only a receive from this direction matches (activations come from the previous stage,
  // gradients from the next); the message waits otherwise.
  if (!h || h->kind != Kind::exchange || !h->recv || other.received || h->recv->what != m.what)
    return false;
  EXPECT_EQ(h->recv->micro, m.micro)
      << "messages between " << s << " and " << peer << " arrive out of order";
  (up ? other.inputs : other.grads_out).insert(m.micro);
  other.received = true;
  st.sent = true;
  return true;
}

void simulate(uint32_t pp, uint32_t m) {
  std::vector<StageRun> run(pp);
  for (uint32_t s = 0; s < pp; ++s) run[s].ops = one_f_one_b(pp, s, m);
  while (true) {
    bool progress = false, all = true;
    for (uint32_t s = 0; s < pp; ++s) {
      StageRun& st = run[s];
      if (st.done()) continue;
      all = false;
      const PipeOp& op = *st.head();
      if (op.kind != Kind::exchange) {
        compute(st, op, s, pp);
        if (::testing::Test::HasFatalFailure()) return;
        ++st.at;
        progress = true;
        continue;
      }
      if (op.send && !st.sent) progress |= try_send(run, s);
      const bool complete = (!op.send || st.sent) && (!op.recv || st.received);
      if (complete) {
        ++st.at;
        st.sent = st.received = false;
        progress = true;
      }
    }
    if (all) break;
    ASSERT_TRUE(progress) << "deadlock at pp " << pp << ", m " << m;
  }
  std::vector<uint32_t> in_order(m);
  for (uint32_t j = 0; j < m; ++j) in_order[j] = j;
  for (uint32_t s = 0; s < pp; ++s) {
    EXPECT_EQ(run[s].forwards, in_order) << "stage " << s << ": " << describe(run[s].ops);
    EXPECT_EQ(run[s].backwards, in_order) << "stage " << s << ": " << describe(run[s].ops);
    EXPECT_LE(run[s].max_in_flight, size_t(pp - s)) << "stage " << s << " of " << pp;
    if (m >= pp) {
      EXPECT_EQ(run[s].max_in_flight, size_t(pp - s)) << "1F1B fills the pipeline";
    }
  }
}

TEST(PipelineSchedule, EveryStageCountAndMicroBatchCountRunsWithoutDeadlock) {
  for (uint32_t pp = 1; pp <= 8; ++pp)
    for (uint32_t m = 1; m <= 12; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      simulate(pp, m);
      if (HasFatalFailure()) return;
    }
}

TEST(PipelineSchedule, TwoStagesFourMicroBatchesReadAsMegatrons) {
  EXPECT_EQ(describe(one_f_one_b(2, 0, 4)),
            "L0 F0 x(>a0) L1 F1 x(>a1,<g0) B0 L2 F2 x(>a2,<g1) B1 L3 F3 x(>a3,<g2) B2 x(<g3) B3");
  EXPECT_EQ(describe(one_f_one_b(2, 1, 4)),
            "x(<a0) F0 S0 B0 x(>g0,<a1) F1 S1 B1 x(>g1,<a2) F2 S2 B2 x(>g2,<a3) F3 S3 B3 x(>g3)");
}

TEST(PipelineSchedule, OneStageIsForwardLossBackward) {
  EXPECT_EQ(describe(one_f_one_b(1, 0, 2)), "L0 F0 S0 B0 L1 F1 S1 B1");
}

TEST(PipelineSchedule, OutOfRangeStagesHaveNoOperations) {
  EXPECT_TRUE(one_f_one_b(2, 2, 4).empty());
  EXPECT_TRUE(one_f_one_b(0, 0, 4).empty());
}

}  // namespace
}  // namespace troupe::elastic
