#include "coordinator/run_report.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "coordinator/change_watch.h"
#include "coordinator/config.h"
#include "coordinator/events.h"

namespace troupe::coordinator {
namespace {

using json = nlohmann::json;
using Point = RunReport::Point;

// Every line of a JSON-lines file that parses as an object (a running job's last line may not).
std::vector<json> lines_of(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) out.push_back(std::move(j));
  }
  return out;
}

const char* mark_kind(const std::string& event) {
  if (event == "member_failed" || event == "worker_failed") return "failure";
  if (event == "member_joined") return "join";
  if (event == "member_left") return "leave";
  if (event == "steps_rolled_back") return "rollback";
  if (event == "straggler") return "straggler";
  if (event == "checkpoint_written") return "checkpoint";
  if (event == "resumed_from_checkpoint" || event == "coordinator_restarted") return "resume";
  return nullptr;
}

// What the events say: the job, its losses, its membership over time and its changes.
class EventReader {
 public:
  explicit EventReader(RunReport& r) : r_(r) {}

  void read(const json& e) {
    const std::string ev = text_field(e, "event");
    const double ts = number_field(e, "ts");
    if (r_.start_ts == 0) r_.start_ts = ts;
    // (a resumed run's coordinator starts after a while without one: not the job's time)
    if (ev == "job_started" && r_.end_ts > 0 && ts > r_.end_ts) r_.between_runs_s += ts - r_.end_ts;
    r_.end_ts = std::max(r_.end_ts, ts);
    const double t = ts - r_.start_ts;
    if (ev == "job_started") {  // (again in a resumed run: its agents' joins are no change)
      r_.started = true;
      r_.job = text_field(e, "job");
      r_.planned_steps = count_field(e, "steps");
      r_.state = "running";
      r_.failure.clear();
      unrecovered();  // (the run before ended in the middle of a change)
      changes_.restart();
    } else if (ev == "step_committed") {
      committed(e, t);
    } else if (ev == "generation_started") {
      if (r_.world_size.empty()) r_.world_size.push_back({0, 0});  // (forming)
      r_.world_size.push_back({t, r_.world_size.back().y});
      r_.world_size.push_back({t, number_field(e, "world_size")});
    } else if (ev == "evaluated") {
      eval_[count_field(e, "step")] = number_field(e, "loss");
    } else if (ev == "job_finished") {
      r_.state = text_field(e, "state", "completed");
    } else if (ev == "job_failed") {
      r_.state = "failed";
      r_.failure = text_field(e, "reason");
    }
    if (const char* kind = mark_kind(ev)) r_.marks.push_back({t, kind, describe(ev, e)});
    changes_.event(ev, t, number_field(e, "member", -1), describe(ev, e));
  }

  void finish() {
    unrecovered();
    for (auto& [step, loss] : loss_) r_.loss.push_back({double(step), loss});
    for (auto& [step, loss] : eval_) r_.eval_loss.push_back({double(step), loss});
    if (!r_.world_size.empty())
      r_.world_size.push_back({r_.end_ts - r_.start_ts, r_.world_size.back().y});
  }

 private:
  void committed(const json& e, double t) {
    const uint64_t step = count_field(e, "step");
    const double gen = number_field(e, "generation");
    loss_[step] = number_field(e, "loss");  // (a step redone after a rollback: its last commit)
    r_.steps = std::max(r_.steps, step + 1);
    if (const auto ended = changes_.commit(t, gen))
      r_.changes.push_back(
          {ended->sign.t, ended->sign.what, ended->seconds, ended->without_commit_seconds});
  }

  // A change pending at the run's end: a row without a recovery.
  void unrecovered() {
    if (const ChangeSign* s = changes_.pending()) r_.changes.push_back({s->t, s->what, -1, -1});
  }

  static std::string describe(const std::string& ev, const json& e) {
    std::string s = ev;
    for (const char* key :
         {"name", "member", "rank", "step", "from", "to", "checkpoint", "seed", "reason"}) {
      auto it = e.find(key);
      if (it == e.end()) continue;
      s += std::string(" ") + key + "=" + (it->is_string() ? it->get<std::string>() : it->dump());
    }
    return s;
  }

  RunReport& r_;
  std::map<uint64_t, double> loss_, eval_;
  ChangeWatch changes_;
};

