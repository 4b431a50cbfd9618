#include "coordinator/admin.h"

#include <algorithm>

namespace troupe::coordinator {

actors::JobStatus job_status(const JobConfig& cfg, const elastic::JobLifecycle& job,
                             const Roster& roster, const Generations& gens, const StepDriver& steps,
                             const std::string& plan) {
  actors::JobStatus s;
  s.job_name = cfg.name;
  s.state = elastic::phase_name(job.phase());
  s.generation = gens.current();
  s.step = steps.committed();
  s.steps = uint64_t(cfg.steps);
  s.last_loss = steps.last_loss();
  s.plan = plan;
  const auto& members = gens.members();
  for (uint32_t i = 0; i < members.size(); ++i) {
    const Agent& a = roster.at(members[i].worker.agent);
    s.members.push_back({i, a.id, a.pid, a.host, roster.device(members[i].worker), a.name});
  }
  for (actors::WorkerId w : roster.usable_workers()) {
    if (gens.is_member(w)) continue;
    const Agent& a = roster.at(w.agent);
    s.standbys.push_back({0, a.id, a.pid, a.host, roster.device(w), a.name});
  }
  return s;
}

std::vector<elastic::LiveAgent> live_agents(const Roster& roster, const Generations& gens) {
  std::vector<elastic::LiveAgent> out;
  for (const auto& a : roster.agents()) {
    if (!a.alive) continue;
    uint32_t workers = 0;
    for (uint32_t d = 0; d < a.devices.size(); ++d) workers += roster.usable({a.id, d});
    out.push_back({a.id, workers, gens.has_member_on(a.id)});
  }
  return out;
}

elastic::ScaleLimits scale_limits(const JobConfig& cfg, uint32_t min_workers) {
  elastic::ScaleLimits l;
  l.min_workers = min_workers;
  l.max_workers = uint32_t(cfg.max_workers);
  l.can_launch = cfg.launcher == "local";
  l.launcher = cfg.launcher;
  l.workers_per_agent = uint32_t(std::max<int64_t>(1, cfg.devices_per_agent));
  return l;
}

}  // namespace troupe::coordinator
