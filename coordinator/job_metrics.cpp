#include "coordinator/job_metrics.h"

#include <cmath>

namespace troupe::coordinator {
namespace {

using json = nlohmann::ordered_json;

double number(const json& j, const char* key, double otherwise = 0) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : otherwise;
}

// A sample value as Prometheus reads it (Go's float syntax; NaN and ±Inf spelled its way).
std::string value_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 9e15) return std::to_string(int64_t(v));
  return nlohmann::json(v).dump();  // the shortest text that reads back as v
}

// A label value, escaped as the text format says (backslash, double quote, line feed).
std::string label_text(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

// One metric family: its HELP and TYPE lines, then its samples.
struct Family {
  std::string& out;
  Family(std::string& o, const std::string& name, const char* type, const char* help) : out(o) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    name_ = name;
  }
  Family& sample(double v, const std::string& labels = "") {
    out += name_ + (labels.empty() ? "" : "{" + labels + "}") + " " + value_text(v) + "\n";
    return *this;
  }
  std::string name_;
};

}  // namespace

JobMetrics::JobMetrics(std::string job_name) : job_(std::move(job_name)) {}

void JobMetrics::record(const json& line) {
  if (!line.is_object()) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = line.find("event");
  if (it != line.end() && it->is_string())
    on_event(it->get<std::string>(), line);
  else if (line.contains("step_seconds"))
    on_step_metric(line);
}

void JobMetrics::on_event(const std::string& name, const json& e) {
  const double ts = number(e, "ts");
  changes_.event(name, ts, number(e, "member", -1), name);
  if (name == "job_started") {
    steps_ = number(e, "steps");
    started_ts_ = ts;
  } else if (name == "resumed_from_checkpoint") {
    step_ = number(e, "step");
  } else if (name == "step_committed") {
    const double gen = number(e, "generation");
    step_ = number(e, "step") + 1;
    loss_ = number(e, "loss");
    world_size_ = number(e, "world_size");
    last_commit_ts_ = ts;
    ++commits_;
    if (const auto ended = changes_.commit(ts, gen)) {
      recovery_seconds_ = ended->seconds;
      without_commit_seconds_ = ended->without_commit_seconds;
    }
  } else if (name == "generation_started") {
    ++generations_;
    generation_ = number(e, "generation");
    world_size_ = number(e, "world_size");
  } else if (name == "member_failed" || name == "worker_failed") {
    ++failures_;
    if (name == "worker_failed" && e.value("restarting", false)) ++restarts_;
  } else if (name == "agent_restarted") {
    ++restarts_;
  } else if (name == "member_joined") {
    ++joins_;
  } else if (name == "member_left") {
    ++leaves_;
  } else if (name == "steps_rolled_back") {
    ++rollbacks_;
  } else if (name == "checkpoint_written") {
    ++checkpoints_;
    checkpoint_step_ = number(e, "step");
    checkpoint_blocking_ = number(e, "blocking_seconds");
    checkpoint_write_ = number(e, "write_seconds");
  } else if (name == "checkpoint_failed") {
    ++checkpoint_failures_;
  } else if (name == "evaluated") {
    eval_loss_ = number(e, "loss");
    eval_step_ = number(e, "step");
  } else if (name == "straggler") {
    ++stragglers_;
  } else if (name == "job_paused") {
    paused_ = 1;
  } else if (name == "job_resumed") {
    paused_ = 0;
  }
}

void JobMetrics::on_step_metric(const json& m) {
  step_seconds_ = number(m, "step_seconds");
  idle_ = number(m, "idle_fraction");
  data_seconds_ = number(m, "data_seconds");
  samples_per_s_ = number(m, "samples_per_s");
  tokens_per_s_ = number(m, "tokens_per_s");
  model_tflops_ = number(m, "model_tflops_per_s");
  mfu_ = number(m, "mfu", std::nan(""));
  epoch_ = number(m, "epoch");
  auto by_rank = [&](const char* key, std::vector<double>& out) {
    out.clear();
    auto it = m.find(key);
    if (it == m.end() || !it->is_array()) return;
    for (const auto& v : *it) out.push_back(v.is_number() ? v.get<double>() : std::nan(""));
  };
  by_rank("worker_step_seconds", worker_step_seconds_);
  by_rank("worker_compute_seconds", worker_compute_seconds_);
}

void JobMetrics::set_members(uint32_t members, uint32_t standbys) {
  std::lock_guard<std::mutex> lock(mu_);
  members_ = members;
  standbys_ = standbys;
}

void JobMetrics::set_frames(uint64_t received, const std::map<std::string, uint64_t>& rejected) {
  std::lock_guard<std::mutex> lock(mu_);
  frames_received_ = received;
  rejected_ = rejected;
}