void read_metrics(RunReport& r, const std::string& path) {
  auto by_rank = [](const json& m, const char* key, std::vector<std::vector<Point>>& out,
                    double step) {
    auto it = m.find(key);
    if (it == m.end() || !it->is_array()) return;
    const size_t ranks = std::min(it->size(), kMostRanksDrawn);  // (a page a browser can show)
    if (out.size() < ranks) out.resize(ranks);
    for (size_t k = 0; k < ranks; ++k)
      if ((*it)[k].is_number()) out[k].push_back({step, (*it)[k].get<double>() * 1e3});
  };
  for (const auto& m : lines_of(path)) {
    if (!m.contains("step_seconds")) continue;
    const double step = number_field(m, "step");
    r.samples_per_s.push_back({step, number_field(m, "samples_per_s")});
    r.idle.push_back({step, number_field(m, "idle_fraction")});
    by_rank(m, "worker_step_seconds", r.worker_step_ms, step);
    by_rank(m, "worker_compute_seconds", r.worker_compute_ms, step);
  }
}

}  // namespace

// What the run trained, from its config.toml (the effective config the run wrote): the model and
// the data, e.g. "gpt (4 layers, d_model 128, 4 heads, context 64); data text (/path)".
std::string trained_by(const std::string& run_dir) {
  const std::string file = run_dir + "/config.toml";
  std::error_code ec;  // (a FIFO would block; a crafted file would overflow toml++'s stack)
  if (!std::filesystem::is_regular_file(file, ec) ||
      std::filesystem::file_size(file, ec) > (1 << 20))
    return "";
  std::ifstream in(file);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  toml::table t;
  try {
    if (!toml_too_deep(all).empty()) return "";
    t = toml::parse(all, file);
  } catch (const std::exception&) {
    return "";
  }
  auto text = [&](const char* table, const char* key) {
    return t[table][key].value_or(std::string());
  };
  auto number = [&](const char* key) {
    return std::to_string(t["model"][key].value_or(int64_t(0)));
  };
  std::string s = text("model", "kind");
  if (s == "gpt")
    s += " (" + number("layers") + " layers, d_model " + number("d_model") + ", " +
         number("heads") + " heads, context " + number("context") + ")";
  const std::string data = text("data", "kind"), path = text("data", "path");
  const bool read = (data == "text" || data == "tokens") && !path.empty();  // (a file, a set)
  return s + "; data " + data + (read ? " (" + path + ")" : "");
}

RunReport read_run(const std::string& run_dir) {
  const std::string events = run_dir + "/events.jsonl";
  std::error_code ec;  // (a FIFO would block the open)
  if (!std::filesystem::is_regular_file(events, ec) || !std::ifstream(events))
    throw std::runtime_error(events + " cannot be read: not a run directory");
  RunReport r;
  r.run_dir = run_dir;
  r.trained = trained_by(run_dir);
  EventReader reader(r);
  for (const auto& e : lines_of(events)) reader.read(e);
  reader.finish();
  if (!r.started)  // (empty, or no line of it an event: a report of nothing said "running")
    throw std::runtime_error(events + " holds no job_started event: not a run's log");
  read_metrics(r, run_dir + "/metrics.jsonl");
  return r;
}

// ---- rendering ---------------------------------------------------------------------------------

