#include "elastic/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <unordered_set>

namespace troupe::elastic {
namespace {

constexpr size_t kNoParts = std::numeric_limits<size_t>::max();

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

// Part costs are always the left-to-right double sum from the part's first block. Rounded
// addition is monotone, so a sub-range never costs more than the range that contains it: the
// greedy below is exact and an optimal partition can always be split further.
struct Partitioner {
  const std::vector<double>& cost;
  const std::vector<uint64_t>& bytes;
  uint64_t max_bytes;  // 0: no limit
  std::vector<double> candidates;

  Partitioner(const std::vector<double>& c, const std::vector<uint64_t>& b, uint64_t limit)
      : cost(c), bytes(b), max_bytes(limit) {
    // The optimum is the cost of some part: every contiguous range's sum is a candidate.
    const size_t n = cost.size();
    candidates.reserve(n * (n + 1) / 2);
    for (size_t i = 0; i < n; ++i) {
      double s = 0;
      for (size_t j = i; j < n; ++j) candidates.push_back(s += cost[j]);
    }
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  }

  // The end of the longest valid part starting at b (b itself if block b alone is invalid).
  size_t longest(size_t b, double cap) const {
    double s = 0;
    uint64_t by = 0;
    size_t e = b;
    for (; e < cost.size(); ++e) {
      const double next = s + cost[e];
      if (next > cap) break;
      if (max_bytes && bytes[e] > max_bytes - by) break;
      s = next;
      by += bytes[e];
    }
    return e;
  }

  size_t min_parts(double cap) const {
    size_t parts = 0;
    for (size_t b = 0; b < cost.size(); ++parts) {
      const size_t e = longest(b, cap);
      if (e == b) return kNoParts;
      b = e;
    }
    return parts;
  }

