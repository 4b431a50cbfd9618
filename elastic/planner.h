// The pipeline-parallel planner, as pure functions: plan_pipeline(workers, blocks, options) ->
// Plan {ok, reason, dp x pp, stage boundaries, estimated cost}. What moves after a membership
// change is elastic/generation.h's plan_migration. No threads, no clock reads,
// no I/O; the same inputs always give the same plan. All functions are safe to call from any
// thread; they own nothing but their return values.
//
// Legend: W workers (members of the generation), n model blocks, B global batch (samples per
// step), m micro-batches per step, dp data-parallel replicas, pp pipeline stages.
//
// Layout. A generation runs dp x pp workers: pp stages, each a contiguous range of blocks
// [stage_begin[s], stage_begin[s+1]), each stage replicated dp times. Worker ranks are
// replica-major: rank = replica * pp + stage, so ranks [r*pp, (r+1)*pp) form pipeline r (one
// whole copy of the model). Ranks dp*pp .. W-1 are standbys and hold nothing. Replica-major keeps
// surviving ranks on their blocks when dp grows or shrinks (joiners are appended after the
// survivors), which is the common elastic change.
//
// Cost model (per step; "cost" is seconds when block costs are times, see BlockCost):
//   c(s)            = the per-sample cost of stage s: its blocks' costs summed left to right
//   share           = ceil(B / dp), the largest per-replica share (data_share: uneven is fine)
//   max_stage_cost  = max_s c(s) * share
//   bubble          = (pp - 1) / (m + pp - 1)                       (1F1B pipeline bubble)
//   compute         = max_stage_cost * (m + pp - 1) / m
//   allreduce(s)    = 2 (dp - 1) / dp * stage_param_bytes[s] / allreduce_bytes_per_s
//   step_cost       = compute + max_s allreduce(s)    (the stages' dp groups reduce concurrently)
// The allreduce term is added only when allreduce_bytes_per_s > 0 and the cost is in seconds.
// Point-to-point activation transfers between stages are not modelled: fold them into the
// blocks' measured times if they matter.
//
// Choice. Among dp x pp <= W with pp <= n, dp <= B, and every stage's parameter bytes within
// max_params_per_worker, the plan minimises step_cost. Ties (within a relative 1e-12) prefer the
// smaller pp, then the larger dp (use the most workers). A fixed pipeline_stages N forces pp = N.
//
// Stage boundaries for a given pp: the exact minimum over all contiguous partitions into pp
// non-empty parts of the largest part's per-sample cost (computed as above, in double, left to
// right), subject to each part's parameter bytes <= max_params_per_worker. Among the optimal
// partitions the canonical one is the lexicographically earliest stage_begin: early stages are as
// short as the optimum allows. (In 1F1B stage s keeps up to pp - s micro-batches' activations,
// so lighter early stages also even out activation memory.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::elastic {

// One model block (a layer or a group of layers), the planner's unit of placement.
struct BlockCost {
  double flops_per_sample = 0;       // forward + backward FLOPs for one sample
  uint64_t param_bytes = 0;          // bytes of parameters (what a holder stores and reduces)
  double measured_s_per_sample = 0;  // measured time for one sample; used instead of FLOPs
                                     // when > 0 for every block
};

struct PlanOptions {
  uint32_t pipeline_stages = 0;        // pp: 0 = auto, otherwise exactly this many stages
  uint64_t global_batch = 1;           // B: samples per step, >= 1
  uint32_t micro_batches = 1;          // m: micro-batches per step, >= 1
  uint64_t max_params_per_worker = 0;  // bytes of parameters a worker can hold; 0 = no limit
  double worker_flops_per_s = 0;       // turns FLOPs into seconds; 0 = costs stay in FLOPs
  double allreduce_bytes_per_s = 0;    // data-parallel allreduce bandwidth; 0 = ignore
};

struct Plan {
  bool ok = false;
  std::string reason;  // why it failed, or a one-line summary of the choice
  uint32_t dp = 0, pp = 0;
  uint32_t num_blocks = 0;
  std::vector<uint32_t> stage_begin;  // first block of each stage; size pp, stage_begin[0] = 0
  double step_cost = 0;               // estimated time (or FLOPs) of one step, see above
  double max_stage_cost = 0;          // max_s c(s) * share, the slowest stage's work per step
  double bubble = 0;                  // (pp - 1) / (m + pp - 1)
  bool cost_in_seconds = false;       // measured times or worker_flops_per_s > 0
  std::vector<double> stage_cost;     // c(s) * share for each stage
  std::vector<uint64_t> stage_param_bytes;  // parameter bytes of each stage

  uint32_t workers_used() const { return dp * pp; }
  // The blocks of stage s: [stage_block_begin(s), stage_block_end(s)).
  uint32_t stage_block_begin(uint32_t s) const { return stage_begin[s]; }
  uint32_t stage_block_end(uint32_t s) const {
    return s + 1 < stage_begin.size() ? stage_begin[s + 1] : num_blocks;
  }
};

Plan plan_pipeline(uint32_t workers, const std::vector<BlockCost>& blocks,
                   const PlanOptions& options);

// Where a rank sits in a plan: rank = replica * pp + stage; ranks >= dp * pp are standbys.
struct Placement {
  bool standby = true;
  uint32_t stage = 0, replica = 0;
};
Placement placement_of_rank(const Plan& plan, uint32_t rank);
uint32_t rank_of(const Plan& plan, uint32_t stage, uint32_t replica);

// The exact partition used by plan_pipeline, exposed for tests and tools: split the per-sample
// costs into exactly `parts` contiguous non-empty parts minimising the largest part's cost, each
// part's bytes <= max_bytes (0 = no limit); canonical = lexicographically earliest begins.
struct Partition {
  bool ok = false;  // false: parts == 0, parts > blocks, or the byte limit cannot be met
  std::vector<uint32_t> begin;  // first block of each part
  double max_cost = 0;          // the largest part's cost (left-to-right double sum)
};
Partition partition_blocks(const std::vector<double>& cost, const std::vector<uint64_t>& bytes,
                           uint32_t parts, uint64_t max_bytes);

// The fewest contiguous stages whose blocks' parameters each stay within `budget` (greedy is
// the fewest; 0: no budget, 1): the fewest workers a job of pipeline_stages = "auto" trains on.
// A block above the budget is a stage of its own (config checking refuses that job).
uint32_t fewest_stages(const std::vector<uint64_t>& block_params, uint64_t budget);

}  // namespace troupe::elastic
