// The admin commands: `troupe status`, `troupe stop`, `troupe checkpoint`, `troupe drain`,
// `troupe scale`. Each names its job (--run-dir DIR, or --coordinator HOST:PORT --token-file F)
// and sends Cap'n Proto requests to its coordinator over UCX.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iterator>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include "actors/bridge.h"
#include "actors/job_protocol.h"
#include "actors/messages.h"
#include "actors/services.h"
#include "cli/commands.h"
#include "cli/parse.h"
#include "comm/host_identity.h"
#include "coordinator/checkpoints.h"
#include "coordinator/config.h"
#include "coordinator/events.h"
#include "coordinator/run_dir.h"
#include "coordinator/run_record.h"
#include "workers/agent.h"

namespace troupe::cli {
namespace {

// How an admin command names its job: --run-dir DIR, or --coordinator HOST:PORT --token-file F.
struct JobName {
  std::string run_dir, coordinator, token_file;
  void add_to(CLI::App& app) {
    app.add_option("--run-dir", run_dir, "the job's run directory (its address and token)");
    app.add_option("--coordinator", coordinator, "the coordinator's HOST:PORT")
        ->excludes("--run-dir");
    app.add_option("--token-file", token_file, "the job's token file (with --coordinator)")
        ->excludes("--run-dir");
  }
};

// The first and the last event a run directory's events.jsonl holds (null when none can be
// read; a cut or damaged line is passed over).
struct RunEvents {
  nlohmann::json first, started, last;  // (started: the newest run's job_started)
};
RunEvents run_events(const std::string& dir) {
  RunEvents e;
  std::error_code ec;  // (a FIFO would block the read)
  if (!std::filesystem::is_regular_file(dir + "/events.jsonl", ec)) return e;
  std::ifstream in(dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) continue;
    if (e.first.is_null()) e.first = j;
    if (coordinator::text_field(j, "event") == "job_started") e.started = j;
    e.last = j;
  }
  return e;
}

// ": it ended at step N" where the run directory's last event ends its job, else "".
std::string how_it_ended(const std::string& run_dir) {
  const nlohmann::json last = run_events(run_dir).last;
  const std::string event = last.is_null() ? "" : coordinator::text_field(last, "event");
  if (event != "job_finished" && event != "job_failed") return "";
  const uint64_t step = last.contains("steps") ? coordinator::count_field(last, "steps")
                                               : coordinator::count_field(last, "step");
  return ": it ended at step " + std::to_string(step);
}

struct JobRef {
  std::string address, job_id, token, run_dir;
};
JobRef job_ref(const JobName& n) {
  JobRef r;
  std::string token_file = n.token_file;
  if (!n.run_dir.empty() && !coordinator::run_dir_in_use(n.run_dir)) {
    std::error_code ec;
    if (!std::filesystem::is_directory(n.run_dir, ec))
      throw std::invalid_argument(
          "no run directory " + n.run_dir + ": " +
          (std::filesystem::exists(n.run_dir, ec) ? "it is not a directory" : "it does not exist"));
    if (run_events(n.run_dir).last.is_null())
      throw std::invalid_argument(n.run_dir + " is not a run directory (no events in " + n.run_dir +
                                  "/events.jsonl)");
    throw std::runtime_error("no coordinator runs the job in " + n.run_dir +
                             how_it_ended(n.run_dir) + " (troupe status --run-dir " + n.run_dir +
                             ")");
  }
  if (!n.run_dir.empty()) {
    std::error_code ec;  // (a FIFO would block the read)
    std::ifstream in;
    if (std::filesystem::is_regular_file(n.run_dir + "/coordinator.addr", ec))
      in.open(n.run_dir + "/coordinator.addr");
    if (!(in >> std::setw(256) >> r.address))
      throw std::invalid_argument("no coordinator.addr in " + n.run_dir +
                                  " (is a job running there?)");
    token_file = n.run_dir + "/job.token";
    r.run_dir = n.run_dir;
  } else {
    r.address = n.coordinator;
    if (r.address.empty() && token_file.empty())
      throw std::invalid_argument(
          "name the job with --run-dir DIR, or --coordinator HOST:PORT --token-file F");
    if (r.address.empty())
      throw std::invalid_argument("--token-file " + token_file +
                                  " needs --coordinator HOST:PORT (the job's coordinator.addr)");
    if (token_file.empty())
      throw std::invalid_argument("--coordinator " + r.address +
                                  " needs --token-file F (the job's job.token, in its run "
                                  "directory)");
    if (!address_to_reach(r.address))  // (before UCX's message, with its source line)
      throw std::invalid_argument("--coordinator " + r.address +
                                  " is not HOST:PORT with a port (the job's coordinator.addr; "
                                  "port 0 is none)");
  }
  std::tie(r.job_id, r.token) = workers::read_token_file(token_file);
  return r;
}

// A connection to a running job's coordinator, for one request or a series of them (troupe
// checkpoint polls). Every request has a deadline; a failure is printed, naming the job's address
// and what went wrong (a refusal is the coordinator's answer, not a silence), and gives nullopt.
class AdminSession {
 public:
  explicit AdminSession(const JobName& job) : ref_(job_ref(job)) {
    actors::configure_system(cfg_);
    system_ = std::make_unique<caf::actor_system>(cfg_);
    bridge_ = actors::spawn_bridge(*system_, actors::job_bridge_config(ref_.job_id, ref_.token));
    // A connection that breaks while it forms (a coordinator too busy to answer its listener in
    // time: seen under a sanitizer) is tried again, up to 5 times in about 1.5 s; a refusal is
    // the coordinator's answer and is not.
    caf::scoped_actor self{*system_};
    for (int attempt = 0; attempt < 5; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50 << attempt));
      error_.reset();
      self->request(bridge_, std::chrono::seconds(10), actors::connect_atom::value, ref_.address)
          .receive([&](uint64_t n) { node_ = n; }, [&](caf::error& e) { error_ = e; });
      const auto ce = error_ ? actors::control_error(*error_) : std::nullopt;
      if (!ce || ce->code != comm::Errc::peer_lost) break;
    }
  }
  ~AdminSession() { caf::anon_send_exit(bridge_, caf::exit_reason::user_shutdown); }

  std::optional<actors::ControlMessage> request(const actors::ControlMessage& m,
                                                bool quiet = false) {
    std::optional<actors::ControlMessage> reply;
    if (!error_) {
      caf::scoped_actor self{*system_};
      self->request(bridge_, std::chrono::seconds(10), actors::request_atom::value,
                    actors::RemoteAddress{node_, actors::kCoordinatorActorId}, m, uint32_t(5000))
          .receive([&](actors::ControlMessage& r) { reply = std::move(r); },
                   [&](caf::error& e) { error_ = e; });
    }
    if (!reply && !quiet) report();
    return reply;
  }

  std::optional<actors::JobStatus> status(bool quiet = false) {
    auto r = request(actors::make_status_request(), quiet);
    if (!r || !r->envelope().getBody().isStatus()) return std::nullopt;
    return actors::decode(r->envelope().getBody().getStatus());
  }

  // The exit status of a request that got no reply: 2 where the job answered that it can never
  // be valid for it (an agent it does not have, a size outside its limits, another job's token),
  // else 1 (it cannot now: the job is stopping, would have too few workers; or it did not answer).
  int failure_rc() const {
    auto ce = error_ ? actors::control_error(*error_) : std::nullopt;
    if (ce && ce->code == comm::Errc::refused && ce->message == actors::kWrongJobOrToken) return 2;
    return ce && ce->code == comm::Errc::invalid_input ? 2 : 1;
  }

 private:
  void report() const {
    auto ce = actors::control_error(*error_);
    const bool answer =
        ce && (ce->code == comm::Errc::refused || ce->code == comm::Errc::invalid_input);
    const std::string text = ce ? ce->message : system_->render(*error_);
    const char* at = ref_.address.c_str();
    // A job that ended meanwhile (between reading its address and the answer) says so.
    const std::string ended = ref_.run_dir.empty() || coordinator::run_dir_in_use(ref_.run_dir)
                                  ? ""
                                  : how_it_ended(ref_.run_dir);
    if (!answer && !ended.empty())
      std::fprintf(stderr, "troupe: the job in %s did not answer%s\n", ref_.run_dir.c_str(),
                   ended.c_str());
    else if (node_ == 0)
      std::fprintf(stderr, "troupe: cannot reach the job at %s: %s\n", at, text.c_str());
    else if (answer)
      std::fprintf(stderr, "troupe: the job at %s refused: %s\n", at, text.c_str());
    else
      std::fprintf(stderr, "troupe: the job at %s did not answer: %s: %s\n", at,
                   ce ? comm::errc_name(ce->code) : "error", text.c_str());
  }

  JobRef ref_;
  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  caf::actor bridge_;
  uint64_t node_ = 0;
  std::optional<caf::error> error_;
};