  Partition solve(uint32_t parts) const {
    Partition p;
    const size_t n = cost.size();
    if (parts == 0 || parts > n || candidates.empty()) return p;
    if (min_parts(candidates.back()) > parts) return p;  // the byte limit cannot be met
    // Smallest candidate cap that fits in `parts` parts (feasibility is monotone in the cap).
    size_t lo = 0, hi = candidates.size() - 1;
    while (lo < hi) {
      const size_t mid = lo + (hi - lo) / 2;
      if (min_parts(candidates[mid]) <= parts)
        hi = mid;
      else
        lo = mid + 1;
    }
    const double cap = candidates[lo];
    // suffix[b]: fewest parts for blocks [b, n) under cap (greedy). The suffix can be split into
    // exactly r parts iff suffix[b] <= r <= n - b, since every single block is valid under cap.
    std::vector<size_t> suffix(n + 1, 0);
    for (size_t b = n; b-- > 0;) {
      const size_t e = longest(b, cap);
      suffix[b] = (e == b || suffix[e] == kNoParts) ? kNoParts : suffix[e] + 1;
    }
    // Lexicographically earliest begins: each part ends as early as the rest allows.
    size_t at = 0;
    for (uint32_t k = 0; k < parts; ++k) {
      p.begin.push_back(uint32_t(at));
      const size_t rest = parts - k - 1;
      double s = 0;
      uint64_t by = 0;
      size_t e = at;
      size_t chosen = kNoParts;
      for (; e < n; ++e) {
        const double next = s + cost[e];
        if (next > cap || (max_bytes && bytes[e] > max_bytes - by)) break;
        s = next;
        by += bytes[e];
        const size_t end = e + 1;
        if (rest == 0 ? end == n : (suffix[end] <= rest && rest <= n - end)) {
          chosen = end;
          break;
        }
      }
      if (chosen == kNoParts) return Partition{};  // unreachable: the cap was feasible
      p.max_cost = std::max(p.max_cost, s);
      at = chosen;
    }
    p.ok = true;
    return p;
  }
};

Plan fail(std::string reason) {
  Plan p;
  p.reason = std::move(reason);
  return p;
}

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

uint32_t fewest_stages(const std::vector<uint64_t>& block_params, uint64_t budget) {
  if (budget == 0 || block_params.empty()) return 1;
  uint32_t stages = 1;
  uint64_t in_stage = 0;
  for (uint64_t b : block_params) {
    if (in_stage > 0 && in_stage + b > budget) stages += 1, in_stage = 0;
    in_stage += b;
  }
  return stages;
}

Partition partition_blocks(const std::vector<double>& cost, const std::vector<uint64_t>& bytes,
                           uint32_t parts, uint64_t max_bytes) {
  if (cost.size() != bytes.size()) return {};
  for (double c : cost)
    if (!finite_nonneg(c)) return {};
  return Partitioner(cost, bytes, max_bytes).solve(parts);
}

namespace {

// "" or why the options or the worker count cannot be planned for (n blocks).
std::string check_options(uint32_t W, size_t n, const PlanOptions& o) {
  if (W == 0) return "no workers (W = 0)";
  if (n == 0) return "the model has no blocks";
  if (n > std::numeric_limits<uint32_t>::max()) return "too many blocks";
  if (o.global_batch == 0) return "global batch B = 0";
  if (o.micro_batches == 0) return "micro_batches m = 0";
  if (!finite_nonneg(o.worker_flops_per_s))
    return "worker_flops_per_s = " + num(o.worker_flops_per_s) + " is not >= 0";
  if (!finite_nonneg(o.allreduce_bytes_per_s))
    return "allreduce_bytes_per_s = " + num(o.allreduce_bytes_per_s) + " is not >= 0";
  return "";
}

// Each block's cost per sample (measured seconds when every block has one, else FLOPs, in
// seconds when worker_flops_per_s is given) and parameter bytes.
struct Costs {
  std::vector<double> cost;
  std::vector<uint64_t> bytes;
  uint64_t total_bytes = 0;
  bool seconds = false;
};

// "" or why a block cannot be planned (an invalid cost, more bytes than a worker holds).
std::string block_costs(const std::vector<BlockCost>& blocks, const PlanOptions& o, Costs* out) {
  bool measured = true;
  for (const auto& b : blocks) measured = measured && b.measured_s_per_sample > 0;
  out->seconds = measured || o.worker_flops_per_s > 0;
  const uint64_t limit = o.max_params_per_worker;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& b = blocks[i];
    const double c = measured                   ? b.measured_s_per_sample
                     : o.worker_flops_per_s > 0 ? b.flops_per_sample / o.worker_flops_per_s
                                                : b.flops_per_sample;
    if (!finite_nonneg(b.flops_per_sample) || !finite_nonneg(b.measured_s_per_sample) ||
        !finite_nonneg(c))
      return "block " + std::to_string(i) +
             " has an invalid cost (flops_per_sample = " + num(b.flops_per_sample) +
             ", measured_s_per_sample = " + num(b.measured_s_per_sample) + ")";
    if (limit && b.param_bytes > limit)
      return "block " + std::to_string(i) + " has " + std::to_string(b.param_bytes) +
             " parameter bytes, more than the " + std::to_string(limit) +
             " bytes a worker may hold (parallel.max_params_per_worker, 4 bytes a parameter)";
    out->cost.push_back(c);
    out->bytes.push_back(b.param_bytes);
    out->total_bytes += b.param_bytes;
  }
  return "";
}

// The stage counts to try, [*lo, *hi]: pipeline_stages if set, else 1 .. min(W, n); and at
// least `need`, the fewest the byte limit allows. "" or why none can be.
std::string stage_range(uint32_t W, size_t n, size_t need, uint64_t total_bytes,
                        const PlanOptions& o, uint32_t* lo, uint32_t* hi) {
  const std::string need_text =
      "the model's " + std::to_string(total_bytes) + " parameter bytes need at least " +
      std::to_string(need) + " stage(s) of at most the " + std::to_string(o.max_params_per_worker) +
      " bytes a worker may hold (parallel.max_params_per_worker, 4 bytes a parameter)";
  *lo = 1;
  *hi = uint32_t(std::min<size_t>(W, n));
  if (o.pipeline_stages) {
    const uint32_t N = o.pipeline_stages;
    if (N > n)
      return "pipeline_stages = " + std::to_string(N) + " but the model has only " +
             std::to_string(n) + " block(s)";
    if (N > W)
      return "pipeline_stages = " + std::to_string(N) + " but only " + std::to_string(W) +
             " worker(s)";
    if (need > N) return need_text + ", but pipeline_stages = " + std::to_string(N);
    *lo = *hi = N;
  } else if (need > *hi) {
    return need_text + ", but only " + std::to_string(W) + " worker(s) and " + std::to_string(n) +
           " block(s)";
  }
  *lo = std::max<uint32_t>(*lo, uint32_t(need));
  return "";
}

// The layout of pp stages (partitioned as `part`) and dp replicas, with its estimated step.
Plan layout(const Costs& c, const Partition& part, uint32_t pp, uint64_t dp, const PlanOptions& o) {
  const size_t n = c.cost.size();
  const double m = o.micro_batches, share = double((o.global_batch + dp - 1) / dp);
  Plan p;
  p.ok = true;
  p.dp = uint32_t(dp);
  p.pp = pp;
  p.num_blocks = uint32_t(n);
  p.stage_begin = part.begin;
  p.stage_cost.assign(pp, 0);
  p.stage_param_bytes.assign(pp, 0);
  for (uint32_t s = 0; s < pp; ++s) {
    const size_t end = s + 1 < pp ? part.begin[s + 1] : n;
    for (size_t i = part.begin[s]; i < end; ++i) {
      p.stage_cost[s] += c.cost[i];
      p.stage_param_bytes[s] += c.bytes[i];
    }
    p.stage_cost[s] *= share;
  }
  p.max_stage_cost = part.max_cost * share;
  p.step_cost = p.max_stage_cost * (m + pp - 1) / m;
  const uint64_t max_bytes =
      *std::max_element(p.stage_param_bytes.begin(), p.stage_param_bytes.end());
  if (c.seconds && o.allreduce_bytes_per_s > 0 && dp > 1)
    p.step_cost += 2.0 * double(dp - 1) / double(dp) * double(max_bytes) / o.allreduce_bytes_per_s;
  p.bubble = double(pp - 1) / (m + pp - 1);
  p.cost_in_seconds = c.seconds;
  return p;
}

std::string layout_reason(const Plan& p, uint32_t W) {
  const uint32_t used = p.workers_used();
  std::string begins;
  for (uint32_t b : p.stage_begin) begins += (begins.empty() ? "" : ",") + std::to_string(b);
  const std::string unit = p.cost_in_seconds ? " s" : " FLOPs";
  return "dp " + std::to_string(p.dp) + " x pp " + std::to_string(p.pp) + " = " +
         std::to_string(used) + " of " + std::to_string(W) + " worker(s) (" +
         std::to_string(W - used) + " standby); stages begin at blocks " + begins + "; max stage " +
         num(p.max_stage_cost) + unit + ", bubble " + num(p.bubble) + ", step " + num(p.step_cost) +
         unit;
}

}  // namespace

Plan plan_pipeline(uint32_t W, const std::vector<BlockCost>& blocks, const PlanOptions& o) {
  std::string why = check_options(W, blocks.size(), o);
  Costs c;
  if (why.empty()) why = block_costs(blocks, o, &c);
  if (!why.empty()) return fail(why);
  // Fewest stages the byte limit allows, whatever the cost.
  const Partitioner parts(c.cost, c.bytes, o.max_params_per_worker);
  const size_t need = parts.min_parts(std::numeric_limits<double>::infinity());
  uint32_t pp_lo = 0, pp_hi = 0;
  why = stage_range(W, blocks.size(), need, c.total_bytes, o, &pp_lo, &pp_hi);
  if (!why.empty()) return fail(why);

  Plan best;
  for (uint32_t pp = pp_lo; pp <= pp_hi; ++pp) {
    const Partition part = parts.solve(pp);
    if (!part.ok) continue;  // not reachable for pp >= need; kept as a guard
    for (uint64_t dp = std::min<uint64_t>(W / pp, o.global_batch); dp >= 1; --dp) {
      Plan p = layout(c, part, pp, dp, o);
      // Strictly better only: ties keep the earlier (smaller pp, then larger dp) layout.
      if (!best.ok || p.step_cost < best.step_cost - 1e-12 * best.step_cost) best = std::move(p);
    }
  }
  if (!best.ok) return fail("no layout fits (internal: no partition found)");
  best.reason = layout_reason(best, W);
  return best;
}

Placement placement_of_rank(const Plan& plan, uint32_t rank) {
  Placement p;
  if (!plan.ok || plan.pp == 0 || rank >= plan.workers_used()) return p;
  p.standby = false;
  p.stage = rank % plan.pp;
  p.replica = rank / plan.pp;
  return p;
}

uint32_t rank_of(const Plan& plan, uint32_t stage, uint32_t replica) {
  return replica * plan.pp + stage;
}

}  // namespace troupe::elastic
