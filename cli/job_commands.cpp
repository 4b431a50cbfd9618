// `troupe run`, `troupe coordinator`, `troupe agent`, `troupe status`, `troupe stop`.
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <thread>

#include "actors/bridge.h"
#include "actors/job_protocol.h"
#include "actors/services.h"
#include "actors/signals.h"
#include "cli/commands.h"
#include "cli/parse.h"
#include "comm/cuda_info.h"
#include "comm/host_identity.h"
#include "comm/transport.h"
#include "coordinator/checkpoints.h"
#include "coordinator/config.h"
#include "coordinator/events.h"
#include "coordinator/job.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_spec.h"
#include "coordinator/launcher.h"
#include "coordinator/metrics_server.h"
#include "coordinator/process.h"
#include "coordinator/run_dir.h"
#include "coordinator/run_record.h"
#include "data/shards.h"
#include "data/token_data.h"
#include "elastic/planner.h"
#include "models/devices.h"
#include "models/model.h"
#include "workers/agent.h"
#include "workers/datasets.h"
#include "workers/device_supervisor.h"

namespace troupe::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string eta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  int s = int(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d", s / 60, s % 60);
  return buf;
}

// The run directory, owned by this job for its life: its effective config, its token, and the
// coordinator's log.
struct RunDir {
  std::unique_ptr<coordinator::RunDirectory> owned;
  std::string path, token;
};

// Checkpoints go to checkpoint.dir, by default the run directory's checkpoints/ (made absolute:
// agents may run elsewhere), every checkpoint.every_steps, on request (troupe checkpoint, troupe
// stop --checkpoint, SIGTERM) and at a completed job's last step. Created up front for periodic
// ones (throws RunDirError when it cannot be), else by the first checkpoint written.
void resolve_checkpoint_dir(coordinator::JobConfig& cfg, const std::string& run_dir) {
  if (cfg.external()) return;  // (the members' own loop keeps its own: none, not an empty one)
  if (cfg.checkpoint_dir.empty()) cfg.checkpoint_dir = run_dir + "/checkpoints";
  std::error_code ec;
  cfg.checkpoint_dir = std::filesystem::absolute(cfg.checkpoint_dir, ec).lexically_normal();
  if (cfg.checkpoint_every_steps == 0) return;
  std::filesystem::create_directories(cfg.checkpoint_dir, ec);
  if (ec)
    throw coordinator::RunDirError("checkpoint.dir: cannot create " + cfg.checkpoint_dir + ": " +
                                   ec.message());
}

// The job its token file names ("" when it cannot be read: the run directory's check says why).
std::string job_of_token(const std::string& run_dir) {
  try {
    return workers::read_token_file(run_dir + "/job.token").first;
  } catch (const std::exception&) {
    return "";
  }
}

// How to train a run to `steps` steps instead of its own: a new run from its newest valid
// checkpoint before that step, named; or that it has none. (Only for a refusal: it reads the
// checkpoints it checks.)
std::string another_run_from(const coordinator::JobConfig& theirs, const std::string& path,
                             int64_t steps) {
  const std::string dir = coordinator::checkpoints_dir(theirs, path);
  const auto c =
      coordinator::newest_valid_checkpoint(dir, coordinator::checkpoint_identity(theirs), nullptr,
                                           uint64_t(std::max<int64_t>(steps, 1) - 1));
  if (!c)
    return "start a new run from one of its checkpoints, but it has none before step " +
           std::to_string(steps) + " (" + dir + ")";
  return "start a new run from its checkpoint of step " + std::to_string(c->step) + " (--resume " +
         c->directory + ")";
}

// --resume PATH: a checkpoint directory (a new run starts from it) or a run directory (the run
// goes on there from its newest valid checkpoint; newer ones that are not valid are named on
// stderr). Sets cfg.resume_* (and cfg.run_dir for a run directory); "" or why it cannot resume.
//
// The learning rate: the one in effect at the checkpoint (troupe lr, or an actor, may have
// changed it while the job ran), unless the command line sets optimizer.lr (lr_set).
//
// A run that did not end (its coordinator was lost) is taken over (cfg.take_over): its agents
// still alive are adopted and go on from their own state; the checkpoint, if any, is for the
// workers that start afresh. Its config must be the run's own (the agents run it).
// Another job.steps or job.name is taken where none of its agents can still be alive (each a
// process of this host that is gone, coordinator::may_come_back): none trains to the run's own
// or presents its token.
std::string take_over_refusal(const coordinator::JobConfig& cfg, const std::string& path,
                              const Hooks& hooks, const coordinator::RunRecord& record) {
  try {
    const auto theirs = coordinator::load_config(path + "/config.toml", {}, hooks.kinds());
    if (coordinator::checkpoint_config_hash(theirs) != coordinator::checkpoint_config_hash(cfg))
      return "the run was started with another model, data or seed (its config.toml): its agents "
             "may still be training that";
    const bool agents_may_live =
        coordinator::may_come_back(record.agents, {}, comm::host_identity(),
                                   [](uint32_t pid) { return comm::process_gone(int(pid)); });
    if (theirs.steps != cfg.steps && !agents_may_live && uint64_t(cfg.steps) <= record.committed)
      return "job.steps = " + std::to_string(cfg.steps) + ", but the run has committed " +
             std::to_string(record.committed) + " steps: nothing to train (to train on from an " +
             "earlier step, " + another_run_from(theirs, path, cfg.steps) + ")";
    if (const std::string job = job_of_token(path);
        agents_may_live && !job.empty() && job != cfg.name)
      return "job.name = '" + cfg.name + "', but its agents that may still be alive are job '" +
             job + "' (its job.token): a take-over goes on under that name (another where none " +
             "of them can be alive)";
    if (theirs.steps != cfg.steps && agents_may_live)
      return "job.steps = " + std::to_string(cfg.steps) + ", but the run was started with " +
             std::to_string(theirs.steps) + " (its config.toml): a take-over goes on with its " +
             "own (any of its agents still alive train to step " + std::to_string(theirs.steps) +
             "); to train to another step, " + another_run_from(theirs, path, cfg.steps);
  } catch (const coordinator::ConfigError& e) {
    return e.what();
  }
  return "";
}

// The run's own config (RUN_DIR/config.toml: its file and --set overrides as it was started), or
// nullopt and why it cannot be read ("" when there is none: an older Troupe's run).
std::optional<coordinator::JobConfig> own_config(const std::string& path, const Hooks& hooks,
                                                 std::string& why) {
  std::error_code ec;
  if (!std::filesystem::exists(path + "/config.toml", ec)) return std::nullopt;
  try {
    return coordinator::load_config(path + "/config.toml", {}, hooks.kinds());
  } catch (const coordinator::ConfigError& e) {
    why = e.what();
    return std::nullopt;
  }
}