// One request to a running job's coordinator: on_reply's exit code, or failure_rc (printed why).
int admin_request(const JobName& job, const actors::ControlMessage& request,
                  const std::function<int(actors::ControlMessage&)>& on_reply) {
  AdminSession session(job);
  auto reply = session.request(request);
  return reply ? on_reply(*reply) : session.failure_rc();
}

// A worker's state in a row: the coordinator's (actors::MemberStatus::state); from an older
// one, a member that has reported a step of this generation is "training", one that has not yet
// "starting", a live worker outside the generation "standby".
std::string row_state(bool member, const actors::MemberStatus& m) {
  if (!m.state.empty()) return m.state;
  if (!member) return "standby";
  return m.last_report_ms >= 0 ? "training" : "starting";
}

nlohmann::ordered_json status_rows(const std::vector<actors::MemberStatus>& rows, bool member) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& m : rows)
    out.push_back({{"rank", member ? nlohmann::ordered_json(m.rank) : nullptr},  // (a standby)
                   {"agent", m.agent},
                   {"name", m.name},
                   {"pid", m.pid},
                   {"host", m.host},
                   {"device", m.device},
                   {"stage", m.stage},
                   {"step_seconds", m.step_seconds},
                   {"compute_seconds", m.compute_seconds},
                   {"data_seconds", m.data_seconds},
                   {"last_report_ms", m.last_report_ms},
                   {"last_heard_ms", m.last_heard_ms},
                   {"state", row_state(member, m)}});
  return out;
}

