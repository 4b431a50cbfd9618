// The step driver: collects the members' step reports, commits a step when every member has
// reported it (events.jsonl step_committed, metrics.jsonl, ledger.jsonl), recovers or rolls back
// steps at a generation's start (elastic::GenerationStart says which), and compares the members'
// parameter checksums at the end.
//
// Ledger lines are written only at commit: a step reported by some members and then redone is
// never in the ledger twice.
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/job_protocol.h"
#include "coordinator/config.h"
#include "coordinator/events.h"
#include "elastic/generation.h"

namespace troupe::coordinator {

// The model FLOP/s of a committed step and its MFU: the model's training FLOPs (every rank's)
// over the step's time, and that over the sum of the members' peaks (NaN: a peak is unknown).
struct Utilisation {
  double model_tflops = 0;
  double mfu = std::nan("");
  double peak_tflops = 0;
  std::string peak;  // what the peak is: "2 x <a worker's peak>" (or each, when they differ)
};

struct StepCommitted {
  uint64_t committed = 0;  // steps committed so far
  double loss = 0, samples_per_s = 0, tokens_per_s = 0;
  uint64_t generation = 0, world_size = 0;
  std::vector<double> compute_seconds;  // by rank (NaN: it did not report)
  uint64_t eval_tokens = 0;             // held out, evaluated before this step (0: none) ...
  double eval_loss = 0;                 // ... and their loss
  double epoch = 0;                     // epochs trained (0: the data set's size unknown) ...
  uint64_t epoch_samples = 0;           // ... of this many samples an epoch
};

class StepDriver {
 public:
  // on_commit: after every committed step (recovered ones too).
  StepDriver(RunLog& log, const JobConfig& config,
             std::function<void(const StepCommitted&)> on_commit)
      : log_(log), cfg_(config), on_commit_(std::move(on_commit)) {}

  uint64_t committed() const { return committed_; }
  // Epochs of the data set the committed steps drew (0: its size not known yet): the samples
  // drawn over the samples of an epoch (a mix's: all its sets' windows).
  double epoch() const {
    return epoch_samples_ == 0
               ? 0
               : double(committed_) * double(cfg_.global_batch) / double(epoch_samples_);
  }
  // A job resumed from a checkpoint of `step`: steps before it are committed (by the run that
  // wrote it); the ledger's lines of later steps go (they are redone). False if the ledger could
  // not be rewritten.
  bool resume_at(uint64_t step) {
    committed_ = step;
    return log_.drop_ledger_from(step);
  }
  // A coordinator taking over a run whose coordinator was lost: `step` steps are committed
  // (coordinator/run_record.h); what comes next (reports sent again, the first generation's
  // recovery or rollback) goes on from there. Ledger lines of later steps go: the lost one may
  // have written a step's lines and not its commit (the reports sent again commit it once).
  // False if the ledger could not be rewritten.
  bool continue_at(uint64_t step) {
    committed_ = step;
    return log_.drop_ledger_from(step);
  }
  double last_loss() const { return last_loss_; }
  const Utilisation& utilisation() const { return utilisation_; }  // of the last committed step

  // A report of the current generation (of `world` members); true when it completed a step
  // (steps commit in order). A report of a step committed already, or sent again, is dropped.
  bool report(const actors::StepReport& r, uint64_t generation, size_t world);

  // Each rank's last report in the current generation (troupe status --watch).
  struct RankReport {
    double step_seconds = 0, compute_seconds = 0, data_seconds = 0;
    std::chrono::steady_clock::time_point at;
    uint64_t generation = 0;
    uint64_t step = 0;  // the step it reported
  };
  const std::map<uint32_t, RankReport>& last_reports() const { return last_reports_; }

  // The generation after `generation` (of `world` members) starts as g says: steps the old one
  // completed are committed (recovered), or the steps since a rollback's start are dropped from
  // the ledger (`reload`: the checkpoint the rollback reloads, "" the job's seed; none: the stage
  // backups). Reports of the old generation are void from here. False: the ledger could not be
  // rewritten (the caller fails the job: it would show those steps twice).
  bool start_generation(const elastic::GenerationStart& g, uint64_t generation, size_t world,
                        const std::optional<std::string>& reload = std::nullopt);

  // A member finished with a checksum; once all `world` have: whether those of each group
  // (WorkerDone::group: members holding the same blocks) agree, and the list.
  struct Outcome {
    bool identical = true;
    std::string differing;             // when not: "ranks 0 and 2 (the whole model)"
    nlohmann::ordered_json checksums;  // hex strings, by rank
    double eval_loss = 0;              // the final parameters' held-out loss (rank 0's) ...
    uint64_t eval_tokens = 0;          // ... over these tokens (0: not evaluated)
  };
  std::optional<Outcome> done(const actors::WorkerDone& d, size_t world);
  // Whether rank's WorkerDone of this generation came.
  bool ended(uint32_t rank) const { return checksums_.count(rank) > 0; }
  // The `evaluated` event: the held-out loss of the parameters after `step` steps.
  void evaluated(uint64_t step, double loss, uint64_t tokens, size_t world);

 private:
  struct Pending {
    std::vector<uint32_t> ranks;                        // that reported
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // their sample positions, [begin, end)
    double loss = 0, seconds = 0;
    double busy = 0;  // summed over the reporting ranks
    double data = 0;  // the slowest rank's batch assembly
    uint64_t samples = 0, tokens = 0;
    std::vector<double> rank_seconds, rank_busy;  // by report (ranks[i])
    double eval_loss = 0;  // the held-out loss at the step's start, when it evaluated
    uint64_t eval_tokens = 0;
    double flops = 0, peak_flops = 0;               // summed over the reporting ranks
    uint64_t epoch_samples = 0;                     // the data set's (0: unknown)
    bool peak_unknown = false;                      // a rank's peak is unknown
    std::vector<std::pair<uint8_t, double>> peaks;  // (source, a rank's peak), each once
  };
  static Utilisation utilisation_of(const Pending& p);
  static std::string peak_text(const std::pair<uint8_t, double>& peak);
  static nlohmann::ordered_json by_rank(const Pending& p, const std::vector<double>& v,
                                        size_t world);
  void commit(uint64_t step, bool recovered, uint64_t generation, size_t world);
  void write_ledger(uint64_t step, const Pending& p, bool recovered, uint64_t generation);

  RunLog& log_;
  const JobConfig& cfg_;
  std::function<void(const StepCommitted&)> on_commit_;
  std::map<uint64_t, Pending> steps_;
  std::map<uint32_t, std::pair<uint64_t, uint32_t>> checksums_;  // rank -> (checksum, group)
  std::pair<double, uint64_t> final_eval_{0, 0};                 // rank 0's (loss, tokens)
  std::map<uint32_t, RankReport> last_reports_;
  uint64_t committed_ = 0;
  uint64_t epoch_samples_ = 0;  // the data set's samples an epoch, as the members report it
  double last_loss_ = 0;
  Utilisation utilisation_;
};

}  // namespace troupe::coordinator