// A run resumed with a config that differs from its own goes on with the new values: each is
// named on stderr (a resume with the run's file but without its --set overrides changed them
// unsaid). optimizer.lr only where it acts (lr_set): else the checkpoint's goes on.
void warn_of_changes(const coordinator::JobConfig& cfg, const std::string& path, bool lr_set,
                     const std::optional<coordinator::JobConfig>& own, const std::string& why) {
  if (!own) {
    if (!why.empty())
      std::fprintf(stderr,
                   "troupe: warning: --resume %s: what differs from the run's own config is not "
                   "named: %s\n",
                   path.c_str(), why.c_str());
    return;
  }
  const std::vector<std::string> changed = coordinator::config_differences(
      *own, cfg, lr_set ? std::vector<std::string>{} : std::vector<std::string>{"optimizer.lr"});
  for (const auto& c : changed)
    std::fprintf(stderr, "troupe: --resume %s: %s\n", path.c_str(), c.c_str());
  if (!changed.empty())
    std::fprintf(stderr,
                 "troupe: --resume %s goes on with the values above (troupe run %s/config.toml "
                 "--resume %s keeps the run's)\n",
                 path.c_str(), path.c_str(), path.c_str());
}

// Why the coordinator could not listen at cluster.listen (a host that does not resolve to IPv4, a
// port in use, an address not this host's), tried with a socket of its own before anything is
// made; "" when it can.
std::string listen_refusal(const std::string& listen) {
  const auto [host, port] = comm::split_host_port(listen);
  addrinfo hints{};
  hints.ai_family = AF_INET;  // (the control plane listens on IPv4, as comm::resolve)
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0 || !found)
    return "cluster.listen = \"" + listen + "\": cannot resolve host '" + host +
           "': " + ::gai_strerror(rc) + " (an IPv4 address or a name of one)";
  sockaddr_in a = *reinterpret_cast<const sockaddr_in*>(found->ai_addr);
  ::freeaddrinfo(found);
  a.sin_port = htons(port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // (as UCX's listener)
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  const int err = errno;
  ::close(fd);
  return bound ? ""
               : "cluster.listen = \"" + listen + "\": cannot listen there: " + std::strerror(err);
}

// cluster.listen and observability.metrics_listen on one port (of one host, or a wildcard's): the
// second listener would fail once the run directory is made; "" when they differ.
std::string address_clash(const coordinator::JobConfig& cfg) {
  if (cfg.metrics_listen.empty()) return "";
  const auto [control_host, control_port] = comm::split_host_port(cfg.listen);
  const auto [metrics_host, metrics_port] = comm::split_host_port(cfg.metrics_listen);
  auto any = [](const std::string& h) { return h == "0.0.0.0" || h == "[::]" || h == "::"; };
  if (control_port == 0 || control_port != metrics_port ||
      (control_host != metrics_host && !any(control_host) && !any(metrics_host)))
    return "";
  return "observability.metrics_listen = \"" + cfg.metrics_listen +
         "\" is the address cluster.listen (\"" + cfg.listen +
         "\") listens on: give the metrics another port";
}

// Whether the config resumed with has another learning rate than the run's own: that sets it,
// as --set optimizer.lr does (it was ignored without a word). Not for a take-over, whose agents
// train on with theirs.
bool lr_differs(const coordinator::JobConfig& cfg,
                const std::optional<coordinator::JobConfig>& own) {
  return own && !cfg.take_over && own->lr != cfg.lr;
}

// The resume's learning rate: the checkpoint's (troupe lr may have changed the run's) unless
// lr_set; where the checkpoint's replaces another configured one, that is said. config.toml keeps
// the configured rate (configured_lr): the changes are the run's history, not its config.
void choose_lr(coordinator::JobConfig& cfg, double checkpoint_lr, bool lr_set,
               const std::optional<coordinator::JobConfig>& own, const std::string& path) {
  cfg.resume_lr = lr_set ? 0 : checkpoint_lr;  // (0: the resume's rate replaces the run's changes)
  if (checkpoint_lr <= 0 || lr_set) return;
  cfg.configured_lr = own && cfg.take_over ? own->lr : cfg.lr;
  if (checkpoint_lr != cfg.lr && !cfg.take_over)
    std::fprintf(stderr,
                 "troupe: --resume %s: optimizer.lr goes on at the checkpoint's %.6g (the config "
                 "says %.6g: --set optimizer.lr=%.6g trains with that)\n",
                 path.c_str(), checkpoint_lr, cfg.lr, cfg.lr);
  cfg.lr = checkpoint_lr;
}

// --resume PATH that does not exist: said so, with the checkpoint's own name where PATH names one
// by its step unpadded (step-20 for step-00000020).
std::string missing_resume(const std::string& path, const std::error_code& why) {
  namespace fs = std::filesystem;
  std::string said = "--resume " + path + ": " + (why ? why.message() : "it does not exist");
  std::string dir = path;  // (step-40/ is step-40)
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string name = fs::path(dir).filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() <= 5 || name.size() > 13 ||
      name.find_first_not_of("0123456789", 5) != std::string::npos)
    return said;
  const fs::path other =
      fs::path(dir).parent_path() / actors::checkpoint_dir_name(std::stoull(name.substr(5)));
  std::error_code ec;
  if (fs::exists(other / "manifest.json", ec))
    said += " (a checkpoint's directory has 8 digits: " + other.string() + ")";
  return said;
}

// The checkpoint of another run that a run last resumed from (its record's, "" none or its
// own): a run that wrote none of its own goes on from there (its end said resume_from that one).
std::string resumed_from_elsewhere(const std::string& dir, const coordinator::RunRecord& record) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const std::string own = fs::weakly_canonical(dir, ec).string() + "/";
  const std::string& from = record.resumed_from;
  return from.empty() || fs::weakly_canonical(from, ec).string().rfind(own, 0) == 0 ? "" : from;
}

// A run's own checkpoints when none can be resumed: none, or those skipped (said above).
std::string own_checkpoints(const std::vector<std::string>& skipped) {
  return skipped.empty() ? "it has no checkpoint of its own"
                         : "none of its " + std::to_string(skipped.size()) +
                               " checkpoint(s) can be resumed (skipped above)";
}

