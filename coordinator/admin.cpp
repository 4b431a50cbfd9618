#include "coordinator/admin.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

namespace troupe::coordinator {

namespace {

// The local launcher's bound on a scale: CPU workers share the machine's cores, and more than this
// per core only slow each other down (a GPU worker is a process too).
constexpr uint32_t kWorkersPerCore = 8;

// dp and pp of a pipeline plan ("dp 2 x pp 3, stages ..."); {0, 0} without one.
std::pair<uint32_t, uint32_t> layout_of(const std::string& plan) {
  unsigned dp = 0, pp = 0;
  if (std::sscanf(plan.c_str(), "dp %u x pp %u", &dp, &pp) != 2) return {0, 0};
  return {dp, pp};
}

// A member's row: its rank's stage, and its last step report in this generation.
actors::MemberStatus member_row(uint32_t rank, const Agent& a, const std::string& device,
                                const StepDriver& steps, uint64_t generation,
                                std::pair<uint32_t, uint32_t> layout) {
  actors::MemberStatus m{rank, a.id, a.pid, a.host, device, a.name, -1, 0, 0, -1, 0, -1, ""};
  const auto [dp, pp] = layout;
  if (pp > 1 && rank < dp * pp) m.stage = int32_t(rank % pp);
  auto it = steps.last_reports().find(rank);
  if (it != steps.last_reports().end() && it->second.generation == generation) {
    m.step_seconds = it->second.step_seconds;
    m.compute_seconds = it->second.compute_seconds;
    m.data_seconds = it->second.data_seconds;
    m.last_report_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - it->second.at)
                           .count();
  }
  return m;
}

// What a member of the current generation is doing (MemberStatus::state).
std::string member_state(const actors::MemberStatus& m, actors::WorkerId w, const Roster& roster,
                         const Generations& gens, elastic::JobPhase phase,
                         std::pair<uint32_t, uint32_t> layout) {
  if (!roster.at(w.agent).alive) return "lost";
  if (gens.is_restarting(w)) return "restarting";
  if (!roster.usable(w)) return "given up";
  if (layout.second > 1 && m.rank >= layout.first * layout.second) return "idle";
  if (phase == elastic::JobPhase::paused) return "paused";
  return m.last_report_ms >= 0 ? "training" : "starting";
}

}  // namespace

actors::JobStatus job_status(const JobConfig& cfg, const elastic::JobLifecycle& job,
                             const Roster& roster, const Generations& gens, const StepDriver& steps,
                             const std::string& plan, const std::vector<uint32_t>& draining) {
  actors::JobStatus s;
  s.job_name = cfg.name;
  s.state = elastic::phase_name(job.phase());
  s.generation = gens.current();
  s.step = steps.committed();
  s.steps = uint64_t(cfg.steps);
  s.last_loss = steps.last_loss();
  s.epoch = steps.epoch();
  s.model_tflops = steps.utilisation().model_tflops;
  s.mfu = steps.utilisation().mfu;
  s.peak = steps.utilisation().peak;
  s.plan = plan;
  const auto layout = layout_of(plan);
  const auto& members = gens.members();
  for (uint32_t i = 0; i < members.size(); ++i) {
    const actors::WorkerId w = members[i].worker;
    s.members.push_back(
        member_row(i, roster.at(w.agent), roster.device(w), steps, gens.current(), layout));
    const bool leaving = std::count(draining.begin(), draining.end(), w.agent) > 0;
    s.members.back().state =
        leaving ? "draining" : member_state(s.members.back(), w, roster, gens, job.phase(), layout);
  }
  // (a worker outside the generation waits above elastic.max_workers, a standby, or for the
  // next generation to take it in: a restarted agent's while the job is paused)
  const bool full = cfg.max_workers > 0 && int64_t(members.size()) >= cfg.max_workers;
  for (actors::WorkerId w : roster.usable_workers()) {
    if (gens.is_member(w)) continue;
    const Agent& a = roster.at(w.agent);
    s.standbys.push_back({0, a.id, a.pid, a.host, roster.device(w), a.name, -1, 0, 0, -1, 0, -1,
                          full ? "standby" : "joining"});
  }
  // (and a live agent's worker given up outside it: a joiner whose worker failed for good; the
  // agent stays until it is drained or the job ends: it was listed nowhere)
  for (const Agent& a : roster.agents())
    for (uint32_t d = 0; a.alive && d < a.devices.size(); ++d)
      if (const actors::WorkerId w{a.id, d}; roster.given_up(w) && !gens.is_member(w))
        s.standbys.push_back(
            {0, a.id, a.pid, a.host, roster.device(w), a.name, -1, 0, 0, -1, 0, -1, "given up"});
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

elastic::ScaleLimits scale_limits(const JobConfig& cfg, uint32_t min_workers,
                                  const std::string& run_dir) {
  elastic::ScaleLimits l;
  l.min_workers = min_workers;
  l.max_workers = uint32_t(cfg.max_workers);
  l.can_launch = cfg.launcher == "local";
  l.launcher = cfg.launcher;
  if (cfg.external())
    l.joined_by = "another member of your program (troupe::ElasticLoop)";
  else if (!run_dir.empty())
    l.joined_by = "`troupe agent --join $(cat " + run_dir + "/coordinator.addr) --token-file " +
                  run_dir + "/job.token`";
  l.workers_per_agent = uint32_t(std::max<int64_t>(1, cfg.devices_per_agent));
  l.machine_cores = std::max(1u, std::thread::hardware_concurrency());
  l.machine_workers =
      std::max<uint32_t>(kWorkersPerCore * l.machine_cores, uint32_t(cfg.workers()));
  return l;
}

}  // namespace troupe::coordinator