namespace {

std::string esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string fmt(double v) {
  char b[32];
  std::snprintf(b, sizeof b, std::fabs(v) >= 1000 && std::fabs(v) < 1e9 ? "%.0f" : "%.4g", v);
  return b;
}

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* mark_color(const std::string& kind) {
  if (kind == "failure") return "#d62728";
  if (kind == "join") return "#2ca02c";
  if (kind == "leave") return "#ff7f0e";
  if (kind == "rollback") return "#9467bd";
  if (kind == "straggler") return "#8c564b";
  if (kind == "resume") return "#17becf";
  return "#1f77b4";  // checkpoint
}

struct Series {
  std::string name;
  const std::vector<Point>* points;
};

// The plot's frame: data ranges mapped to a 900 x 260 box with margins for the labels.
struct Frame {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  static constexpr double W = 900, H = 260, L = 60, R = 20, T = 24, B = 36;
  double px(double x) const { return L + (x - x0) / (x1 - x0) * (W - L - R); }
  double py(double y) const { return H - B - (y - y0) / (y1 - y0) * (H - T - B); }
};

Frame frame_of(const std::vector<Series>& series) {
  Frame f{1e300, -1e300, 1e300, -1e300};
  for (const auto& s : series)
    for (const auto& p : *s.points) {
      f.x0 = std::min(f.x0, p.x), f.x1 = std::max(f.x1, p.x);
      f.y0 = std::min(f.y0, p.y), f.y1 = std::max(f.y1, p.y);
    }
  if (f.x0 > f.x1) return Frame{};
  f.y0 = std::min(f.y0, 0.0);
  if (f.x1 <= f.x0) f.x1 = f.x0 + 1;
  if (f.y1 <= f.y0) f.y1 = f.y0 + 1;
  return f;
}

// At most ~1500 points a line (every k-th), so a long run stays a small file.
std::string polyline(const Frame& f, const std::vector<Point>& pts, const char* color) {
  const size_t stride = std::max<size_t>(1, pts.size() / 1500);
  std::string s = "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" + std::string(color) +
                  "\" points=\"";
  char b[48];
  for (size_t i = 0; i < pts.size(); i += stride) {
    std::snprintf(b, sizeof b, "%.1f,%.1f ", f.px(pts[i].x), f.py(pts[i].y));
    s += b;
  }
  return s + "\"/>\n";
}

std::string axes(const Frame& f, const std::string& xlabel, const std::string& ylabel) {
  std::string s;
  s += "<line x1=\"60\" y1=\"224\" x2=\"880\" y2=\"224\" stroke=\"#444\"/>";
  s += "<line x1=\"60\" y1=\"24\" x2=\"60\" y2=\"224\" stroke=\"#444\"/>\n";
  s += "<text x=\"60\" y=\"240\" font-size=\"11\">" + fmt(f.x0) + "</text>";
  s += "<text x=\"880\" y=\"240\" font-size=\"11\" text-anchor=\"end\">" + fmt(f.x1) + "</text>";
  s += "<text x=\"470\" y=\"254\" font-size=\"12\" text-anchor=\"middle\">" + esc(xlabel) +
       "</text>\n";
  s += "<text x=\"55\" y=\"224\" font-size=\"11\" text-anchor=\"end\">" + fmt(f.y0) + "</text>";
  s += "<text x=\"55\" y=\"30\" font-size=\"11\" text-anchor=\"end\">" + fmt(f.y1) + "</text>";
  s += "<text x=\"12\" y=\"124\" font-size=\"12\" transform=\"rotate(-90 12 124)\" "
       "text-anchor=\"middle\">" +
       esc(ylabel) + "</text>\n";
  return s;
}

std::string marks_svg(const Frame& f, const std::vector<RunReport::Mark>& marks) {
  std::string s;
  for (const auto& m : marks) {
    const double x = f.px(m.t);
    s += "<line class=\"mark " + m.kind + "\" x1=\"" + fmt(x) + "\" y1=\"24\" x2=\"" + fmt(x) +
         "\" y2=\"224\" stroke=\"" + mark_color(m.kind) + "\" stroke-dasharray=\"3,2\"><title>" +
         esc(fmt(m.t) + " s: " + m.text) + "</title></line>\n";
  }
  return s;
}

std::string plot(const std::string& id, const std::string& title, const std::string& xlabel,
                 const std::string& ylabel, const std::vector<Series>& series,
                 const std::vector<RunReport::Mark>* marks = nullptr) {
  std::string s = "<h2>" + esc(title) + "</h2>\n";
  bool any = false;
  for (const auto& x : series) any = any || !x.points->empty();
  if (!any) return s + "<p class=\"empty\" id=\"" + id + "\">no data yet</p>\n";
  const Frame f = frame_of(series);
  s += "<svg class=\"plot\" id=\"" + id +
       "\" xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"260\" "
       "viewBox=\"0 0 900 260\">\n";
  s += axes(f, xlabel, ylabel);
  if (marks) s += marks_svg(f, *marks);
  for (size_t i = 0; i < series.size(); ++i) s += polyline(f, *series[i].points, kPalette[i % 10]);
  double lx = 70;
  for (size_t i = 0; i < series.size() && series.size() > 1; ++i, lx += 90)
    s += "<text x=\"" + fmt(lx) + "\" y=\"16\" font-size=\"11\" fill=\"" + kPalette[i % 10] +
         "\">" + esc(series[i].name) + "</text>";
  return s + "</svg>\n";
}

std::vector<Series> per_rank(const std::vector<std::vector<Point>>& v) {
  std::vector<Series> out;
  for (size_t r = 0; r < v.size(); ++r) out.push_back({"rank " + std::to_string(r), &v[r]});
  return out;
}

std::string changes_table(const RunReport& r) {
  std::string s =
      "<h2>Membership changes</h2>\n<table id=\"changes\"><tr><th>at (s)</th>"
      "<th>first sign</th><th>recovery (s)</th><th>without a commit (s)</th></tr>\n";
  auto seconds = [](double v) { return v < 0 ? std::string("not yet") : fmt(v); };
  for (const auto& c : r.changes)
    s += "<tr><td>" + fmt(c.t) + "</td><td>" + esc(c.what) + "</td><td>" + seconds(c.recovery_s) +
         "</td><td>" + seconds(c.without_commit_s) + "</td></tr>\n";
  if (r.changes.empty()) s += "<tr><td colspan=\"4\">none</td></tr>\n";
  s += "</table>\n<p class=\"legend\">recovery: from the change's first sign (a failure once "
       "detected) to the next committed step; without a commit: the time without a committed "
       "step that ended there, the detection included.</p>\n<p class=\"legend\">";
  for (const char* k :
       {"failure", "join", "leave", "rollback", "straggler", "checkpoint", "resume"})
    s += std::string("<span style=\"color:") + mark_color(k) + "\">&#9474; " + k + "</span> ";
  return s + "</p>\n";
}

}  // namespace