std::string prepare_resume(coordinator::JobConfig& cfg, std::string path, bool lr_set,
                           const Hooks& hooks, bool& into_run) {
  namespace fs = std::filesystem;
  // (a checkpoint's manifest, as the stop line names it, stands for its directory)
  std::error_code ec;
  if (fs::path(path).filename() == "manifest.json" && fs::is_regular_file(path, ec))
    path = fs::absolute(path, ec).parent_path().string();
  if (!fs::exists(path, ec)) return missing_resume(path, ec);
  const coordinator::CheckpointIdentity hash = coordinator::checkpoint_identity(cfg);
  std::optional<coordinator::ValidCheckpoint> found;
  into_run = !fs::exists(fs::path(path) / "manifest.json");
  std::optional<coordinator::JobConfig> own;  // (the config of the run resumed, where known)
  if (!into_run) {
    std::string why;
    found = coordinator::valid_checkpoint(path, hash, &why);
    if (!found) return "--resume " + path + ": " + why;
    const fs::path in = fs::absolute(path, ec).lexically_normal().parent_path();
    if (in.filename() == "checkpoints") own = own_config(in.parent_path().string(), hooks, why);
    if (!lr_set && lr_differs(cfg, own)) {
      std::fprintf(stderr, "troupe: --resume %s: optimizer.lr = %.6g (its run's: %.6g)\n",
                   path.c_str(), cfg.lr, own->lr);
      lr_set = true;
    }
  } else {
    if (!fs::exists(fs::path(path) / "events.jsonl"))
      return "--resume " + path +
             ": neither a run directory (no events.jsonl) nor a checkpoint "
             "(no manifest.json)";
    const auto record = coordinator::read_run_record(coordinator::event_lines(path));
    cfg.take_over = record.started && !record.ended;
    if (cfg.take_over && record.generation > 0 && record.world_size == 0)
      return "--resume " + path + ": its events.jsonl says generation " +
             std::to_string(record.generation) +
             " started without a world size (a damaged file): a take-over could not tell when a "
             "step is complete";
    if (cfg.take_over)
      if (std::string why = take_over_refusal(cfg, path, hooks, record); !why.empty())
        return "--resume " + path + ": " + why;
    std::string unreadable;
    own = own_config(path, hooks, unreadable);
    lr_set = lr_set || lr_differs(cfg, own);
    warn_of_changes(cfg, path, lr_set, own, unreadable);
    const std::string dir = coordinator::checkpoints_dir(cfg, path);
    if (dir == path + "/checkpoints") cfg.checkpoint_dir.clear();  // (it goes on there)
    std::vector<std::string> refused;
    found = coordinator::newest_valid_checkpoint(dir, hash, &refused);
    for (const auto& r : refused)
      std::fprintf(stderr, "troupe: skipping checkpoint %s\n", r.c_str());
    const std::string asked = cfg.run_dir;
    cfg.run_dir = fs::absolute(path, ec).lexically_normal().string();  // (config.toml keeps it)
    if (ec) cfg.run_dir = path;
    while (cfg.run_dir.size() > 1 && cfg.run_dir.back() == '/') cfg.run_dir.pop_back();
    auto same = [&](std::string a, const std::string& b) {  // (a/ is a; a link, its target)
      while (a.size() > 1 && a.back() == '/') a.pop_back();
      return fs::weakly_canonical(a, ec) == fs::weakly_canonical(b, ec);
    };
    if (!asked.empty() && !same(asked, cfg.run_dir))
      std::fprintf(stderr,
                   "troupe: warning: --resume %s goes on in %s: job.run_dir = \"%s\" is not "
                   "used (a new run there goes on from one of its checkpoints: --resume "
                   "%s/checkpoints/step-NNNNNNNN)\n",
                   path.c_str(), cfg.run_dir.c_str(), asked.c_str(), path.c_str());
    if (const std::string from = found || cfg.take_over ? "" : resumed_from_elsewhere(path, record);
        !from.empty()) {  // (none of its own: the one it started from, another run's)
      std::string why;
      found = coordinator::valid_checkpoint(from, hash, &why);
      if (!found)
        return "--resume " + path + ": " + own_checkpoints(refused) + ", and " + from +
               ", which it started from: " + why;
      std::fprintf(stderr, "troupe: --resume %s: %s: it goes on from %s, which it started from\n",
                   path.c_str(), own_checkpoints(refused).c_str(), from.c_str());
    }
    if (!found && cfg.take_over) return "";   // (without adopted agents: from the seed)
    if (!found && !refused.empty() && own &&  // (another config's: the run's own resumes it)
        coordinator::checkpoint_config_hash(*own) != hash.hash)
      return "--resume " + path + ": no checkpoint in " + dir + " is of this config's model, " +
             "data and seed; the run's own config resumes it: troupe run " + path +
             "/config.toml --resume " + path;
    if (!found) return "--resume " + path + ": no valid checkpoint in " + dir;
  }
  if (found->step >= uint64_t(cfg.steps))
    return "--resume " + path + ": the checkpoint is at step " + std::to_string(found->step) +
           " and job.steps = " + std::to_string(cfg.steps) + ": nothing is left to run";
  cfg.resume_dir = fs::absolute(found->directory, ec).lexically_normal().string();
  cfg.resume_step = found->step;
  if (cfg.trace_last >= 0 && uint64_t(cfg.trace_last) < found->step)
    std::fprintf(
        stderr,
        "troupe: observability.trace_steps = \"%s\": those steps ran before step %llu, "
        "where this run goes on%s: none is traced\n",
        cfg.trace_steps.c_str(), (unsigned long long)found->step,
        cfg.take_over ? " (or later: its agents that come back go on from their own)" : "");
  cfg.resume_blocks = found->blocks;
  choose_lr(cfg, found->lr, lr_set, own, path);
  return "";
}

// A file of the run directory, whole, or RunDirError naming it (a directory in its place, a full
// disk): a run whose files cannot be read back is not started.
void write_run_file(const std::string& path, const std::string& text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out << text << std::flush;
  const int err = errno;  // (set by the open or the write that failed, if either did)
  if (!out)
    throw coordinator::RunDirError("cannot write " + path +
                                   (err ? std::string(": ") + std::strerror(err) : ""));
}

RunDir prepare_run_dir(coordinator::JobConfig& cfg, bool resuming) {
  RunDir d;
  const std::string path =
      cfg.run_dir.empty() ? coordinator::default_run_dir(cfg.name) : cfg.run_dir;
  std::error_code ec;  // (a name too long: RunDirectory says why)
  const bool made = !fs::exists(path, ec);
  d.owned = std::make_unique<coordinator::RunDirectory>(path, cfg.name, resuming);
  d.path = d.owned->path();
  try {
    resolve_checkpoint_dir(cfg, d.path);
    // (a run goes on with the directory's history when resumed into its run directory, or from
    // one of the directory's own checkpoints)
    const bool goes_on =
        resuming || (!cfg.resume_dir.empty() &&
                     fs::path(cfg.resume_dir).parent_path() == fs::path(cfg.checkpoint_dir));
    std::function<std::optional<uint64_t>()> earlier;
    if (!goes_on) earlier = [&cfg] { return coordinator::Checkpoints(cfg).newest_in_dir(); };
    if (!cfg.checkpoint_dir.empty()) d.owned->claim_checkpoints(cfg.checkpoint_dir, earlier);
  } catch (const coordinator::RunDirError&) {
    d.owned.reset();  // (a refusal leaves no run directory it made)
    std::error_code ec;
    if (made) fs::remove_all(path, ec);
    throw;
  }
  {  // (the run's own checkpoints/ stays relative: the directory may be moved or copied; the
     // data's paths are absolute: the run resumed from another directory reads the same data)
    coordinator::JobConfig effective = coordinator::with_absolute_paths(cfg);
    // (the rate as configured: the checkpoint's, which troupe lr may have changed, is the run's
    // history, not its config; a resume with another rate than this one sets it)
    if (cfg.configured_lr > 0) effective.lr = cfg.configured_lr;
    std::error_code ec;
    if (cfg.checkpoint_dir == fs::absolute(d.path + "/checkpoints", ec).lexically_normal().string())
      effective.checkpoint_dir.clear();
    write_run_file(d.path + "/config.toml", coordinator::to_toml(effective));
  }
  std::shared_ptr<spdlog::logger> log;
  try {  // (the token file, the log: a directory where they go is the run directory's fault)
    auto [job, token] = cfg.take_over ? workers::read_token_file(d.path + "/job.token")
                                      : std::pair<std::string, std::string>();
    if (cfg.take_over && job == cfg.name) {  // (its agents still alive present this token)
      d.token = token;
    } else {  // (a new run, or one taken over under another name: none of its agents lives)
      d.token = coordinator::new_token();
      coordinator::write_token_file(d.path + "/job.token", cfg.name, d.token);
    }
    log = spdlog::basic_logger_mt("coordinator", d.path + "/coordinator.log");
  } catch (const coordinator::RunDirError&) {
    throw;
  } catch (const std::exception& e) {
    throw coordinator::RunDirError("run directory " + d.path + ": " + e.what());
  }
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + cfg.name + "] [coordinator] [%l] %v");
  log->flush_on(spdlog::level::info);
  spdlog::set_default_logger(log);
  spdlog::set_level(spdlog::level::from_str(cfg.log_level));  // (logging.level)
  return d;
}

