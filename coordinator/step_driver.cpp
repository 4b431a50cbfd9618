#include "coordinator/step_driver.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <tuple>

namespace troupe::coordinator {

bool StepDriver::report(const actors::StepReport& r, uint64_t generation, size_t world) {
  if (r.rank >= world) {  // (no generation yet, or a worker's bug: it must not count)
    spdlog::warn("a step report of rank {} in a generation of {}: ignored", r.rank, world);
    return false;
  }
  if (r.step < committed_) return false;  // committed already (a report sent again)
  Pending& p = steps_[r.step];
  if (std::count(p.ranks.begin(), p.ranks.end(), r.rank)) return false;  // (sent again)
  p.ranks.push_back(r.rank);
  p.ranges.push_back({r.position_begin, r.position_end});
  p.loss = r.loss;
  p.samples += r.samples;
  p.tokens += r.tokens;
  p.seconds = std::max(p.seconds, r.seconds);
  p.busy += r.busy_seconds;
  p.data = std::max(p.data, r.data_seconds);
  if (r.eval_tokens > 0) {  // (every rank has the whole sum: any report will do)
    p.eval_loss = r.eval_loss;
    p.eval_tokens = r.eval_tokens;
  }
  p.flops += r.flops;
  p.epoch_samples = std::max(p.epoch_samples, r.epoch_samples);
  p.peak_flops += r.peak_flops;
  p.peak_unknown = p.peak_unknown || r.peak_flops <= 0;
  const std::pair<uint8_t, double> peak{r.peak_source, r.peak_flops};
  if (std::find(p.peaks.begin(), p.peaks.end(), peak) == p.peaks.end()) p.peaks.push_back(peak);
  p.rank_seconds.push_back(r.seconds);
  p.rank_busy.push_back(r.busy_seconds);
  last_reports_[r.rank] = {r.seconds,      r.busy_seconds,
                           r.data_seconds, std::chrono::steady_clock::now(),
                           generation,     r.step};
  // Steps commit in order: reports sent again to a coordinator that took over may complete a
  // later step first.
  bool any = false;
  for (auto it = steps_.find(committed_); it != steps_.end() && it->second.ranks.size() >= world;
       it = steps_.find(committed_)) {
    commit(committed_, false, generation, world);
    any = true;
  }
  return any;
}

bool StepDriver::start_generation(const elastic::GenerationStart& g, uint64_t generation,
                                  size_t world, const std::optional<std::string>& reload) {
  checksums_.clear();  // (a member's end counts in the generation it was sent in)
  for (uint64_t step = g.recover_from; step < g.recover_to; ++step)
    commit(step, /*recovered=*/true, generation, world);
  if (g.rolled_back) {
    // A pipeline stage without a replica was lost: everyone resumes from the stage backups (or
    // the state was lost: from the newest checkpoint). The steps since are redone; their ledger
    // lines go (they are written again when the steps commit again), so every sample is still
    // used once in the committed steps.
    Json e = Json()
                 .integer("from", long(g.start_step))
                 .integer("to", long(committed_))
                 .integer("generation", long(generation + 1));
    if (reload && !reload->empty()) e.str("checkpoint", *reload);
    if (reload && reload->empty()) e.boolean("seed", true);
    log_.event("steps_rolled_back", e);
    spdlog::warn("rolling back steps {}..{} to {}", g.start_step, committed_ - 1,
                 !reload           ? std::string("the stage backups")
                 : reload->empty() ? std::string("the job's seed")
                                   : "the checkpoint " + *reload);
    if (!log_.drop_ledger_from(g.start_step)) return false;
    committed_ = g.start_step;
  }
  // Reports of the old generation for steps from the start on are void: those steps are redone
  // (a pipeline stage may have applied and reported a step that others never finished).
  steps_.clear();
  return true;
}

// Per-rank figures of a step as a JSON array by rank (null for a rank that did not report).
nlohmann::ordered_json StepDriver::by_rank(const Pending& p, const std::vector<double>& v,
                                           size_t world) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t r = 0; r < world; ++r) out.push_back(nullptr);
  for (size_t i = 0; i < p.ranks.size() && i < v.size(); ++i)
    if (p.ranks[i] < world) out[p.ranks[i]] = v[i];
  return out;
}