std::string JobMetrics::exposition() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  auto gauge = [&](const char* name, const char* help, double v) {
    Family(o, std::string("troupe_") + name, "gauge", help).sample(v);
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    Family(o, std::string("troupe_") + name + "_total", "counter", help).sample(double(v));
  };
  Family(o, "troupe_job_info", "gauge", "The job (value 1), named by its job.name.")
      .sample(1, "name=\"" + label_text(job_) + "\"");
  gauge("job_start_time_seconds", "When the job started (unix seconds).", started_ts_);
  gauge("step", "Committed steps: the next step to run.", step_);
  gauge("steps", "The steps the job runs (job.steps).", steps_);
  gauge("loss", "The loss of the last committed step (NaN: none yet).", loss_);
  gauge("epoch",
        "Epochs of the data set the committed steps drew: samples over its samples an epoch (0: "
        "not known).",
        epoch_);
  gauge("last_commit_time_seconds",
        "When the last step was committed (unix seconds; 0: none yet). Alert when it stalls.",
        last_commit_ts_);
  gauge("samples_per_second", "Samples a second over the last committed step.", samples_per_s_);
  gauge("tokens_per_second", "Tokens a second over the last committed step.", tokens_per_s_);
  gauge("model_tflops_per_second",
        "The model's training TFLOP/s over the last committed step (every worker's).",
        model_tflops_);
  gauge("mfu",
        "Model FLOPs utilisation of the last committed step: model FLOP/s over the members' peak "
        "(metrics.jsonl names the peak; NaN: a peak is unknown).",
        mfu_);
  gauge("step_seconds", "The last committed step's time (its slowest worker).", step_seconds_);
  gauge("data_seconds",
        "The last committed step's time assembling batches (its slowest worker; part of compute).",
        data_seconds_);
  gauge("idle_fraction", "1 - compute time / step time over the workers, last committed step.",
        idle_);
  auto by_rank = [&](const char* name, const char* help, const std::vector<double>& v) {
    Family f(o, std::string("troupe_") + name, "gauge", help);
    for (size_t r = 0; r < v.size(); ++r) f.sample(v[r], "rank=\"" + std::to_string(r) + "\"");
  };
  by_rank("worker_step_seconds", "The last committed step's time on each worker, by rank.",
          worker_step_seconds_);
  by_rank("worker_compute_seconds",
          "The last committed step's compute time (forward, backward) on each worker, by rank.",
          worker_compute_seconds_);
  gauge("world_size", "Workers in the current generation.", world_size_);
  gauge("generation", "The current membership generation.", generation_);
  Family(o, "troupe_members", "gauge", "Live workers by state.")
      .sample(members_, "state=\"member\"")
      .sample(standbys_, "state=\"standby\"");
  gauge("paused", "1 while the job waits below elastic.min_workers.", paused_);
  gauge("recovery_seconds",
        "The last membership change: from its first sign (a failure once detected) to the next "
        "committed step.",
        recovery_seconds_);
  gauge("recovery_without_commit_seconds",
        "The last membership change: the time without a committed step that ended with it "
        "(what training lost, a failure's detection included).",
        without_commit_seconds_);
  counter("failures", "Members and workers lost or failed.", failures_);
  counter("joins", "Agents that joined (the first ones included).", joins_);
  counter("leaves", "Agents that left (drained).", leaves_);
  counter("restarts", "Workers and agent processes restarted.", restarts_);
  counter("rollbacks", "Rollbacks to the stage backups or to a checkpoint (steps redone).",
          rollbacks_);
  counter("generations", "Generations started.", generations_);
  counter("stragglers",
          "Workers found computing much slower than the others (elastic.straggler_*).",
          stragglers_);
  counter("checkpoints", "Checkpoints written (manifest durable).", checkpoints_);
  counter("checkpoint_failures", "Checkpoints that could not be written.", checkpoint_failures_);
  gauge("checkpoint_step", "The newest checkpoint's step (0: none).", checkpoint_step_);
  gauge("eval_loss", "The last evaluation's held-out loss (NaN: none yet).", eval_loss_);
  gauge("eval_step", "The step of the parameters it evaluated.", eval_step_);
  gauge("checkpoint_blocking_seconds",
        "Training blocked while the last checkpoint's state was copied.", checkpoint_blocking_);
  gauge("checkpoint_write_seconds", "The last checkpoint's background write.", checkpoint_write_);
  counter("control_frames_received", "Control-plane frames the coordinator received.",
          frames_received_);
  Family rj(o, "troupe_control_frames_rejected_total", "counter",
            "Control-plane frames the coordinator refused, by reason.");
  for (const auto& [reason, n] : rejected_)
    rj.sample(double(n), "reason=\"" + label_text(reason) + "\"");
  return o;
}

}  // namespace troupe::coordinator