// What `troupe run` prints while the job runs: a progress line on a terminal; otherwise a line
// every 5% of the steps, and at least one a minute (a long job's log shows it is alive). Its rates
// are the wall clock's (pauses and recoveries count) over the steps of the last 3 s or more (one
// step's own, metrics.jsonl's, jumps with every step); in the first second, the step's own.
class ProgressPrinter {
 public:
  ProgressPrinter(bool tty, uint64_t steps, uint64_t global_batch)
      : tty_(tty),
        every_(std::max<uint64_t>(1, steps / 20)),
        batch_(global_batch),
        t0_(Clock::now()),
        since_{UINT64_MAX, t0_} {}
  void print(const coordinator::JobProgress& p) {
    last_ = p;
    const auto now = Clock::now();
    const double elapsed = std::chrono::duration<double>(now - t0_).count();
    const double left = p.step ? elapsed / double(p.step) * double(p.steps - p.step) : -1;
    // (Rates over the last 3 s or more: steps reach this process in bursts, and a line's rate
    // since the line before said 240,795 samples/s for a step of 1,834.)
    window_.emplace_back(p.step, now);
    while (window_.size() > 2 && now - window_[1].second > std::chrono::seconds(3))
      window_.pop_front();
    if (tty_) {
      const auto [samples, tokens] = rates(p, window_.front());
      std::printf("\r  step %llu/%llu%s  loss %.4f  %.0f samples/s  %.0f tokens/s  ETA %s   ",
                  (unsigned long long)p.step, (unsigned long long)p.steps, epoch(p).c_str(), p.loss,
                  samples, tokens, eta(left).c_str());
    } else if (p.step % every_ == 0 || p.step == p.steps ||
               now - since_.second > std::chrono::seconds(60)) {
      const auto [samples, tokens] = rates(p, window_.front());
      since_ = {p.step, now};
      std::printf("step %llu/%llu loss %.4f samples/s %.0f tokens/s %.0f world %llu%s\n",
                  (unsigned long long)p.step, (unsigned long long)p.steps, p.loss, samples, tokens,
                  (unsigned long long)p.world_size, epoch(p).c_str());
    }
    std::fflush(stdout);
  }
  // Samples and tokens a second from `from` (a step and when it was seen) to p, now; the step's own
  // where less than a second has passed.
  std::pair<double, double> rates(const coordinator::JobProgress& p,
                                  const std::pair<uint64_t, Clock::time_point>& from) const {
    const double seconds = std::chrono::duration<double>(Clock::now() - from.second).count();
    // (Steps reach this process in bursts: over less than a second, a burst's few microseconds
    // made a rate of hundreds of thousands of samples a second.)
    if (p.step <= from.first || seconds < 1) return {p.samples_per_s, p.tokens_per_s};
    const double samples = double(p.step - from.first) * double(batch_) / seconds;
    const double per_sample = p.samples_per_s > 0 ? p.tokens_per_s / p.samples_per_s : 0;
    return {samples, samples * per_sample};
  }
  void end() {
    if (tty_ && last_.step > 0) std::printf("\n");
  }
  static std::string epoch(const coordinator::JobProgress& p) {
    return p.epoch > 0 ? fmt::format(" epoch {:.3g}", p.epoch) : "";
  }
  // A membership change, on its own line (below the progress line on a terminal).
  void notice(const std::string& text) {
    std::printf("%stroupe: %s\n", tty_ && last_.step > 0 ? "\n" : "", text.c_str());
    std::fflush(stdout);
  }
  const coordinator::JobProgress& last() const { return last_; }

 private:
  bool tty_;
  uint64_t every_, batch_;
  Clock::time_point t0_;
  std::pair<uint64_t, Clock::time_point> since_;  // the last line's step (none yet: the most)
  std::deque<std::pair<uint64_t, Clock::time_point>> window_;  // the last 3 s (or more)
  coordinator::JobProgress last_;
};

// The local launcher's settings: `troupe agent` processes that join this coordinator.
coordinator::LauncherOptions launcher_options(const coordinator::JobConfig& cfg, const RunDir& dir,
                                              const std::string& address) {
  // (cluster.devices is cpu or cuda here: configure_job resolved auto and checked the GPUs.)
  const int gpus = cfg.devices == "cuda" ? std::max(1, comm::cuda_device_count()) : 1;
  std::string devices;
  for (int d = 0; d < cfg.devices_per_agent; ++d)
    devices += (d ? "," : "") + (cfg.devices == "cuda" ? "cuda:" + std::to_string(d % gpus)
                                                       : "cpu:" + std::to_string(d));
  coordinator::LauncherOptions o;
  o.program = coordinator::self_executable();
  o.agent_args = {"--join",
                  address,
                  "--token-file",
                  dir.path + "/job.token",
                  "--devices",
                  devices,
                  "--heartbeat-interval-ms",
                  std::to_string(cfg.heartbeat_interval_ms),
                  "--failure-timeout-ms",
                  std::to_string(cfg.failure_timeout_ms),
                  "--join-timeout-ms",  // (its coordinator listens before it starts: one try)
                  "0"};
  o.run_dir = dir.path;
  // Taking over a run: the coordinator starts the agents that did not come back, after a while,
  // named past the run's agents (adopted ones may live on under their names, into their logs).
  o.agents = cfg.take_over ? 0 : cfg.agents;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir.path, ec)) {
    const std::string f = e.path().filename().string();
    if (cfg.take_over && f.rfind("agent-", 0) == 0 && e.path().extension() == ".log")
      o.first_slot = std::max<int64_t>(o.first_slot, std::atoll(f.c_str() + 6) + 1);
  }
  o.restarts.max_restarts = cfg.max_restarts;
  return o;
}

actors::BridgeConfig bridge_config_of(const coordinator::JobConfig& cfg, const std::string& token) {
  actors::BridgeConfig bc = actors::job_bridge_config(cfg.name, token);
  auto [host, port] = comm::split_host_port(cfg.listen);
  bc.transport.listen_host = host;
  bc.transport.listen_port = port;
  bc.heartbeat_interval = std::chrono::milliseconds(cfg.heartbeat_interval_ms);
  bc.failure_timeout = std::chrono::milliseconds(cfg.failure_timeout_ms);
  return bc;
}

// The command that runs this program's agents: troupe, or a program's own (troupe::main: its
// kinds are not troupe's), quoted for a shell where its path needs it.
std::string program_of(const Hooks& hooks) {
  std::error_code ec;
  const std::string program =
      hooks.extensions ? std::filesystem::read_symlink("/proc/self/exe", ec).string() : "troupe";
  if (ec) return "troupe";
  return program.find_first_of(" \t'\"\\$") == std::string::npos ? program : "'" + program + "'";
}

