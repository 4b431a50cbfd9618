#include "elastic/scaling.h"

#include <algorithm>

namespace troupe::elastic {

uint32_t usable_workers(const std::vector<LiveAgent>& agents) {
  uint32_t n = 0;
  for (const auto& a : agents) n += a.workers;
  return n;
}

namespace {

// by[s] for s in [0, total]: the agent (its index in `order`) that first made a drained sum of s
// workers from agents before it, -1 for s = 0, -2 where no set of agents holds s.
std::vector<int> drained_sums(const std::vector<const LiveAgent*>& order, uint32_t total) {
  std::vector<int> by(total + 1, -2);
  by[0] = -1;
  for (size_t i = 0; i < order.size(); ++i)
    for (uint32_t s = total; s >= order[i]->workers && order[i]->workers > 0; --s)
      if (by[s] == -2 && by[s - order[i]->workers] != -2) by[s] = int(i);
  return by;
}

// Agents holding exactly `drained` workers in all, the earliest in `order` (the preferred) where
// there is a choice; empty when no set does.
std::vector<uint32_t> exact_drain(const std::vector<const LiveAgent*>& order,
                                  const std::vector<int>& by, uint32_t drained) {
  if (by[drained] == -2) return {};
  std::vector<size_t> picked;
  for (uint32_t s = drained; s > 0; s -= order[size_t(by[s])]->workers) picked.push_back(by[s]);
  std::sort(picked.begin(), picked.end());
  std::vector<uint32_t> ids;
  for (size_t i : picked) ids.push_back(order[i]->id);
  return ids;
}

// Why draining whole agents cannot leave n of the `have` workers, with the sizes nearest n that
// it can leave (within the limits).
std::string unreachable_size(uint32_t n, uint32_t have, size_t agents, const std::vector<int>& by,
                             const ScaleLimits& lim) {
  auto can = [&](uint32_t k) { return by[have - k] != -2; };  // (k workers left)
  std::string nearest;
  for (uint32_t k = n; k-- > std::max<uint32_t>(lim.min_workers, 1);)
    if (can(k)) {
      nearest = std::to_string(k);
      break;
    }
  for (uint32_t k = n + 1; k < have && (lim.max_workers == 0 || k <= lim.max_workers); ++k)
    if (can(k)) {
      nearest += (nearest.empty() ? "" : " or ") + std::to_string(k);
      break;
    }
  return "no set of agents leaves exactly " + std::to_string(n) +
         " worker(s): an agent leaves with all its workers (" + std::to_string(have) + " in " +
         std::to_string(agents) + " agents)" +
         (nearest.empty() ? std::string() : "; the nearest sizes: " + nearest);
}

}  // namespace

ScaleDecision decide_scale(uint32_t n, const std::vector<LiveAgent>& agents, const ScaleLimits& lim,
                           uint32_t starting) {
  ScaleDecision d;
  auto invalid = [&](std::string why) {
    d.kind = ScaleDecision::Kind::invalid;
    d.reason = std::move(why);
    return d;
  };
  if (n < lim.min_workers)
    return invalid(std::to_string(n) +
                   " worker(s) is fewer than the job needs: " + std::to_string(lim.min_workers) +
                   " (elastic.min_workers, or a pipeline's stages: parallel.pipeline_stages, "
                   "parallel.max_params_per_worker)");
  if (lim.max_workers > 0 && n > lim.max_workers)
    return invalid(std::to_string(n) + " worker(s) is more than elastic.max_workers = " +
                   std::to_string(lim.max_workers));
  const uint32_t have = usable_workers(agents);
  if (starting > 0 && n < have + starting) {
    d.kind = ScaleDecision::Kind::refuse;
    d.reason = std::to_string(starting) + " worker(s) the launcher started have not joined yet (" +
               std::to_string(have) + " have): ask again once they have (troupe status)";
    return d;
  }
  if (n == have + starting) {
    d.reason = "the job has " + std::to_string(have) + " worker(s)" +
               (starting ? " and " + std::to_string(starting) + " starting" : std::string());
    return d;  // nothing
  }
  if (n > have) {
    if (!lim.can_launch)  // (never, not "not now": exit 2, as another size it cannot reach)
      return invalid("cluster.launcher is \"" + lim.launcher + "\": add workers with " +
                     lim.joined_by + "; the job has " + std::to_string(have) + " worker(s)");
    if (lim.machine_workers > 0 && n > lim.machine_workers)
      return invalid(
          std::to_string(n) + " worker(s) is more than this machine can run: the local " +
          "launcher starts every agent here, which has " + std::to_string(lim.machine_cores) +
          " core(s) (at most " + std::to_string(lim.machine_workers) +
          " workers); other machines join with `troupe agent --join`");
    const uint32_t per = lim.workers_per_agent ? lim.workers_per_agent : 1;
    const uint32_t now = have + starting, below = n - (n - now) % per;
    if (below != n) {  // (it went to the size above, saying it would start "1 agent(s)")
      d.kind = ScaleDecision::Kind::refuse;
      d.reason = std::to_string(n) + " worker(s) is not a size the launcher's agents of " +
                 std::to_string(per) + " workers (cluster.devices_per_agent) reach from " +
                 std::to_string(now) + ": ask for " +
                 (below > now ? std::to_string(below) + " or " : std::string()) +
                 std::to_string(below + per);
      return d;
    }
    d.kind = ScaleDecision::Kind::launch;
    d.agents_to_launch = (n - now) / per;
    return d;
  }
  // Shrink: standbys first, then members, newest first.
  std::vector<const LiveAgent*> order;
  for (bool members : {false, true})
    for (auto it = agents.rbegin(); it != agents.rend(); ++it)
      if (it->member == members) order.push_back(&*it);
  uint32_t left = have;
  for (const LiveAgent* a : order) {
    if (left <= n) break;
    if (left - a->workers < n) continue;  // would go below the target: try a smaller agent
    d.drain.push_back(a->id);
    left -= a->workers;
  }
  std::vector<int> by;
  if (left !=
      n) {  // (the greedy choice missed n: an exact set, if agents of several workers have one)
    by = drained_sums(order, have);
    d.drain = exact_drain(order, by, have - n);
  }
  if (left != n && d.drain.empty()) {
    d.kind = ScaleDecision::Kind::refuse;
    d.reason = unreachable_size(n, have, agents.size(), by, lim);
  } else if (!d.drain.empty()) {
    d.kind = ScaleDecision::Kind::drain;
  }
  return d;
}

ScaleDecision decide_drain(uint32_t id, const std::vector<LiveAgent>& agents,
                           const ScaleLimits& lim) {
  ScaleDecision d;
  const LiveAgent* found = nullptr;
  for (const auto& a : agents)
    if (a.id == id) found = &a;
  if (!found) {
    d.kind = ScaleDecision::Kind::invalid;
    d.reason = "no live agent " + std::to_string(id);
  } else if (usable_workers(agents) - found->workers < lim.min_workers) {
    d.kind = ScaleDecision::Kind::refuse;
    d.reason =
        "draining it would leave fewer workers than the job needs (elastic.min_workers, "
        "parallel.pipeline_stages)";
  } else {
    d.kind = ScaleDecision::Kind::drain;
    d.drain = {id};
  }
  return d;
}

}  // namespace troupe::elastic