namespace {
// The peaks' sources as a rank reports them (models::PeakSource).
const char* const kPeakSources[] = {
    "unknown", "cpu estimate (threads x f32 FLOP/cycle from CPUID x clock)",
    "GPU data sheet (dense, in the GEMM precision)", "observability.peak_tflops"};
constexpr uint8_t kCpuEstimate = 1;
}  // namespace

// A worker's peak as the coordinator can name it (each worker's log says how it was found).
std::string StepDriver::peak_text(const std::pair<uint8_t, double>& peak) {
  const char* source = peak.first < 4 ? kPeakSources[peak.first] : "unknown";
  if (peak.second <= 0) return std::string(source) + " peak";
  return fmt::format("{}, {:.4g} TFLOP/s each", source, peak.second / 1e12);
}

Utilisation StepDriver::utilisation_of(const Pending& p) {
  Utilisation u;
  const double seconds = std::max(p.seconds, 1e-9);
  u.model_tflops = p.flops / seconds / 1e12;
  if (p.ranks.empty()) return u;
  if (!p.peak_unknown) {
    u.peak_tflops = p.peak_flops / 1e12;
    u.mfu = p.flops / seconds / p.peak_flops;
  }
  // (Source 0 with no FLOPs: a rank without a model, a program's own loop: ElasticLoop.)
  if (p.flops <= 0) return u;
  const bool one_source = std::all_of(p.peaks.begin(), p.peaks.end(), [&](const auto& each) {
    return each.first == p.peaks.front().first;
  });
  if (p.peaks.size() == 1) {
    u.peak = std::to_string(p.ranks.size()) + " x " + peak_text(p.peaks.front());
  } else if (one_source && p.peaks.front().first == kCpuEstimate) {
    // (each process measures its core's clock: a few percent apart on one host)
    const auto [low, high] =
        std::minmax_element(p.peaks.begin(), p.peaks.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; });
    u.peak = fmt::format("{} x {}, {:.4g} to {:.4g} TFLOP/s each", p.ranks.size(),
                         kPeakSources[kCpuEstimate], low->second / 1e12, high->second / 1e12);
  } else {
    u.peak = "the sum of:";
    for (const auto& each : p.peaks) u.peak += " " + peak_text(each) + ";";
    u.peak.pop_back();
  }
  return u;
}

// Commits a step and writes its ledger lines. recovered: applied by some members of the old
// generation but not reported by all (the lost one among them).
void StepDriver::commit(uint64_t step, bool recovered, uint64_t generation, size_t world) {
  Pending p = steps_[step];
  steps_.erase(step);
  if (cfg_.ledger) write_ledger(step, p, recovered, generation);
  committed_ = step + 1;
  last_loss_ = p.loss;
  const double seconds = std::max(p.seconds, 1e-9);
  StepCommitted c{committed_,
                  p.loss,
                  p.samples / seconds,
                  p.tokens / seconds,
                  generation,
                  world,
                  std::vector<double>(world, std::nan(""))};
  for (size_t i = 0; i < p.ranks.size(); ++i)
    if (p.ranks[i] < world) c.compute_seconds[p.ranks[i]] = p.rank_busy[i];
  c.eval_tokens = p.eval_tokens;
  c.eval_loss = p.eval_loss;
  if (p.epoch_samples > 0) epoch_samples_ = p.epoch_samples;
  c.epoch = epoch();
  c.epoch_samples = epoch_samples_;
  log_.event("step_committed", Json()
                                   .integer("step", long(step))
                                   .num("loss", p.loss)
                                   .integer("samples", long(cfg_.global_batch))
                                   .integer("generation", long(generation))
                                   .integer("world_size", long(world)));
  if (p.eval_tokens > 0) evaluated(step, p.eval_loss, p.eval_tokens, world);
  const double idle = p.ranks.empty() ? 0.0 : 1.0 - p.busy / (double(p.ranks.size()) * seconds);
  Json metric = std::move(Json()
                              .integer("step", long(step))
                              .integer("generation", long(generation))
                              .num("loss", p.loss)
                              .num("step_seconds", p.seconds)
                              .num("idle_fraction", idle)
                              .num("data_seconds", p.data)
                              .num("samples_per_s", c.samples_per_s)
                              .num("tokens_per_s", c.tokens_per_s)
                              .integer("world_size", long(world))
                              .value("worker_step_seconds", by_rank(p, p.rank_seconds, world))
                              .value("worker_compute_seconds", by_rank(p, p.rank_busy, world)));
  if (p.eval_tokens > 0) metric.num("eval_loss", p.eval_loss);
  if (c.epoch > 0) metric.num("epoch", c.epoch);
  utilisation_ = utilisation_of(p);
  metric.num("model_flops", p.flops).num("model_tflops_per_s", utilisation_.model_tflops);
  if (!std::isnan(utilisation_.mfu))
    metric.num("mfu", utilisation_.mfu).num("peak_tflops_per_s", utilisation_.peak_tflops);
  if (!utilisation_.peak.empty()) metric.str("peak", utilisation_.peak);
  log_.metric(metric);
  if (on_commit_) on_commit_(c);
}