void print_start(const coordinator::JobConfig& cfg, const std::string& dir,
                 const std::string& address, bool local_agents, const std::string& program) {
  std::printf("troupe: job '%s', %lld worker(s), %lld steps; run directory %s\n", cfg.name.c_str(),
              (long long)cfg.workers(), (long long)cfg.steps, dir.c_str());
  if (cfg.take_over)
    std::printf(
        "troupe: taking the run over: its agents still alive join again (within "
        "elastic.rejoin_timeout_ms) and go on from their own state\n");
  else if (!cfg.resume_dir.empty())
    std::printf("troupe: resuming at step %llu from %s\n", (unsigned long long)cfg.resume_step,
                cfg.resume_dir.c_str());
  if (cfg.external())  // (troupe agent refuses such a job: its members are the user's program)
    std::printf(
        "troupe: coordinator at %s; model.kind = \"external\": your program's members join it "
        "(troupe::ElasticLoop, LoopOptions{\"%s\", \"%s/job.token\"})\n",
        address.c_str(), address.c_str(), dir.c_str());
  else if (!local_agents)
    std::printf(
        "troupe: coordinator at %s; agents join with: %s agent --join %s --token-file "
        "%s/job.token\n",
        address.c_str(), program.c_str(), address.c_str(), dir.c_str());
  std::fflush(stdout);
}

// Until the job ends: progress lines, and SIGINT/SIGTERM forwarded to the coordinator (the
// first stops the job at the next step boundary, a second at once). The coordinator's own
// deadlines bound every phase, and its monitor ends the wait if the actor itself is gone.
coordinator::JobFinished wait_for_end(caf::scoped_actor& self, const caf::actor& coord,
                                      actors::SignalWatcher& signals, ProgressPrinter& progress) {
  coordinator::JobFinished end{1, "the coordinator stopped without a result", "failed", 0, 0, ""};
  int seen = 0;
  for (bool done = false; !done;) {
    self->receive([&](coordinator::JobProgress& p) { progress.print(p); },
                  [&](coordinator::JobNotice& n) { progress.notice(n.text); },
                  [&](coordinator::JobFinished& f) { end = f, done = true; },
                  [&](caf::down_msg&) { done = true; },
                  caf::after(std::chrono::milliseconds(200)) >> [] {});
    for (int sig; !done && (sig = signals.next()) != 0;) {
      progress.end();
      std::fprintf(stderr, "troupe: %s: %s\n", actors::signal_name(sig),
                   ++seen == 1 ? "stopping after the current step (again to stop at once)"
                               : "stopping at once");
      caf::anon_send(coord, coordinator::interrupt_atom::value, int32_t(sig));
    }
  }
  progress.end();
  return end;
}

// How the run goes on: with its own config.toml, as it ran (another config's keys would change what
// it computes: parallel.deterministic, the data; a resume only warns of them).
std::string resume_command(const std::string& dir) {
  return "troupe run " + dir + "/config.toml --resume " + dir;
}

// The job's last line, and the exit status: 0 completed, or stopped (`troupe stop`; a signal with
// the checkpoint it asks for: resumable), 1 failed, 2 refused before it started, 128 + the signal
// when a signal stopped it without a checkpoint.
int report_end(const coordinator::JobConfig& cfg, const std::string& dir,
               const coordinator::JobFinished& end, int first_signal) {
  if (end.exit_code != 0) {
    std::fprintf(stderr, "troupe: job '%s' failed after %llu steps: %s (see %s)\n",
                 cfg.name.c_str(), (unsigned long long)end.steps, end.reason.c_str(), dir.c_str());
    if (!end.checkpoint.empty())  // (what was saved is not lost: say where it goes on from)
      std::fprintf(stderr, "troupe: its newest checkpoint is %s: %s\n", end.checkpoint.c_str(),
                   resume_command(dir).c_str());
    return first_signal ? 128 + first_signal : end.exit_code;
  }
  const bool stopped = end.state == "stopped";
  char loss[48] = "";  // (none when it trained no step: it said "loss 0.0000")
  if (end.steps > cfg.resume_step && !std::isnan(end.loss))
    std::snprintf(loss, sizeof loss, ", loss %.4f", end.loss);
  std::printf("troupe: job '%s' %s after %llu of %lld steps%s (%s)\n", cfg.name.c_str(),
              stopped ? "stopped" : "finished", (unsigned long long)end.steps, (long long)cfg.steps,
              loss, dir.c_str());
  // Stopped with a checkpoint where it stopped (the preemption pattern: SIGTERM, then later the
  // same job again): resumable, and not a failure.
  const bool where_it_stopped =
      end.checkpoint.find("/" + actors::checkpoint_dir_name(end.steps) + "/") != std::string::npos;
  if (stopped && !end.checkpoint.empty() && where_it_stopped) {
    std::printf("troupe: resumable from %s: %s\n", end.checkpoint.c_str(),
                resume_command(dir).c_str());
    return 0;
  }
  if (stopped && !end.checkpoint.empty())  // (stopped without one: an older one)
    std::printf(
        "troupe: its newest checkpoint is %s: %s goes on from there (the steps after it "
        "again)\n",
        end.checkpoint.c_str(), resume_command(dir).c_str());
  else if (stopped && !cfg.external())  // (nothing to resume from: say so, and how to keep one)
    std::printf(
        "troupe: it wrote no checkpoint, so nothing resumes or exports from it (troupe stop "
        "--checkpoint, a SIGTERM or checkpoint.every_steps keep one)\n");
  return stopped && first_signal ? 128 + first_signal : 0;
}