// A worker's row: the columns of print_status.
void print_row(const char* rank, const char* state, const actors::MemberStatus& m) {
  char stage[16] = "-", step[16] = "-", compute[16] = "-", data[16] = "-", seen[16] = "-",
       heard[16] = "-";
  if (m.last_heard_ms >= 0)
    std::snprintf(heard, sizeof heard, "%.1f s", double(m.last_heard_ms) / 1e3);
  if (m.stage >= 0) std::snprintf(stage, sizeof stage, "%d", m.stage);
  if (m.last_report_ms >= 0) {
    std::snprintf(step, sizeof step, "%.1f", m.step_seconds * 1e3);
    std::snprintf(compute, sizeof compute, "%.1f", m.compute_seconds * 1e3);
    std::snprintf(data, sizeof data, "%.2f", m.data_seconds * 1e3);
    std::snprintf(seen, sizeof seen, "%.1f s", double(m.last_report_ms) / 1e3);
  }
  std::printf("%7s %5u %-12s %8u %-12s %-7s %5s %8s %10s %8s %9s %9s %-8s\n", rank, m.agent,
              m.name.c_str(), m.pid, m.host.c_str(), m.device.c_str(), stage, step, compute, data,
              seen, heard, state);
}

void print_status(const actors::JobStatus& s, bool json) {
  if (json) {
    std::printf("%s\n", coordinator::Json()
                            .str("job", s.job_name)
                            .str("state", s.state)
                            .integer("generation", long(s.generation))
                            .integer("step", long(s.step))
                            .integer("steps", long(s.steps))
                            .num("loss", s.last_loss)
                            .num("epoch", s.epoch)
                            .str("plan", s.plan)
                            .str("data_plane", s.data_plane)
                            .value("members", status_rows(s.members, true))
                            .value("standbys", status_rows(s.standbys, false))
                            .integer("checkpoint_step", long(s.checkpoint_step))
                            .str("checkpoint", s.checkpoint_path)
                            .num("model_tflops_per_s", s.model_tflops)
                            .num("mfu", s.mfu)  // (NaN: null)
                            .str("peak", s.peak)
                            .text()
                            .c_str());
    return;
  }
  char loss[32] = "-";  // (no step committed yet by this coordinator: no loss to show)
  if (s.step > 0 && std::isfinite(s.last_loss))
    std::snprintf(loss, sizeof loss, "%.4f", s.last_loss);
  char epoch[32] = "";
  if (s.epoch > 0) std::snprintf(epoch, sizeof epoch, ", epoch %.3g", s.epoch);
  std::printf("job %s: %s, generation %llu, step %llu/%llu%s, loss %s\n", s.job_name.c_str(),
              s.state.c_str(), (unsigned long long)s.generation, (unsigned long long)s.step,
              (unsigned long long)s.steps, epoch, loss);
  if (s.checkpoint_step > 0)
    std::printf("checkpoint: step %llu, %s\n", (unsigned long long)s.checkpoint_step,
                s.checkpoint_path.c_str());
  if (!s.peak.empty()) {
    char mfu[32] = "unknown";
    if (!std::isnan(s.mfu)) std::snprintf(mfu, sizeof mfu, "%.2f%%", 100 * s.mfu);
    std::printf("MFU: %s (%.4g model TFLOP/s); peak: %s\n", mfu, s.model_tflops, s.peak.c_str());
  }
  if (!s.plan.empty())
    std::printf("pipeline: %s (rank = replica x stages + stage)\n", s.plan.c_str());
  if (!s.data_plane.empty()) std::printf("data plane: %s\n", s.data_plane.c_str());
  std::printf("%7s %5s %-12s %8s %-12s %-7s %5s %8s %10s %8s %9s %9s %-8s\n", "rank", "agent",
              "name", "pid", "host", "device", "stage", "step ms", "compute ms", "data ms",
              "last step", "heard", "state");
  for (const auto& m : s.members)
    print_row(std::to_string(m.rank).c_str(), row_state(true, m).c_str(), m);
  for (const auto& m : s.standbys) print_row("standby", row_state(false, m).c_str(), m);
}

