// What a run directory's events.jsonl says about a job, for a coordinator that takes over a run
// whose coordinator was lost (`troupe run --resume RUN_DIR` while its agents may still be alive):
// the generation it had reached (the next one continues the numbering, so the agents' workers,
// which publish for it, are not told to skip one), that generation's size (its members' step
// reports may still come: the agents send again what the lost coordinator may not have written),
// the steps committed (after any rollback), the learning rate by step, whether it ended, and the
// agents it had (a take-over waits only for those that may come back).
//
// Why from the run directory and not from the agents: the run directory is what was committed
// (the ledger and the losses are written there before anything else happens), it exists when no
// agent is left, and one reader serves both outcomes (agents adopted, or a resume from the
// checkpoint). The agents add what the directory cannot know: how far they got since (their
// holdings and their step reports).
//
// Pure: lines in, a record out; no I/O.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace troupe::coordinator {

// An agent's process as a member_joined event names it.
struct AgentProcess {
  std::string host_identity;  // comm::host_identity() ("": an older Troupe's agent, unknown)
  uint32_t pid = 0;
  bool operator==(const AgentProcess& o) const {
    return host_identity == o.host_identity && pid == o.pid;
  }
};

struct RunRecord {
  bool started = false;                // job_started was written
  bool ended = false;                  // the newest run's job_finished or job_failed was
  uint64_t generation = 0;             // the newest run's newest generation_started
  uint64_t world_size = 0;             // ... its size
  uint64_t committed = 0;              // steps committed, after rollbacks
  std::map<uint64_t, double> lr_from;  // lr_changed: from this step, this learning rate
  std::string resumed_from;            // the checkpoint directory it last went on from ("" none)
  std::vector<AgentProcess> agents;    // every agent that joined since the last run ended, once
};

// Lines that are not JSON objects (a line cut short by a crash) are passed over.
RunRecord read_run_record(const std::vector<std::string>& event_lines);

// Whether a coordinator that took the run over still waits for some agent of `record` to come
// back: one not `back` (it joined again) and not known to be gone, which only a process on this
// host (`here`, comm::host_identity(), whole: a boot id and a pid namespace) can be (`gone`, e.g.
// comm::process_gone). A pid taken by another process since, or an agent of another host, is
// waited for: its failure timeout and a poll of coordinator.addr bound that.
bool may_come_back(const std::vector<AgentProcess>& record, const std::vector<AgentProcess>& back,
                   const std::string& here, const std::function<bool(uint32_t)>& gone);

}  // namespace troupe::coordinator
