#include "coordinator/run_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "comm/host_identity.h"

namespace troupe::coordinator {

RunRecord read_run_record(const std::vector<std::string>& event_lines) {
  RunRecord r;
  for (const auto& line : event_lines) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("event") || !j["event"].is_string()) continue;
    const std::string event = j["event"].get<std::string>();
    auto number = [&](const char* key) {
      return j.contains(key) && j[key].is_number_unsigned() ? j[key].get<uint64_t>() : 0;
    };
    // Each troupe run of the directory (a resume, a take-over) starts with job_started: the
    // newest one's end counts, not an earlier run's that it resumed.
    if (event == "job_started") r.started = true, r.ended = false;
    // (An ended run's agents were shut down with it: none comes back to a later take-over.)
    if (event == "job_finished" || event == "job_failed") r.ended = true, r.agents.clear();
    // (A resume numbers its generations afresh; a take-over numbers on from the lost one's.)
    if (event == "resumed_from_checkpoint") r.generation = r.world_size = 0;
    if (event == "generation_started") {
      r.generation = std::max(r.generation, number("generation"));
      r.world_size = number("world_size");
    }
    if (event == "step_committed") r.committed = std::max(r.committed, number("step") + 1);
    if (event == "steps_rolled_back") r.committed = number("from");
    if (event == "resumed_from_checkpoint") {
      r.committed = number("step");
      if (j.contains("checkpoint") && j["checkpoint"].is_string())
        r.resumed_from = j["checkpoint"].get<std::string>();
    }
    if (event == "member_joined" && number("pid") > 0) {
      AgentProcess p{j.contains("host_identity") && j["host_identity"].is_string()
                         ? j["host_identity"].get<std::string>()
                         : "",
                     uint32_t(number("pid"))};
      if (std::find(r.agents.begin(), r.agents.end(), p) == r.agents.end()) r.agents.push_back(p);
    }
    if (event == "lr_changed" && j.contains("lr") && j["lr"].is_number()) {
      // (As the coordinator schedules it: a rate asked for replaces the changes after its step,
      // ones a rollback kept for the steps it redoes.)
      r.lr_from.erase(r.lr_from.upper_bound(number("step")), r.lr_from.end());
      r.lr_from[number("step")] = j["lr"].get<double>();
    }
  }
  return r;
}

bool may_come_back(const std::vector<AgentProcess>& record, const std::vector<AgentProcess>& back,
                   const std::string& here, const std::function<bool(uint32_t)>& gone) {
  for (const auto& p : record) {
    if (std::find(back.begin(), back.end(), p) != back.end()) continue;
    if (!comm::whole_host_identity(p.host_identity) || p.host_identity != here || !gone(p.pid))
      return true;
  }
  return false;
}

}  // namespace troupe::coordinator