// The newest checkpoint of step <= `at_most` in a run's checkpoint directory (its config's
// checkpoint.dir, as a resume takes it): its step, or nullopt. By the names and manifests alone (a
// take-over checks its shards).
std::optional<uint64_t> newest_checkpoint_step(const std::string& dir, uint64_t at_most) {
  std::string checkpoints = dir + "/checkpoints";
  try {  // (a program's own kinds are not this command's to load: the default place)
    checkpoints = coordinator::checkpoints_dir(
        coordinator::load_config(dir + "/config.toml", {}, {}, false), dir);
  } catch (const std::exception&) {
  }
  const std::vector<uint64_t> steps = coordinator::checkpoint_steps(checkpoints);
  const auto after = std::upper_bound(steps.begin(), steps.end(), at_most);
  if (after == steps.begin()) return std::nullopt;
  return *std::prev(after);
}

// What a take-over of a run that did not end would do: adopt its agents that may still be alive
// (coordinator::may_come_back), or go on from its newest checkpoint, the steps after it trained
// again, or from the seed without one. (status said only how to take it over, and a take-over
// only that the agents alive go on.)
std::string take_over_outlook(const std::string& dir) {
  const coordinator::RunRecord record = coordinator::read_run_record(coordinator::event_lines(dir));
  if (coordinator::may_come_back(record.agents, {}, comm::host_identity(),
                                 [](uint32_t pid) { return comm::process_gone(int(pid)); }))
    return "its agents that may still be alive go on from their own state (each waits "
           "elastic.rejoin_timeout_ms for it)";
  const auto step = newest_checkpoint_step(dir, record.committed);
  if (!step)
    return "no agent of it is alive here and it has no checkpoint: its " +
           std::to_string(record.committed) + " committed steps are trained again, from the " +
           "job's seed";
  return "no agent of it is alive here: it goes on from its checkpoint of step " +
         std::to_string(*step) +
         (*step == record.committed ? std::string(", nothing trained again")
                                    : ", steps " + std::to_string(*step) + ".." +
                                          std::to_string(record.committed - 1) + " trained again");
}

