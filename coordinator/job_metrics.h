// The job's numbers for a Prometheus scrape (observability.metrics_listen): what the coordinator
// writes to events.jsonl and metrics.jsonl, folded as it is written (RunLog::observe) into
// gauges and counters, plus what only the coordinator's actor knows (members by state, the
// control plane's rejected frames). exposition() renders the Prometheus text format (0.0.4):
// names `troupe_*`, units in the names (`_seconds`, `_per_second`), counters end in `_total`.
//
// Thread-safety: every member function may be called from any thread (the coordinator's actor
// records, the HTTP server's threads render).
#pragma once

#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/change_watch.h"

namespace troupe::coordinator {

class JobMetrics {
 public:
  explicit JobMetrics(std::string job_name);

  // One line of events.jsonl (it has "event") or of metrics.jsonl.
  void record(const nlohmann::ordered_json& line);
  void set_members(uint32_t members, uint32_t standbys);
  // The control plane's rejected frames by reason (malformed, wrong_job, stale, ...), and the
  // frames received in all.
  void set_frames(uint64_t received, const std::map<std::string, uint64_t>& rejected);

  std::string exposition() const;

 private:
  void on_event(const std::string& name, const nlohmann::ordered_json& e);
  void on_step_metric(const nlohmann::ordered_json& m);

  mutable std::mutex mu_;
  std::string job_;
  // gauges
  double step_ = 0, steps_ = 0, samples_per_s_ = 0, tokens_per_s_ = 0;
  double loss_ = std::nan("");  // (none yet: not a loss of 0 on a dashboard)
  double model_tflops_ = 0, mfu_ = std::nan("");
  double epoch_ = 0;
  double step_seconds_ = 0, idle_ = 0, world_size_ = 0, generation_ = 0, data_seconds_ = 0;
  double last_commit_ts_ = 0, recovery_seconds_ = 0, checkpoint_step_ = 0;
  double without_commit_seconds_ = 0;
  double checkpoint_blocking_ = 0, checkpoint_write_ = 0;
  double eval_loss_ = std::nan(""), eval_step_ = 0;
  double members_ = 0, standbys_ = 0, paused_ = 0, started_ts_ = 0;
  std::vector<double> worker_step_seconds_, worker_compute_seconds_;  // by rank, last step
  // counters
  uint64_t failures_ = 0, joins_ = 0, restarts_ = 0, rollbacks_ = 0, generations_ = 0;
  uint64_t checkpoints_ = 0, checkpoint_failures_ = 0, leaves_ = 0, commits_ = 0, stragglers_ = 0;
  uint64_t frames_received_ = 0;
  std::map<std::string, uint64_t> rejected_;
  ChangeWatch changes_;  // recovery: from a change's first sign to a newer generation's commit
};

}  // namespace troupe::coordinator