std::string render_report(const RunReport& r) {
  std::string s =
      "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>Troupe run: " + esc(r.job) +
      "</title>\n<style>body{font-family:sans-serif;margin:24px;max-width:960px}"
      "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"
      ".empty{color:#888}</style></head><body>\n";
  s += "<h1>" + esc(r.job) + "</h1>\n<p id=\"summary\">" + esc(r.state) + ", " +
       std::to_string(r.steps) + " of " + std::to_string(r.planned_steps) + " steps in " +
       fmt(r.end_ts - r.start_ts - r.between_runs_s) + " s" +
       (r.between_runs_s > 0 ? " (and " + fmt(r.between_runs_s) + " s between its runs)" : "") +
       (r.loss.empty() ? std::string() : ", last loss " + fmt(r.loss.back().y)) + ", " +
       std::to_string(r.changes.size()) + " membership change(s)</p>\n";
  if (!r.run_dir.empty()) {
    char started[32] = "";
    const std::time_t at = std::time_t(r.start_ts);
    std::tm utc{};
    if (r.start_ts > 0 && gmtime_r(&at, &utc))
      std::strftime(started, sizeof started, "%Y-%m-%d %H:%M UTC", &utc);
    s += "<p id=\"about\">" + esc(r.run_dir) +
         (started[0] ? ", started " + std::string(started) : "") +
         (r.trained.empty() ? "" : "; model " + esc(r.trained)) + "</p>\n";
  }
  if (!r.failure.empty()) s += "<p id=\"failure\">Why it failed: " + esc(r.failure) + "</p>\n";
  if (r.eval_loss.empty()) {
    s += plot("loss", "Loss", "step", "loss", {{"train", &r.loss}});
    s += "<p class=\"empty\">No eval loss: this run has no evaluation set.</p>\n";
  } else {
    s += plot("loss", "Loss", "step", "loss", {{"train", &r.loss}, {"eval", &r.eval_loss}});
  }
  s += plot("throughput", "Throughput", "step", "samples/s", {{"samples/s", &r.samples_per_s}});
  s += plot("step_time", "Step time per worker", "step", "ms", per_rank(r.worker_step_ms));
  if (r.worker_step_ms.size() == kMostRanksDrawn)
    s += "<p class=\"empty\">Per worker: the first " + std::to_string(kMostRanksDrawn) +
         " ranks.</p>\n";
  s += plot("compute_time", "Compute time per worker (forward, backward)", "step", "ms",
            per_rank(r.worker_compute_ms));
  s += plot("idle", "Idle fraction (1 - compute / step time)", "step", "fraction",
            {{"idle", &r.idle}});
  s += plot("membership", "Membership: world size, and what changed it", "seconds since start",
            "workers", {{"world size", &r.world_size}}, &r.marks);
  s += changes_table(r);
  return s + "</body></html>\n";
}

}  // namespace troupe::coordinator