// The steps a run that did not end committed (its last event's "step" is an index, or none).
int64_t committed_steps(const std::string& dir) {
  return int64_t(coordinator::read_run_record(coordinator::event_lines(dir)).committed);
}

// A job no process runs any more (its run directory is not locked): its events say how it
// ended. nullopt when a job runs there (ask its coordinator).
std::optional<int> status_from_run_dir(const std::string& dir, bool json) {
  if (dir.empty() || coordinator::run_dir_in_use(dir)) return std::nullopt;
  const auto [first, started, last] = run_events(dir);
  if (last.is_null()) return std::nullopt;
  using coordinator::count_field, coordinator::text_field;
  const std::string event = text_field(last, "event");  // (the job as the newest run named it)
  const std::string name = text_field(started.is_null() ? first : started, "job", "?");
  const bool finished = event == "job_finished", failed = event == "job_failed";
  nlohmann::ordered_json out = {
      {"job", name},
      {"state", finished || failed ? "finished" : "not running"},
      {"outcome", finished ? text_field(last, "state", "completed")
                  : failed ? "failed"
                           : "unknown"},
      // (the steps committed: job_finished's steps, job_failed's step; a run that did not end,
      // from its record: its last event's step, where it has one, is an index or job.steps)
      {"step", finished ? count_field(last, "steps")
               : failed ? count_field(last, "step")
                        : committed_steps(dir)}};
  out["steps"] = count_field(started, "steps");  // (job.steps, as its newest run started)
  if (finished) out["loss"] = coordinator::number_field(last, "loss");
  if (failed) out["reason"] = text_field(last, "reason");
  if (!finished && !failed) out["last_event"] = event;
  // Where it goes on from, as its end said, and how.
  for (const char* key : {"checkpoint", "resume_from"})
    if (!text_field(last, key).empty()) out[key] = text_field(last, key);
  // (A run that did not end is taken over; a stopped one goes on from its checkpoint, if any.)
  const bool goes_on = (!finished && !failed) || out.contains("resume_from");
  if (goes_on) out["resume"] = "troupe run " + dir + "/config.toml --resume " + dir;
  if (!finished && !failed) out["take_over"] = take_over_outlook(dir);
  if (json) {
    std::printf("%s\n", out.dump().c_str());
    return finished || failed ? 0 : 1;
  }
  if (finished || failed)
    std::printf("job %s: finished (%s) at step %lld of %lld%s\n", name.c_str(),
                out["outcome"].get<std::string>().c_str(), (long long)out["step"].get<int64_t>(),
                (long long)out["steps"].get<int64_t>(),
                failed ? (": " + text_field(last, "reason")).c_str() : "");
  else  // (its coordinator lost: its agents wait elastic.rejoin_timeout_ms for a take-over)
    std::printf("job %s: not running, and it did not finish (its last event: %s)\n", name.c_str(),
                event.c_str());
  if (out.contains("checkpoint"))
    std::printf("checkpoint: %s\n", text_field(last, "checkpoint").c_str());
  if (goes_on) std::printf("goes on with: %s\n", out["resume"].get<std::string>().c_str());
  if (out.contains("take_over"))
    std::printf("  (%s)\n", out["take_over"].get<std::string>().c_str());
  return finished || failed ? 0 : 1;
}

}  // namespace

