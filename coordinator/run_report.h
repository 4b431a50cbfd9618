// `troupe report RUN_DIR`: one self-contained HTML file (inline SVG, no script, nothing fetched)
// with what a run directory holds: the loss, throughput, step time and compute time per worker,
// the idle fraction, a membership timeline (world size over time, with failures, joins, leaves,
// rollbacks, stragglers and checkpoints marked) and the recovery time of each change. It reads
// events.jsonl and metrics.jsonl only, line by line, skipping a line that does not parse (a
// running job's last line may be half written), so it works on a running job's directory too.
//
// Thread-safety: plain functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace troupe::coordinator {

// Per-worker series: at most this many ranks are read and drawn.
constexpr size_t kMostRanksDrawn = 1024;

struct RunReport {
  std::string job, state = "running";  // state: completed | stopped | failed | running
  bool started = false;                // a job_started event was read
  std::string run_dir, trained;        // where, and what it trained (its config's model and data)
  std::string failure;                 // failed: why (its job_failed event's reason)
  double start_ts = 0, end_ts = 0;     // unix seconds (end: the last line's)
  double between_runs_s = 0;           // without a coordinator: from one run's end to a resume
  uint64_t steps = 0, planned_steps = 0;
  struct Point {
    double x = 0, y = 0;
  };
  std::vector<Point> loss, samples_per_s, idle;  // by step
  std::vector<Point> eval_loss;                  // by step: `evaluated` events (step, loss)
  std::vector<std::vector<Point>> worker_step_ms, worker_compute_ms;  // by rank, by step
  std::vector<Point> world_size;                                      // by seconds since start
  struct Mark {
    double t = 0;      // seconds since start
    std::string kind;  // failure | join | leave | rollback | straggler | checkpoint
    std::string text;  // for the tooltip and the table
  };
  std::vector<Mark> marks;
  struct Change {
    double t = 0;                  // seconds since start: its first sign
    std::string what;              // the event that started it
    double recovery_s = -1;        // to the next commit of a newer generation; -1: none yet
    double without_commit_s = -1;  // from the last commit before it to that one; -1: none yet
  };
  std::vector<Change> changes;
};

// Reads RUN_DIR/events.jsonl and metrics.jsonl. Throws std::runtime_error naming the file when
// there is no events.jsonl (not a run directory).
RunReport read_run(const std::string& run_dir);

// The HTML page.
std::string render_report(const RunReport& r);

}  // namespace troupe::coordinator