// A model that cannot fit is refused before anything starts: every worker on this machine holds
// its parameters, gradients and optimizer moments in f32 (a lower bound: activations come on
// top). With the local launcher every worker is here; a pipeline splits the model over them.
// parallel.deterministic keeps a gradient copy per local micro-batch but the last (ExactSum).
//
// A program's own model or data set is opened and built as its workers will (the model lazily:
// no memory), so a kind that cannot be built is refused here too.
std::string added_kinds_refusal(const coordinator::JobConfig& cfg, const Hooks& hooks,
                                std::vector<size_t>& block_params) {
  workers::WorkerSpec w = workers::worker_spec_of(coordinator::job_spec_of(cfg, 0, 1));
  w.extensions = hooks.extensions;
  try {
    models::ModelSpec m = w.model;
    auto data = workers::open_dataset(w, m);
    models::LazyParameters lazy;
    block_params = workers::build_model(w, m, *data)->block_param_counts();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// parallel.max_params_per_worker against a built-in model's blocks (counted without building
// it): a block above the budget fits no layout, and one stage (pipeline_stages = 1) holds the
// whole model. "" or why the budget cannot be met.
std::string budget_refusal(const coordinator::JobConfig& cfg, const models::ModelSpec& m) {
  const int64_t budget = cfg.max_params_per_worker;
  if (budget <= 0) return "";
  const std::string key = "parallel.max_params_per_worker = " + std::to_string(budget);
  const std::vector<size_t> counts = models::Model::planned_block_param_counts(m);
  size_t total = 0;
  for (size_t b = 0; b < counts.size(); ++b) {
    total += counts[b];
    if (counts[b] > size_t(budget))
      return key + ": block " + std::to_string(b) + " of the model has " +
             std::to_string(counts[b]) + " parameters, and no layout splits a block";
  }
  if (cfg.pipeline_stages == 1 && total > size_t(budget))
    return key + ": the model's " + std::to_string(total) +
           " parameters are one stage's (parallel.pipeline_stages = 1); set "
           "parallel.pipeline_stages = \"auto\" (the planner splits the model) or more stages";
  const int64_t stages =
      elastic::fewest_stages(std::vector<uint64_t>(counts.begin(), counts.end()), uint64_t(budget));
  const std::string need = key + ": the model's " + std::to_string(total) +
                           " parameters need at least " + std::to_string(stages) +
                           " pipeline stages";
  if (stages > cfg.workers())
    return need + ", one worker each, and the job has " + std::to_string(cfg.workers()) +
           " worker(s)";
  if (cfg.pipeline_stages > 1 && stages > cfg.pipeline_stages)
    return need + "; parallel.pipeline_stages = " + std::to_string(cfg.pipeline_stages);
  return "";
}

//
// The model's blocks' parameter counts go to cfg.block_params (every worker is checked against
// them), except for text data, whose vocabulary only its workers read.
std::string memory_refusal(coordinator::JobConfig& cfg, const Hooks& hooks) {
  if (cfg.external()) return "";  // (the members' own loop holds its own state)
  const workers::WorkerSpec w = workers::worker_spec_of(coordinator::job_spec_of(cfg, 0, 1));
  models::ModelSpec m = w.model;
  std::vector<size_t> blocks;
  if (!cfg.builtin_model() || !cfg.builtin_data()) {
    if (std::string why = added_kinds_refusal(cfg, hooks, blocks); !why.empty()) return why;
  }
  if (m.kind == "gpt") m.vocab = 256;  // (byte-level text: at most 256 characters)
  if (cfg.data_kind == "tokens") {  // (the data sets opened as the workers will: a clear refusal)
    try {
      const data::TokenData train(workers::token_sources(w), m.context, w.seed, w.eval_fraction);
      m.vocab = train.vocab();
      if (w.eval_every > 0 && !w.eval_path.empty() &&
          data::TokenData({{w.eval_path, 1.0}}, m.context, w.seed, 1.0).tokenizer_fingerprint() !=
              train.tokenizer_fingerprint())
        return "data.eval_path '" + w.eval_path +
               "' was tokenized differently from the training data (" +
               data::same_tokenizer_advice(workers::token_sources(w)[0].path) + ")";
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  // (For text its vocabulary, the data's characters, is known only once it is read: counted as
  // 1, the blocks' counts are at least these, and a budget they miss is missed.)
  if (cfg.builtin_model()) {
    models::ModelSpec least = m;
    if (cfg.data_kind == "text") least.vocab = 1;
    if (std::string why = budget_refusal(cfg, least); !why.empty())
      return why + (cfg.data_kind == "text" ? " (counting the text's characters as one)" : "");
    // (how many blocks, whatever the vocabulary: a checkpoint of another count is skipped)
    cfg.model_blocks = models::Model::planned_block_param_counts(least).size();
  }
  if (blocks.empty() && cfg.data_kind != "text")
    blocks = models::Model::planned_block_param_counts(m);
  // (a stage holds at least one block: more stages churned for elastic.rejoin_timeout_ms, every
  // worker failing "no pipeline layout", then failed naming elastic.min_workers)
  const size_t model_blocks = blocks.empty() ? size_t(cfg.model_blocks) : blocks.size();
  if (model_blocks > 0 && size_t(cfg.pipeline_stages) > model_blocks)
    return "parallel.pipeline_stages = " + std::to_string(cfg.pipeline_stages) +
           ", but the model has only " + std::to_string(model_blocks) +
           " block(s): a stage holds one or more";
  cfg.block_params.assign(blocks.begin(), blocks.end());
  const double params = blocks.empty()
                            ? double(models::Model::planned_param_count(m))
                            : double(std::accumulate(blocks.begin(), blocks.end(), size_t(0)));
  const int64_t micro_batches = cfg.global_batch / cfg.micro_batch, workers = cfg.workers();
  const double stashed =
      cfg.deterministic ? double((micro_batches + workers - 1) / workers - 1) : 0.0;
  const double per_worker = params * 4.0 * ((cfg.optimizer == "adamw" ? 4 : 3) + stashed);
  const double here =
      cfg.launcher == "local" && cfg.pipeline_stages == 1 ? double(cfg.workers()) : 1.0;
  const double have = double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
  if (per_worker * here <= have) return "";
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "the model has %.3g parameters: with their gradients and optimizer moments in "
                "f32%s it needs at least %.1f GiB per worker, %.1f GiB for the %.0f worker(s) on "
                "this machine, which has %.1f GiB of memory (model.* sets the size)",
                params, stashed > 0 ? " (and parallel.deterministic's gradient copies)" : "",
                per_worker / 1073741824.0, per_worker * here / 1073741824.0, here,
                have / 1073741824.0);
  return msg;
}

// Where the value of one of `keys` came from, for a refusal: the file, a --set of it, or
// --listen (a value from --listen or a --set was named as the file's).
std::string origin_of(const std::vector<std::string>& keys, const std::string& path,
                      const std::vector<std::string>& sets, const std::string& listen) {
  std::string where = path;
  for (const std::string& key : keys)
    for (const std::string& s : sets)
      if (coordinator::override_key(s) == key) where = "--set " + key;
  if (!listen.empty() && keys[0] == "cluster.listen") where = "--listen " + listen;
  return where;
}

// observability.metrics_listen: the job's metrics and their endpoint (its bound address goes
// to RUN_DIR/metrics.addr). Nothing when the key is not set; throws std::runtime_error naming the
// address when it cannot listen.
struct Metrics {
  std::shared_ptr<coordinator::JobMetrics> values;
  std::unique_ptr<coordinator::MetricsServer> server;
  void write_address(const std::string& run_dir) const {
    if (!server) return;
    std::ofstream(run_dir + "/metrics.addr") << server->address() << "\n";
    spdlog::info("metrics at http://{}/metrics", server->address());
  }
};
Metrics start_metrics(const coordinator::JobConfig& cfg) {
  Metrics m;
  if (cfg.metrics_listen.empty()) return m;
  m.values = std::make_shared<coordinator::JobMetrics>(cfg.name);
  m.server = std::make_unique<coordinator::MetricsServer>(
      cfg.metrics_listen, [v = m.values] { return v->exposition(); });
  return m;
}

// The job's config: loaded with the overrides, checked against this machine's memory, and
// --resume applied (into_run: it goes on in that run directory). 0, or 2 with the reason printed.
// cluster.devices for the local launcher's agents: auto becomes cuda where this program can open
// a GPU, else cpu; cuda where it cannot is refused, saying why ("" when fine). Agents started by
// hand check their own --devices.
std::string resolve_devices(coordinator::JobConfig& cfg) {
  if (cfg.external() || cfg.devices == "cpu") {
    if (cfg.devices == "auto") cfg.devices = "cpu";
    return "";
  }
  std::string why = comm::cuda_device_count() == 0 && cfg.devices == "auto"
                        ? "no GPU"
                        : models::cuda_workers_unavailable();
  if (cfg.devices == "auto") {
    cfg.devices = why.empty() ? "cuda" : "cpu";
    return "";
  }
  return why.empty() ? "" : "cluster.devices = \"cuda\": " + why;
}

// parallel.backend = "nccl" for the local launcher's workers (devices resolved): each needs a
// GPU of its own ("" when they have one). Agents started by hand are checked when a generation
// forms (workers/device_plane.h).
std::string check_local_nccl(const coordinator::JobConfig& cfg) {
  if (cfg.backend != "nccl") return "";
  const std::string fix = "; \"auto\" picks NCCL where it can serve the workers";
  if (cfg.devices != "cuda")
    return "parallel.backend = \"nccl\": the workers compute on the CPU (no GPU here)" + fix;
  const int gpus = comm::cuda_device_count();
  if (cfg.workers() > gpus)
    return "parallel.backend = \"nccl\" needs a GPU per worker: " + std::to_string(cfg.workers()) +
           " workers on " + std::to_string(gpus) + " GPU(s) (NCCL refuses two ranks on one GPU)" +
           fix;
  return "";
}

// data.verify: every token data set the job reads, its files read whole and compared with the
// checksums its manifest holds ("" when they match). Says how long it took when that is long.
std::string data_refusal(const coordinator::JobConfig& cfg) {
  if (cfg.data_kind != "tokens" || !cfg.verify_data) return "";
  std::vector<std::string> dirs;  // (as workers::token_sources: data.mix, or data.path)
  for (const auto& [dir, weight] : cfg.data_mix) dirs.push_back(dir);
  if (dirs.empty()) dirs.push_back(cfg.data_path);
  if (!cfg.eval_path.empty()) dirs.push_back(cfg.eval_path);
  const auto start = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (const std::string& dir : dirs) {
    std::vector<std::string> bad;
    try {
      const auto set = data::TokenShards::open(dir);
      bad = set->verify(std::max(1u, std::thread::hardware_concurrency()),
                        data::TokenShards::kShardsOnly);  // (what training reads)
      bytes += set->tokens() * set->token_bytes();
    } catch (const std::exception& e) {
      return e.what();
    }
    if (!bad.empty())
      return "data set '" + dir + "' changed since it was prepared: " + bad[0] +
             (bad.size() > 1 ? " (and " + std::to_string(bad.size() - 1) + " more)" : "") +
             "; prepare or import it again (data.verify = false trains on it as it is)";
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s >= 2)
    std::fprintf(stderr,
                 "troupe: data.verify: read %.1f GB of token files in %.1f s (every checksum "
                 "matches; data.verify = false skips it)\n",
                 double(bytes) / 1e9, s);
  return "";
}

int configure_job(const std::string& path, const std::vector<std::string>& sets,
                  const std::string& listen, const std::string& resume, bool spawn_agents,
                  const Hooks& hooks, coordinator::JobConfig& cfg, bool& into_run) {
  try {
    cfg = coordinator::load_config(path, sets, hooks.kinds());
  } catch (const coordinator::ConfigError& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    // (The run's own config names its data absolute, with its --set overrides.)
    const std::string own = resume + "/config.toml";
    std::error_code ec;
    if (!resume.empty() && path != own && std::filesystem::is_regular_file(own, ec))
      std::fprintf(stderr,
                   "troupe: the run's own config, as it started: troupe run %s --resume %s\n",
                   own.c_str(), resume.c_str());
    return 2;
  }
  if (!listen.empty() && !coordinator::host_and_port(listen)) {
    std::fprintf(stderr,
                 "troupe: --listen %s is not HOST:PORT (e.g. 127.0.0.1:0; port 0 picks one)\n",
                 listen.c_str());
    return 2;
  }
  if (!listen.empty()) cfg.listen = listen;
  if (!cfg.inert_key.empty() && resume.empty()) {
    std::fprintf(stderr, "troupe: %s\n", cfg.inert_key.c_str());
    return 2;
  }
  if (!cfg.inert_key.empty())  // (the run's checkpoints name its config as it was)
    std::fprintf(stderr, "troupe: warning: %s\n", cfg.inert_key.c_str());
  if (!spawn_agents || cfg.external()) cfg.launcher = "external";
  if (std::string why = memory_refusal(cfg, hooks); !why.empty()) {
    std::fprintf(stderr, "troupe: %s: %s\n", path.c_str(), why.c_str());
    return 2;
  }
  if (std::string why = data_refusal(cfg); !why.empty()) {
    std::fprintf(stderr, "troupe: %s: %s\n", path.c_str(), why.c_str());
    return 2;
  }
  auto refused = [&](std::vector<std::string> keys, const std::string& why) {
    std::fprintf(stderr, "troupe: %s: %s\n", origin_of(keys, path, sets, listen).c_str(),
                 why.c_str());
    return 2;
  };
  if (std::string why = address_clash(cfg); !why.empty())
    return refused({"cluster.listen", "observability.metrics_listen"}, why);
  if (std::string why = listen_refusal(cfg.listen); !why.empty())
    return refused({"cluster.listen"}, why);
  if (std::string why = resolve_devices(cfg); !why.empty())
    return refused({"cluster.devices"}, why);
  if (std::string why = spawn_agents ? check_local_nccl(cfg) : ""; !why.empty())
    return refused({"parallel.backend"}, why);
  if (resume.empty()) return 0;
  const bool lr_set = std::any_of(sets.begin(), sets.end(), [](const std::string& s) {
    return coordinator::override_key(s) == "optimizer.lr";  // (any spelling: "optimizer.lr = 3")
  });
  if (std::string why = prepare_resume(cfg, resume, lr_set, hooks, into_run); !why.empty()) {
    std::fprintf(stderr, "troupe: %s\n", why.c_str());
    return 2;
  }
  return 0;
}

// Runs a job: the coordinator here, agents spawned locally (launcher local) or started by hand.
int run_job(const std::vector<std::string>& words, bool spawn_agents, const Hooks& hooks) {
  CLI::App app{spawn_agents
                   ? "Trains a job: the coordinator here and its agents on this machine "
                     "(cluster.agents), until the job ends."
                   : "Runs a job's coordinator; agents join it with `troupe agent --join`.",
               spawn_agents ? "troupe run" : "troupe coordinator"};
  std::string path, listen;
  std::vector<std::string> sets;
  app.add_option("CONFIG", path, "the job's TOML file (docs/config.md)")->required();
  app.add_option("--set", sets, "overrides a key: table.key=value (TOML syntax), repeatable")
      ->type_name("KEY=VALUE");
  app.add_option("--listen", listen, "the coordinator's HOST:PORT (cluster.listen)");
  std::string resume;
  app.add_option("--resume", resume,
                 "RUN_DIR: go on in it from its newest valid checkpoint; or a checkpoint's "
                 "directory: a new run starts from it");
  if (auto rc = parse(app, words)) return *rc;
  if (app.count("--resume") && resume.empty()) {  // (an unset shell variable: not a new run)
    std::fprintf(stderr, "troupe run: --resume names no run directory or checkpoint\n");
    return 2;
  }
  coordinator::JobConfig cfg;
  bool into_run = false;
  if (int rc = configure_job(path, sets, listen, resume, spawn_agents, hooks, cfg, into_run))
    return rc;
  actors::SignalWatcher signals;  // (before any thread starts)
  Metrics metrics;                // (before the run directory: a refusal leaves none)
  try {
    metrics = start_metrics(cfg);
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "troupe: %s: %s\n",
                 origin_of({"observability.metrics_listen"}, path, sets, listen).c_str(), e.what());
    return 2;
  }
  RunDir dir;
  try {
    dir = prepare_run_dir(cfg, into_run);
  } catch (const coordinator::RunDirError& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    return 2;
  }
  metrics.write_address(dir.path);

  caf::actor_system_config sys_cfg;
  coordinator::configure_job_system(sys_cfg);
  actors::TeardownDeadline deadline;  // (destroyed after the system: disarmed with it)
  caf::actor_system system{sys_cfg};
  auto bridge = actors::spawn_bridge(system, bridge_config_of(cfg, dir.token));
  caf::scoped_actor self{system};
  caf::actor coord;
  try {
    coord = coordinator::spawn_coordinator(system, bridge, cfg, dir.path, self, metrics.values);
  } catch (const std::runtime_error& e) {  // (its run log: e.g. events.jsonl a directory)
    std::fprintf(stderr, "troupe: %s\n", e.what());
    deadline.arm(std::chrono::seconds(30), 2, "troupe");
    return 2;
  }
  self->monitor(coord);
  std::string address;
  self->request(bridge, std::chrono::seconds(5), actors::info_atom::value)
      .receive([&](uint64_t, std::string& a) { address = a; }, [](caf::error&) {});
  try {
    write_run_file(dir.path + "/coordinator.addr", address + "\n");
  } catch (const coordinator::RunDirError& e) {  // (status, stop, agents read it)
    std::fprintf(stderr, "troupe: %s\n", e.what());
    caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
    deadline.arm(std::chrono::seconds(30), 2, "troupe");
    return 2;
  }
  print_start(cfg, dir.path, address, cfg.launcher == "local", program_of(hooks));
  caf::actor launcher;
  if (spawn_agents && cfg.launcher == "local")
    launcher =
        coordinator::spawn_local_launcher(system, launcher_options(cfg, dir, address), coord);

  ProgressPrinter progress(isatty(STDOUT_FILENO) && cfg.progress, uint64_t(cfg.steps),
                           uint64_t(cfg.global_batch));
  coordinator::JobFinished end = wait_for_end(self, coord, signals, progress);
  if (launcher) {
    // Agents finish by themselves (10 s at most); after a second signal they are killed now.
    const int64_t grace_ms = signals.count() > 1 ? 0 : 10000;
    self->request(launcher, std::chrono::seconds(30), coordinator::stop_atom::value, grace_ms)
        .receive([](bool) {}, [](caf::error&) {});
    caf::anon_send_exit(launcher, caf::exit_reason::user_shutdown);
  }
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  const int rc = report_end(cfg, dir.path, end, signals.first());
  deadline.arm(std::chrono::seconds(30), rc, "troupe");
  return rc;
}

// A device an agent offers: cpu:N, or cuda:N where this program can open that GPU (exit 2
// otherwise, saying why: never a CPU worker in its place).
std::string checked_device(const std::string& d) {
  auto index_ok = [&](size_t at) {
    return d.size() > at && d.find_first_not_of("0123456789", at) == std::string::npos &&
           d.size() - at <= 4;
  };
  if (d.rfind("cpu:", 0) == 0 && index_ok(4)) return d;
  if (d.rfind("cuda:", 0) != 0 || !index_ok(5))
    throw std::invalid_argument("device '" + d + "' is not cpu:N or cuda:N");
  int gpus = 0;
  if (std::string why = models::cuda_workers_unavailable(&gpus); !why.empty())
    throw std::invalid_argument("device '" + d + "': " + why);
  if (std::stoi(d.substr(5)) >= gpus)
    throw std::invalid_argument("device '" + d + "': this machine has " + std::to_string(gpus) +
                                " GPU(s) (CUDA_VISIBLE_DEVICES counts)");
  return d;
}

// An agent's devices when --devices is not given: one worker per visible GPU, else cpu:0.
std::vector<std::string> default_devices() {
  int gpus = 0;
  if (comm::cuda_device_count() == 0 || !models::cuda_workers_unavailable(&gpus).empty())
    return {"cpu:0"};
  std::vector<std::string> out;
  for (int g = 0; g < gpus; ++g) out.push_back("cuda:" + std::to_string(g));
  return out;
}

}  // namespace

int run_run(const std::vector<std::string>& words, const Hooks& hooks) {
  return run_job(words, true, hooks);
}
int run_coordinator(const std::vector<std::string>& words, const Hooks& hooks) {
  return run_job(words, false, hooks);
}

int run_agent_command(const std::vector<std::string>& words, const Hooks& hooks) {
  CLI::App app{
      "Joins a job's coordinator and trains on this machine's devices until the job "
      "ends (SIGTERM: leave at the next step boundary).",
      "troupe agent"};
  workers::AgentOptions o;
  std::string token_file, devices;
  int64_t heartbeat_ms = 200, failure_ms = 3000;
  app.add_option("--join", o.join,
                 "the coordinator's HOST:PORT (its run directory's "
                 "coordinator.addr)")
      ->required();
  app.add_option("--token-file", token_file, "the job's token file (RUN_DIR/job.token)")
      ->required();
  app.add_option(
      "--devices", devices,
      "the devices it offers, e.g. cpu:0,cpu:1 or cuda:0,cuda:1 (default: one worker per "
      "visible GPU, CUDA_VISIBLE_DEVICES respected, else cpu:0)");
  app.add_option("--name", o.name, "its name in logs and events (default host:pid)");
  int64_t join_timeout_ms = 60000;
  app.add_option("--join-timeout-ms", join_timeout_ms,
                 "how long it waits for a coordinator that is not listening yet (default 60000; "
                 "0: one try)")
      ->check(number_in(0, 86400000));
  app.add_option("--heartbeat-interval-ms", heartbeat_ms,
                 "control-plane heartbeats (default: the job's elastic.heartbeat_interval_ms "
                 "once joined, 200 until then)")
      ->check(number_in(1, 600000));
  app.add_option("--failure-timeout-ms", failure_ms,
                 "a silent coordinator is lost after this (default: the job's "
                 "elastic.failure_timeout_ms once joined, 3000 until then)")
      ->check(number_in(1, 3600000));
  if (auto rc = parse(app, words)) return *rc;
  if (!address_to_reach(o.join)) {  // (it was "cannot reach", exit 1, after a start)
    std::fprintf(stderr,
                 "troupe agent: --join %s is not HOST:PORT with a port (the coordinator's "
                 "address: its run directory's coordinator.addr)\n",
                 o.join.c_str());
    return 2;
  }
  if (app.count("--devices")) {  // (first: a device this build cannot use is refused before all)
    o.devices.clear();
    std::stringstream ss(devices);
    for (std::string d; std::getline(ss, d, ',');) o.devices.push_back(checked_device(d));
    if (o.devices.empty())
      throw std::invalid_argument("--devices names no device (cpu:0,cpu:1,...)");
  } else {
    o.devices = default_devices();
  }
  std::tie(o.job_id, o.token) = workers::read_token_file(token_file);
  // (A coordinator that takes the run over writes its address next to the token.)
  o.address_file = (std::filesystem::path(token_file).parent_path() / "coordinator.addr").string();
  if (hooks.faults) o.faults = hooks.faults();
  o.extensions = hooks.extensions;
  o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  o.failure_timeout = std::chrono::milliseconds(failure_ms);
  o.own_heartbeat = app.count("--heartbeat-interval-ms") > 0;
  o.own_failure_timeout = app.count("--failure-timeout-ms") > 0;
  o.join_timeout = std::chrono::milliseconds(join_timeout_ms);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + o.job_id + "] [" +
                      (o.name.empty() ? "agent" : o.name) + "] [%l] %v");
  o.own_process = true;  // (a teardown past 10 s is left behind: workers/agent.cpp)
  return workers::run_agent(o);
}

}  // namespace troupe::cli