// The watched job stopped answering: how it ended, once its run directory is let go (its
// coordinator exits right after its last answer), as troupe status says it.
int watch_ended(const JobName& job) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!job.run_dir.empty() && std::chrono::steady_clock::now() < until) {
    if (auto rc = status_from_run_dir(job.run_dir, false)) return *rc;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::printf("troupe: the job stopped answering (its events.jsonl says how it ended)\n");
  return 0;
}

// troupe status --watch: the status again every interval, in place on a terminal (a new block
// otherwise), until the job ends or stops answering.
int watch_status(const JobName& job, double interval_s) {
  if (auto rc = status_from_run_dir(job.run_dir, false)) return *rc;  // (it ended already)
  AdminSession session(job);
  const bool tty = ::isatty(STDOUT_FILENO);
  for (bool seen = false;; seen = true) {
    auto st = session.status(/*quiet=*/seen);
    if (!st && seen) return watch_ended(job);
    if (!st) return 1;
    if (tty) std::printf("\033[H\033[2J");
    print_status(*st, false);
    if (!tty) std::printf("\n");
    std::fflush(stdout);
    if (st->state == "finished") return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(int64_t(interval_s * 1000)));
  }
}

// troupe top: troupe status --watch, under its own name.
int run_top(const std::vector<std::string>& words) {
  CLI::App app{"A job's live view, refreshed in place until it ends (troupe status --watch).",
               "troupe top"};
  JobName job;
  job.add_to(app);
  double interval_s = 1;
  app.add_option("--interval", interval_s, "seconds between refreshes (default 1)")
      ->check(number_in(0.05, 3600));
  if (auto rc = parse(app, words)) return *rc;
  return watch_status(job, interval_s);
}

int run_status(const std::vector<std::string>& words) {
  CLI::App app{"Shows a running job: its phase, generation, step, loss and members.",
               "troupe status"};
  JobName job;
  bool json = false;
  job.add_to(app);
  bool watch = false;
  double interval_s = 1;
  app.add_flag("--json", json, "one JSON object (job, state, generation, step, members...)");
  app.add_flag("--watch", watch, "refresh in place until the job ends (troupe top)")
      ->excludes("--json");
  app.add_option("--interval", interval_s, "seconds between refreshes with --watch (default 1)")
      ->check(number_in(0.05, 3600));
  if (auto rc = parse(app, words)) return *rc;
  if (watch) return watch_status(job, interval_s);
  if (auto rc = status_from_run_dir(job.run_dir, json)) return *rc;
  return admin_request(job, actors::make_status_request(), [&](actors::ControlMessage& r) {
    auto body = r.envelope().getBody();
    if (!body.isStatus()) {
      std::fprintf(stderr, "troupe status: unexpected answer\n");
      return 1;
    }
    print_status(actors::decode(body.getStatus()), json);
    return 0;
  });
}

// The id the newest agent that joined under `name` had (member_joined), if a run directory says.
std::optional<uint32_t> newest_id_named(const std::string& run_dir, const std::string& name) {
  std::error_code ec;  // (a FIFO would block the read)
  if (run_dir.empty() || !std::filesystem::is_regular_file(run_dir + "/events.jsonl", ec))
    return std::nullopt;
  std::optional<uint32_t> id;
  std::ifstream in(run_dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string event = j.is_object() ? coordinator::text_field(j, "event") : "";
    if (event == "job_started" || event == "coordinator_restarted")
      id.reset();  // (a new coordinator numbers its agents from 0 again)
    else if (event == "member_joined" && coordinator::text_field(j, "name") == name &&
             j.contains("member"))
      id = uint32_t(coordinator::count_field(j, "member"));
  }
  return id;
}