// One line per reporting member; for a recovered step the positions nobody reported were used
// by the members that did not report (they took part in the reduction) and go on one line
// under the first of them.
void StepDriver::write_ledger(uint64_t step, const Pending& p, bool recovered,
                              uint64_t generation) {
  using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
  auto line = [&](uint32_t rank, const Ranges& positions) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (auto [a, b] : positions) list.push_back({a, b});
    log_.ledger(Json()
                    .integer("step", long(step))
                    .integer("generation", long(generation))
                    .integer("member", rank)
                    .value("positions", std::move(list)));
  };
  for (size_t i = 0; i < p.ranks.size(); ++i) line(p.ranks[i], {p.ranges[i]});
  if (!recovered) return;
  const uint64_t B = uint64_t(cfg_.global_batch);
  Ranges ranges = p.ranges, gaps;
  std::sort(ranges.begin(), ranges.end());
  uint64_t at = step * B;
  for (auto [a, b] : ranges) {
    if (a > at) gaps.push_back({at, a});
    at = std::max(at, b);
  }
  if (at < (step + 1) * B) gaps.push_back({at, (step + 1) * B});
  uint32_t missing = 0;
  while (std::count(p.ranks.begin(), p.ranks.end(), missing)) ++missing;
  if (!gaps.empty()) line(missing, gaps);
}

void StepDriver::evaluated(uint64_t step, double loss, uint64_t tokens, size_t world) {
  log_.event("evaluated", Json()
                              .integer("step", long(step))
                              .num("loss", loss)
                              .integer("tokens", long(tokens))
                              .integer("world_size", long(world)));
}

std::optional<StepDriver::Outcome> StepDriver::done(const actors::WorkerDone& d, size_t world) {
  if (d.rank >= world) {  // (no generation yet, or a worker's bug: the job is not done)
    spdlog::warn("a worker's end of rank {} in a generation of {}: ignored", d.rank, world);
    return std::nullopt;
  }
  checksums_[d.rank] = {d.checksum, d.group};
  if (d.rank == 0) final_eval_ = {d.eval_loss, d.eval_tokens};
  if (checksums_.size() < world) return std::nullopt;
  Outcome o;
  std::tie(o.eval_loss, o.eval_tokens) = final_eval_;
  o.checksums = nlohmann::ordered_json::array();
  std::map<uint32_t, std::pair<uint32_t, uint64_t>> first;  // group -> (its first rank, its sum)
  for (auto& [rank, held] : checksums_) {
    const auto [sum, group] = held;
    o.checksums.push_back(fmt::format("{:016x}", sum));
    if (group == actors::kHoldsNoBlocks) continue;
    const auto [it, fresh] = first.emplace(group, std::pair{rank, sum});
    if (fresh || it->second.second == sum || !o.identical) continue;
    o.identical = false;
    o.differing = fmt::format(
        "ranks {} and {} ({})", it->second.first, rank,
        group == 0 ? "the whole model" : fmt::format("pipeline stage {}'s replicas", group - 1));
  }
  return o;
}

}  // namespace troupe::coordinator
