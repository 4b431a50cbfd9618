// The start of a generation, without threads or clocks: the start step, the ledger's recovery or
// rollback, and what moves where (plan_migration), including a property test over random layouts.
#include "elastic/generation.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "elastic/planner.h"

namespace troupe::elastic {
namespace {

Holding H(uint64_t applied, std::vector<uint32_t> held, std::vector<uint32_t> snapshot) {
  Holding h;
  h.applied = applied;
  h.held = std::move(held);
  h.snapshot = std::move(snapshot);
  return h;
}

TEST(StartStep, DataParallelMembersResumeAtTheNewestAppliedStep) {
  std::vector<Holding> m{H(7, {0, 1, 2}, {}), H(8, {0, 1, 2}, {}), H(7, {0, 1, 2}, {})};
  EXPECT_EQ(choose_start_step(m, 3), 8u);
}

TEST(StartStep, AStageThatAppliedAStepOthersDidNotRollsBackToItsSnapshot) {
  // Stage 0 (blocks 0, 1) applied step 25 and keeps its state from before; stage 1 (blocks 2,
  // 3) did not apply it: everyone resumes at 25.
  std::vector<Holding> m{H(26, {0, 1}, {0, 1}), H(25, {2, 3}, {2, 3})};
  EXPECT_EQ(choose_start_step(m, 4), 25u);
}

TEST(StartStep, ABlockHeldByNobodyMeansNoStart) {
  std::vector<Holding> m{H(10, {0, 1}, {0, 1})};
  EXPECT_FALSE(choose_start_step(m, 4).has_value());
  EXPECT_EQ(choose_start_step({}, 0), std::nullopt);
}

TEST(StartStep, ALostStageWithoutAReplicaRollsBackToTheNewestBackup) {
  // Stage 1 (blocks 2, 3) was lost; stage 0's worker holds its own blocks live at 47 and a
  // backup of both stages at 40; the standby that takes stage 1 holds nothing.
  Holding stage0{47, {0, 1}, {0, 1}, 40, {0, 1, 2, 3}};
  Holding standby{47, {}, {}, 0, {}};
  EXPECT_EQ(choose_start_step({stage0, standby}, 4), 40u);
  // Without the backup there is no step to start from.
  stage0.backup.clear();
  EXPECT_FALSE(choose_start_step({stage0, standby}, 4).has_value());
}

// The state lost, every member reloads it (a checkpoint of step 40, 52 steps committed): the
// steps since are redone, and with each member holding every block as of 40 nothing moves, on
// any layout (here two pipeline stages).
TEST(StartStep, AReloadRedoesTheStepsSinceAndMovesNothing) {
  const GenerationStart g = reload_start(40, 52, 2);
  EXPECT_TRUE(g.ok);
  EXPECT_EQ(g.start_step, 40u);
  EXPECT_TRUE(g.rolled_back);
  EXPECT_EQ(g.lacking, 2u);
  EXPECT_EQ(g.recover_to, g.recover_from);
  EXPECT_FALSE(reload_start(0, 0, 1).rolled_back);  // (nothing committed yet: nothing redone)
  const std::vector<Holding> members(2, reloaded(40, 4));
  EXPECT_EQ(members[0].held, (std::vector<uint32_t>{0, 1, 2, 3}));
  const Migration m = plan_migration(members, 40, {{0, 2}, {2, 4}}, {8, 8, 8, 8});
  EXPECT_TRUE(m.ok) << m.reason;
  EXPECT_TRUE(m.batches.empty());
  EXPECT_TRUE(m.restores.empty());
  EXPECT_EQ(m.bytes_moved, 0u);
}

TEST(StartStep, ANewcomerHoldsTheInitialStateOnlyBeforeTheFirstStep) {
  // A fresh worker holds every block at step 0; the members at step 40 win.
  std::vector<Holding> m{H(40, {0, 1}, {0, 1}), H(40, {2}, {2}), H(0, {0, 1, 2}, {})};
  EXPECT_EQ(choose_start_step(m, 3), 40u);
}

// --- the same model everywhere ------------------------------------------------------------------

TEST(ModelDifference, NamesTheBlockCountOrTheFirstBlockOfAnotherSize) {
  EXPECT_EQ(model_difference({10, 20, 30}, "a", {10, 20, 30}, "b"), "");
  EXPECT_EQ(model_difference({}, "a", {}, "b"), "");
  EXPECT_EQ(model_difference({10, 20}, "worker 1.0's model", {10, 20, 30}, "the job's model"),
            "worker 1.0's model has 2 blocks, the job's model has 3");
  EXPECT_EQ(model_difference({10, 21, 31}, "worker 1.0's model", {10, 20, 30}, "0.0's"),
            "block 1 has 21 parameters in worker 1.0's model, 20 in 0.0's");
}

// --- start_generation ---------------------------------------------------------------------------

// A member checks what the coordinator relays for it against what it holds: less is fine (a
// doubted claim is taken as nothing), more is named.
TEST(Claims, ARelayedHoldingMayClaimLessThanTheMemberHoldsButNotMore) {
  Holding own = H(26, {0, 1}, {0, 1});
  own.backup_step = 20;
  own.backup = {2};
  EXPECT_EQ(claims_beyond(own, own), "");
  EXPECT_EQ(claims_beyond(Holding{}, own), "");
  EXPECT_EQ(claims_beyond(H(26, {1}, {}), own), "");
  EXPECT_EQ(claims_beyond(H(26, {0, 1, 2}, {}), own), "block 2 live as of step 26");
  EXPECT_EQ(claims_beyond(H(40, {0}, {}), own), "block 0 live as of step 40");
  EXPECT_EQ(claims_beyond(H(27, {}, {1}), own), "block 1 in a snapshot as of step 26");
  EXPECT_EQ(claims_beyond(H(0, {}, {1}), H(0, {}, {})), "block 1 in a snapshot as of step 0");
  Holding backup = H(26, {}, {});
  backup.backup_step = 20;
  backup.backup = {2, 3};
  EXPECT_EQ(claims_beyond(backup, own), "block 3 in a backup as of step 20");
  backup.backup = {2};
  backup.backup_step = 10;
  EXPECT_EQ(claims_beyond(backup, own), "block 2 in a backup as of step 10");
}

TEST(GenerationStart, AFailureAfterAStepSomeAppliedCommitsThatStep) {
  // Three members: two applied step 12 (the lost member's reduction completed), one did not
  // see the last collective complete; the ledger has 11 steps committed.
  std::vector<Holding> m{H(12, {0}, {}), H(11, {0}, {}), H(12, {0}, {})};
  GenerationStart g = start_generation(m, 1, 11);
  ASSERT_TRUE(g.ok) << g.reason;
  EXPECT_EQ(g.start_step, 12u);
  EXPECT_EQ(g.state_source, 0u);  // the lowest rank at the start step
  EXPECT_EQ(g.lacking, 1u);
  EXPECT_EQ(g.recover_from, 11u);
  EXPECT_EQ(g.recover_to, 12u);
  EXPECT_FALSE(g.rolled_back);
}

TEST(GenerationStart, NothingToRecoverWhenTheLedgerIsAtTheStart) {
  GenerationStart g = start_generation({H(5, {0, 1}, {}), H(5, {0, 1}, {})}, 2, 5);
  ASSERT_TRUE(g.ok);
  EXPECT_EQ(g.recover_from, g.recover_to);
  EXPECT_EQ(g.lacking, 0u);
}

TEST(GenerationStart, ALostStageRollsTheLedgerBackToTheBackup) {
  Holding stage0{47, {0, 1}, {0, 1}, 40, {0, 1, 2, 3}};
  Holding standby{47, {}, {}, 0, {}};
  GenerationStart g = start_generation({stage0, standby}, 4, 47);
  ASSERT_TRUE(g.ok) << g.reason;
  EXPECT_EQ(g.start_step, 40u);
  EXPECT_TRUE(g.rolled_back);
  EXPECT_EQ(g.recover_from, g.recover_to);  // nothing committed now
  EXPECT_EQ(g.lacking, 2u);
}

TEST(GenerationStart, NoHolderOfABlockIsNoStartWithAReason) {
  GenerationStart g = start_generation({H(10, {0, 1}, {})}, 4, 10);
  EXPECT_FALSE(g.ok);
  EXPECT_NE(g.reason.find("no step at which every model block is held"), std::string::npos);
}

TEST(GenerationStart, TheSourceIsTheLowestRankAtTheStartStep) {
  GenerationStart g = start_generation({H(3, {0}, {}), H(9, {0}, {}), H(9, {0}, {})}, 1, 3);
  EXPECT_EQ(g.state_source, 1u);
}

// --- plan_migration -----------------------------------------------------------------------------

std::vector<BlockRange> all(uint32_t ranks, uint32_t blocks) {
  return std::vector<BlockRange>(ranks, BlockRange{0, blocks});
}

TEST(Migration, MembersAtTheStartStepMoveNothing) {
  std::vector<Holding> m{H(7, {0, 1, 2}, {}), H(7, {0, 1, 2}, {})};
  Migration mig = plan_migration(m, 7, all(2, 3), {10, 10, 10});
  ASSERT_TRUE(mig.ok) << mig.reason;
  EXPECT_TRUE(mig.batches.empty());
  EXPECT_TRUE(mig.restores.empty());
  EXPECT_EQ(mig.bytes_moved, 0u);
}

TEST(Migration, AJoinerReceivesEveryBlockInOneBatchFromTheLowestRankedHolder) {
  // Two holders at step 9 (rank 0 lacks the step), a joiner holding nothing.
  std::vector<Holding> m{H(8, {0, 1, 2, 3}, {}), H(9, {0, 1, 2, 3}, {}), H(9, {0, 1, 2, 3}, {}),
                         H(0, {}, {})};
  Migration mig = plan_migration(m, 9, all(4, 4), {100, 100, 100, 100});
  ASSERT_TRUE(mig.ok) << mig.reason;
  ASSERT_EQ(mig.batches.size(), 2u);
  EXPECT_EQ(mig.batches[0].from, 1u);  // rank 0 lacks step 9 too: it receives first
  EXPECT_EQ(mig.batches[0].to, 0u);
  EXPECT_EQ(mig.batches[1].from, 1u);
  EXPECT_EQ(mig.batches[1].to, 3u);
  EXPECT_EQ(mig.batches[1].blocks, (std::vector<uint32_t>{0, 1, 2, 3}));
  EXPECT_EQ(mig.bytes_moved, 800u);
  for (const auto& b : mig.batches)
    for (Copy c : b.copies) EXPECT_EQ(c, Copy::live);
}

TEST(Migration, AStageThatAppliedOneStepMoreRestoresItsSnapshot) {
  // Stage 0 (blocks 0-1) applied step 26 and holds 25 in its snapshot; stage 1 is at 25.
  std::vector<Holding> m{H(26, {0, 1}, {0, 1}), H(25, {2, 3}, {2, 3})};
  Migration mig = plan_migration(m, 25, {{0, 2}, {2, 4}}, {1, 1, 1, 1});
  ASSERT_TRUE(mig.ok) << mig.reason;
  EXPECT_TRUE(mig.batches.empty());
  ASSERT_EQ(mig.restores.size(), 2u);
  EXPECT_EQ(mig.restores[0].rank, 0u);
  EXPECT_EQ(mig.restores[0].block, 0u);
  EXPECT_EQ(mig.restores[0].copy, Copy::snapshot);
}

TEST(Migration, ALostStageIsSentFromTheNextStagesBackup) {
  // Stage 1 lost; stage 0's worker holds a backup of both stages at 40; the newcomer takes
  // stage 1: it receives blocks 2-3 from rank 0's backup, rank 0 restores its own from the backup.
  Holding stage0{47, {0, 1}, {0, 1}, 40, {0, 1, 2, 3}};
  Holding fresh{0, {}, {}, 0, {}};
  Migration mig = plan_migration({stage0, fresh}, 40, {{0, 2}, {2, 4}}, {8, 8, 8, 8});
  ASSERT_TRUE(mig.ok) << mig.reason;
  ASSERT_EQ(mig.batches.size(), 1u);
  EXPECT_EQ(mig.batches[0].blocks, (std::vector<uint32_t>{2, 3}));
  EXPECT_EQ(mig.batches[0].copies, (std::vector<Copy>{Copy::backup, Copy::backup}));
  ASSERT_EQ(mig.restores.size(), 2u);
  EXPECT_EQ(mig.restores[1].copy, Copy::backup);
}

TEST(Migration, ABlockNoOneHoldsIsLostWithAReason) {
  std::vector<Holding> m{H(10, {0, 1}, {}), H(0, {}, {})};
  Migration mig = plan_migration(m, 10, {{0, 2}, {2, 4}}, {1, 1, 1, 1});
  EXPECT_FALSE(mig.ok);
  EXPECT_EQ(mig.lost_blocks, (std::vector<uint32_t>{2, 3}));
  EXPECT_NE(mig.reason.find("block 2 is held by no member at step 10"), std::string::npos)
      << mig.reason;
}

TEST(Migration, MismatchedInputsAreRefused) {
  EXPECT_FALSE(plan_migration({H(1, {0}, {})}, 1, all(2, 1), {1}).ok);
}

// The ownership of each rank under a plan (standbys own nothing; pp = 1: everything).
std::vector<BlockRange> owned_by(const Plan& p, uint32_t world) {
  std::vector<BlockRange> out(world);
  for (uint32_t r = 0; r < world; ++r) {
    auto at = placement_of_rank(p, r);
    if (p.pp == 1)
      out[r] = {0, p.num_blocks};
    else if (!at.standby)
      out[r] = {p.stage_block_begin(at.stage), p.stage_block_end(at.stage)};
  }
  return out;
}

// For random layouts before and after a change (survivors keep what their old stage held,
// joiners hold nothing): every (owner, block) it lacks arrives exactly once, from a member
// holding it; nobody receives what it holds; executing the batches in order with rendezvous
// semantics never deadlocks (each batch's ends reach it together).
TEST(Migration, RandomChangesMoveExactlyWhatIsMissingWithoutDeadlock) {
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t n = 1 + uint32_t(rng() % 9);
    std::vector<BlockCost> costs(n);
    std::vector<uint64_t> bytes(n);
    for (uint32_t b = 0; b < n; ++b) {
      costs[b] = {double(1 + rng() % 9), 1 + rng() % 100, 0};
      bytes[b] = costs[b].param_bytes;
    }
    PlanOptions o;
    o.global_batch = 16;
    o.micro_batches = 4;
    const uint32_t W = 1 + uint32_t(rng() % 6);
    o.pipeline_stages = uint32_t(rng() % 3);
    const Plan p = plan_pipeline(W, costs, o);
    if (!p.ok) continue;
    const auto owned = owned_by(p, W);
    std::vector<Holding> m(W);
    for (uint32_t r = 0; r < W; ++r) {
      m[r].applied = 30;
      if (rng() % 3 == 0) continue;  // a joiner (or a worker that lost its state)
      for (uint32_t b = 0; b < n; ++b)
        if (rng() % 2) m[r].held.push_back(b);
    }
    Migration mig = plan_migration(m, 30, owned, bytes);
    std::set<std::pair<uint32_t, uint32_t>> want, got;
    std::set<uint32_t> lost;
    for (uint32_t r = 0; r < W; ++r)
      for (uint32_t b = owned[r].begin; b < owned[r].end; ++b) {
        if (copy_at(m[r], b, 30)) continue;
        bool anyone = false;
        for (auto& h : m) anyone |= copy_at(h, b, 30).has_value();
        if (anyone)
          want.insert({r, b});
        else
          lost.insert(b);
      }
    for (const auto& batch : mig.batches)
      for (uint32_t b : batch.blocks) {
        EXPECT_TRUE(copy_at(m[batch.from], b, 30)) << "rank " << batch.from << " lacks " << b;
        for (uint32_t h = 0; h < batch.from; ++h)
          EXPECT_FALSE(copy_at(m[h], b, 30)) << "a lower rank holds " << b;
        EXPECT_TRUE(got.insert({batch.to, b}).second) << "block " << b << " sent twice";
      }
    EXPECT_EQ(mig.ok, lost.empty());
    EXPECT_EQ(std::set<uint32_t>(mig.lost_blocks.begin(), mig.lost_blocks.end()), lost);
    if (!mig.ok) continue;
    EXPECT_EQ(got, want);
    // Rendezvous execution: each rank walks its batches in order; a batch completes when both
    // its ends are at it. Every round some batch completes until all have.
    std::vector<size_t> at(W, 0);
    std::vector<std::vector<size_t>> mine(W);
    for (size_t i = 0; i < mig.batches.size(); ++i) {
      mine[mig.batches[i].from].push_back(i);
      mine[mig.batches[i].to].push_back(i);
    }
    size_t done = 0;
    while (done < mig.batches.size()) {
      bool moved = false;
      for (size_t i = 0; i < mig.batches.size(); ++i) {
        const auto& bt = mig.batches[i];
        auto head = [&](uint32_t r) { return at[r] < mine[r].size() && mine[r][at[r]] == i; };
        if (head(bt.from) && head(bt.to)) {
          ++at[bt.from];
          ++at[bt.to];
          ++done;
          moved = true;
        }
      }
      ASSERT_TRUE(moved) << "the batches deadlock";
    }
    ++checked;
  }
  EXPECT_GE(checked, 100);
}

}  // namespace
}  // namespace troupe::elastic