// --agent ID or NAME: the agent's id and its name, looked up in the job's status among the
// members and the standbys (an id is not a name: agent-0 need not be agent 0; an id not there is
// the coordinator's to refuse, as invalid: exit 2 too). nullopt, printed why, with rc: 1 the job
// did not answer, 2 no such agent.
std::optional<std::pair<uint32_t, std::string>> agent_id(AdminSession& session,
                                                         const std::string& agent,
                                                         const std::string& run_dir, int& rc) {
  const bool numeric = !agent.empty() && agent.size() < 10 &&
                       agent.find_first_not_of("0123456789") == std::string::npos;
  rc = 1;
  auto status = session.status();
  if (!status) return std::nullopt;
  std::set<std::string> names;
  std::set<uint32_t> named;  // (two agents started by hand may share a name)
  for (const auto* rows : {&status->members, &status->standbys})
    for (const auto& m : *rows) {
      if (numeric && m.agent == std::stoul(agent)) return std::pair{m.agent, m.name};
      if (!numeric && m.name == agent) named.insert(m.agent);
      names.insert(m.name + " (" + std::to_string(m.agent) + ")");
    }
  if (numeric) return std::pair{uint32_t(std::stoul(agent)), std::string()};
  if (named.size() == 1) return std::pair{*named.begin(), agent};
  // No member or standby now (one lost whose launcher slot waits to start it again): its newest
  // id, as the run directory knows it; the coordinator decides (that slot is retired).
  if (named.empty() && !numeric)
    if (const auto id = newest_id_named(run_dir, agent)) return std::pair{*id, agent};
  if (named.size() > 1) {
    std::string ids;
    for (uint32_t id : named) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    std::fprintf(stderr,
                 "troupe drain: %zu agents are named '%s' (agents %s): name one by its id\n",
                 named.size(), agent.c_str(), ids.c_str());
    rc = 2;
    return std::nullopt;
  }
  std::string known;
  for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
  std::fprintf(stderr, "troupe drain: no agent '%s' in the job; its agents: %s\n", agent.c_str(),
               known.empty() ? "none" : known.c_str());
  rc = 2;
  return std::nullopt;
}

int run_drain(const std::vector<std::string>& words) {
  CLI::App app{"Lets an agent leave the job at the next step boundary (nothing is redone).",
               "troupe drain"};
  JobName job;
  std::string agent;
  job.add_to(app);
  app.add_option("--agent", agent, "the agent: its id or its name (troupe status's columns)")
      ->required();
  if (auto rc = parse(app, words)) return *rc;
  AdminSession session(job);
  int rc = 0;
  const auto id = agent_id(session, agent, job.run_dir, rc);
  if (!id) return rc;
  auto reply = session.request(actors::make_drain_request(id->first));
  if (!reply) return session.failure_rc();
  if (auto body = reply->envelope().getBody(); body.isAccepted())  // (what it did instead)
    std::printf("troupe: %s\n", body.getAccepted().cStr());
  else
    std::printf("troupe: agent %u%s leaves at the next step boundary\n", id->first,
                id->second.empty() ? "" : (" (" + id->second + ")").c_str());
  return 0;
}

int run_scale(const std::vector<std::string>& words) {
  CLI::App app{"Grows (the local launcher starts agents) or shrinks (drains) a running job.",
               "troupe scale"};
  JobName job;
  uint32_t n = 0;
  job.add_to(app);
  app.add_option("--workers", n, "the number of workers to run with")
      ->required()
      ->check(number_in(1, 1000000));
  if (auto rc = parse(app, words)) return *rc;
  return admin_request(job, actors::make_scale_request(n), [&](actors::ControlMessage& r) {
    auto body = r.envelope().getBody();
    if (body.isAccepted())
      std::printf("troupe: %s\n", body.getAccepted().cStr());
    else
      std::printf("troupe: scaling the job to %u worker(s) at the next step boundary\n", n);
    return 0;
  });
}

int run_lr(const std::vector<std::string>& words) {
  CLI::App app{
      "Sets the optimizer's learning rate (optimizer.lr, the schedule's peak) of a running job "
      "from the next step boundary, on every member (joiners and a resume too).",
      "troupe lr"};
  JobName job;
  double lr = 0;
  job.add_to(app);
  app.add_option("LR", lr, "the new learning rate")->required()->check(number_in(1e-12, 1e3));
  if (auto rc = parse(app, words)) return *rc;
  return admin_request(job, actors::make_learning_rate_request(lr), [&](actors::ControlMessage&) {
    std::printf("troupe: learning rate %g from the next step boundary\n", lr);
    return 0;
  });
}

int run_stop(const std::vector<std::string>& words) {
  CLI::App app{
      "Stops a running job after the current step (its last event: job_finished, "
      "state stopped). With checkpoint.every_steps, or --checkpoint, it checkpoints there first: "
      "troupe run --resume RUN_DIR goes on from it.",
      "troupe stop"};
  JobName job;
  bool checkpoint = false;
  job.add_to(app);
  app.add_flag("--checkpoint", checkpoint, "checkpoint at the step it stops at");
  if (auto rc = parse(app, words)) return *rc;
  auto request = checkpoint ? actors::make_checkpoint_request(true) : actors::make_stop_request();
  return admin_request(job, request, [&](actors::ControlMessage& r) {
    auto body = r.envelope().getBody();
    if (body.isStatus()) {  // (a job that had not formed a generation: it ends now)
      const actors::JobStatus s = actors::decode(body.getStatus());
      std::printf("troupe: the job stops now, at step %llu: no generation of it had formed\n",
                  (unsigned long long)s.step);
      return 0;
    }
    if (!body.isAck()) return 1;
    std::printf("troupe: stop requested; the job stops after the current step%s\n",
                checkpoint ? ", with a checkpoint there" : "");
    return 0;
  });
}

// troupe checkpoint: asks for one at the next step boundary, then polls the job's status until a
// checkpoint at or after that step is complete (its manifest written) or the deadline passes.
int run_checkpoint(const std::vector<std::string>& words) {
  CLI::App app{
      "Checkpoints a running job at the next step boundary (under checkpoint.dir, by default "
      "RUN_DIR/checkpoints) and waits until it is written; training goes on.",
      "troupe checkpoint"};
  JobName job;
  bool no_wait = false;
  double timeout_s = 600;
  job.add_to(app);
  app.add_flag("--no-wait", no_wait, "return once the job took the request");
  app.add_option("--timeout", timeout_s, "seconds to wait for the write (default 600)")
      ->check(number_in(0.1, 86400));
  if (auto rc = parse(app, words)) return *rc;
  AdminSession session(job);
  auto before = session.status();
  if (!before) return 1;
  if (!session.request(actors::make_checkpoint_request(false))) return session.failure_rc();
  const uint64_t wanted = before->step + 1;  // (the coordinator's target is at least this)
  std::printf("troupe: checkpoint requested at the first step boundary after step %llu\n",
              (unsigned long long)before->step);
  if (no_wait) return 0;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto now = session.status(/*quiet=*/true);
    if (!now) {
      std::fprintf(stderr,
                   "troupe checkpoint: the job stopped answering before the checkpoint was "
                   "written (its events.jsonl says how it ended)\n");
      return 1;
    }
    if (now->checkpoint_step >= wanted) {
      std::printf("troupe: checkpoint at step %llu written: %s\n",
                  (unsigned long long)now->checkpoint_step, now->checkpoint_path.c_str());
      return 0;
    }
    if (now->state == "finished") {
      std::fprintf(stderr,
                   "troupe checkpoint: the job ended before a checkpoint at step %llu or later "
                   "was written (its events.jsonl says how)\n",
                   (unsigned long long)wanted);
      return 1;
    }
  }
  std::fprintf(stderr, "troupe checkpoint: no checkpoint at step %llu or later within %.1f s\n",
               (unsigned long long)wanted, timeout_s);
  return 1;
}

}  // namespace troupe::cli
