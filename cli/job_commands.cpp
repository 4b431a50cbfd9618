// `troupe run`, `troupe coordinator`, `troupe agent`, `troupe status`, `troupe stop`.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "actors/bridge.h"
#include "actors/services.h"
#include "cli/commands.h"
#include "coordinator/config.h"
#include "coordinator/events.h"
#include "coordinator/job.h"
#include "coordinator/launcher.h"
#include "coordinator/process.h"
#include "workers/agent.h"

namespace troupe::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

std::string default_run_dir(const std::string& name) {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", std::localtime(&t));
  return "runs/" + name + "-" + buf + "-" + std::to_string(getpid());
}

std::string eta(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  int s = int(seconds);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d", s / 60, s % 60);
  return buf;
}

// The run directory: its effective config, its token, and the coordinator's log.
struct RunDir {
  std::string path, token;
};

RunDir prepare_run_dir(const coordinator::JobConfig& cfg) {
  RunDir d{cfg.run_dir.empty() ? default_run_dir(cfg.name) : cfg.run_dir, coordinator::new_token()};
  fs::create_directories(d.path);
  { std::ofstream(d.path + "/config.toml") << coordinator::to_toml(cfg); }
  coordinator::write_token_file(d.path + "/job.token", cfg.name, d.token);
  auto log = spdlog::basic_logger_mt("coordinator", d.path + "/coordinator.log");
  log->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + cfg.name + "] [coordinator] [%l] %v");
  log->flush_on(spdlog::level::info);
  spdlog::set_default_logger(log);
  return d;
}

// What `troupe run` prints while the job runs: a progress line on a terminal, every 5% otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter(bool tty, uint64_t steps)
      : tty_(tty), every_(std::max<uint64_t>(1, steps / 20)), t0_(Clock::now()) {}
  void print(const coordinator::JobProgress& p) {
    last_ = p;
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
    const double left = p.step ? elapsed / double(p.step) * double(p.steps - p.step) : -1;
    if (tty_) {
      std::printf("\r  step %llu/%llu  loss %.4f  %.0f samples/s  %.0f tokens/s  ETA %s   ",
                  (unsigned long long)p.step, (unsigned long long)p.steps, p.loss, p.samples_per_s,
                  p.tokens_per_s, eta(left).c_str());
    } else if (p.step % every_ == 0 || p.step == p.steps) {
      std::printf("step %llu/%llu loss %.4f samples/s %.0f tokens/s %.0f world %llu\n",
                  (unsigned long long)p.step, (unsigned long long)p.steps, p.loss, p.samples_per_s,
                  p.tokens_per_s, (unsigned long long)p.world_size);
    }
    std::fflush(stdout);
  }
  void end() {
    if (tty_) std::printf("\n");
  }
  const coordinator::JobProgress& last() const { return last_; }

 private:
  bool tty_;
  uint64_t every_;
  Clock::time_point t0_;
  coordinator::JobProgress last_;
};

// The local launcher's settings: `troupe agent` processes that join this coordinator.
coordinator::LauncherOptions launcher_options(const coordinator::JobConfig& cfg, const RunDir& dir,
                                              const std::string& address) {
  std::string devices;
  for (int d = 0; d < cfg.devices_per_agent; ++d)
    devices += (d ? ",cpu:" : "cpu:") + std::to_string(d);
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
                  std::to_string(cfg.failure_timeout_ms)};
  o.run_dir = dir.path;
  o.agents = cfg.agents;
  o.restarts.max_restarts = cfg.max_restarts;
  return o;
}

// Runs a job: the coordinator here, agents spawned locally (launcher local) or started by hand.
int run_job(const std::vector<std::string>& words, bool spawn_agents) {
  Args args(words, {"set", "listen"}, {});
  if (args.positional().size() != 1) throw std::invalid_argument("expected one CONFIG.toml");
  coordinator::JobConfig cfg;
  try {
    cfg = coordinator::load_config(args.positional()[0], args.all("set"));
  } catch (const coordinator::ConfigError& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    return 2;
  }
  if (args.has("listen")) cfg.listen = args.get("listen");
  if (!spawn_agents) cfg.launcher = "external";
  const RunDir dir = prepare_run_dir(cfg);

  caf::actor_system_config sys_cfg;
  coordinator::configure_job_system(sys_cfg);
  caf::actor_system system{sys_cfg};
  actors::BridgeConfig bc = actors::job_bridge_config(cfg.name, dir.token);
  auto [host, port] = comm::split_host_port(cfg.listen);
  bc.transport.listen_host = host;
  bc.transport.listen_port = port;
  bc.heartbeat_interval = std::chrono::milliseconds(cfg.heartbeat_interval_ms);
  bc.failure_timeout = std::chrono::milliseconds(cfg.failure_timeout_ms);
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  auto coord = coordinator::spawn_coordinator(system, bridge, cfg, dir.path, self);
  self->monitor(coord);
  std::string address;
  self->request(bridge, std::chrono::seconds(5), actors::info_atom::value)
      .receive([&](uint64_t, std::string& a) { address = a; }, [](caf::error&) {});
  { std::ofstream(dir.path + "/coordinator.addr") << address << "\n"; }

  std::printf("troupe: job '%s', %lld worker(s), %lld steps; run directory %s\n", cfg.name.c_str(),
              (long long)cfg.workers(), (long long)cfg.steps, dir.path.c_str());
  if (!spawn_agents)
    std::printf(
        "troupe: coordinator at %s; agents join with: troupe agent --join %s --token-file "
        "%s/job.token\n",
        address.c_str(), address.c_str(), dir.path.c_str());
  std::fflush(stdout);
  caf::actor launcher;
  if (spawn_agents && cfg.launcher == "local")
    launcher =
        coordinator::spawn_local_launcher(system, launcher_options(cfg, dir, address), coord);

  // Until the job ends; the coordinator's own deadlines bound every phase, and its monitor
  // ends the wait if the actor itself is gone.
  ProgressPrinter progress(isatty(STDOUT_FILENO) && cfg.progress, uint64_t(cfg.steps));
  coordinator::JobFinished end{1, "the coordinator stopped without a result"};
  for (bool done = false; !done;)
    self->receive([&](coordinator::JobProgress& p) { progress.print(p); },
                  [&](coordinator::JobFinished& f) { end = f, done = true; },
                  [&](caf::down_msg&) { done = true; });
  progress.end();
  if (launcher) {
    self->request(launcher, std::chrono::seconds(30), coordinator::stop_atom::value)
        .receive([](bool) {}, [](caf::error&) {});
    caf::anon_send_exit(launcher, caf::exit_reason::user_shutdown);
  }
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  if (end.exit_code == 0)
    std::printf("troupe: job '%s' finished: %llu steps, loss %.4f (%s)\n", cfg.name.c_str(),
                (unsigned long long)progress.last().step, progress.last().loss, dir.path.c_str());
  else
    std::fprintf(stderr, "troupe: job '%s' failed: %s (see %s)\n", cfg.name.c_str(),
                 end.reason.c_str(), dir.path.c_str());
  return end.exit_code;
}

// The address and token of a running job: --run-dir DIR, or --coordinator HOST:PORT --token-file F.
struct JobRef {
  std::string address, job_id, token;
};
JobRef job_ref(const Args& args) {
  JobRef r;
  std::string token_file;
  if (args.has("run-dir")) {
    std::string dir = args.get("run-dir");
    std::ifstream in(dir + "/coordinator.addr");
    if (!(in >> r.address))
      throw std::invalid_argument("no coordinator.addr in " + dir + " (is a job running there?)");
    token_file = dir + "/job.token";
  } else {
    r.address = args.get("coordinator");
    token_file = args.get("token-file");
    if (r.address.empty() || token_file.empty()) {
      throw std::invalid_argument(
          "name the job with --run-dir DIR, or --coordinator HOST:PORT --token-file F");
    }
  }
  std::tie(r.job_id, r.token) = workers::read_token_file(token_file);
  return r;
}

// One request to a running job's coordinator; returns the reply or exits with a message.
int admin_request(const Args& args, const std::function<void(proto::Envelope::Builder)>& body,
                  const std::function<int(actors::ControlMessage&)>& on_reply) {
  JobRef ref = job_ref(args);
  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  actors::BridgeConfig bc = actors::job_bridge_config(ref.job_id, ref.token);
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  int rc = 1;
  uint64_t node = 0;
  std::optional<caf::error> error;
  self->request(bridge, std::chrono::seconds(10), actors::connect_atom::value, ref.address)
      .receive([&](uint64_t n) { node = n; }, [&](caf::error& e) { error = e; });
  if (!error) {
    self->request(bridge, std::chrono::seconds(10), actors::request_atom::value,
                  actors::RemoteAddress{node, actors::kCoordinatorActorId},
                  actors::ControlMessage::build(body), uint32_t(5000))
        .receive([&](actors::ControlMessage& r) { rc = on_reply(r); },
                 [&](caf::error& e) { error = e; });
  }
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  if (!error) return rc;
  // A refusal is an answer: say what the coordinator said, not that it did not answer.
  auto ce = actors::control_error(*error);
  const bool answer =
      ce && (ce->code == comm::Errc::refused || ce->code == comm::Errc::invalid_input);
  const std::string text = ce ? ce->message : system.render(*error);
  if (node == 0)
    std::fprintf(stderr, "troupe: cannot reach the job at %s: %s\n", ref.address.c_str(),
                 text.c_str());
  else if (answer)
    std::fprintf(stderr, "troupe: the job at %s refused: %s\n", ref.address.c_str(), text.c_str());
  else
    std::fprintf(stderr, "troupe: the job at %s did not answer: %s: %s\n", ref.address.c_str(),
                 ce ? comm::errc_name(ce->code) : "error", text.c_str());
  return 1;
}

// A device an agent offers: cpu:N. cuda:N is refused (exit 2) until the models run on CUDA:
// never a CPU worker in its place.
std::string checked_device(const std::string& d) {
  auto index_ok = [&](size_t at) {
    return d.size() > at && d.find_first_not_of("0123456789", at) == std::string::npos &&
           d.size() - at <= 4;
  };
  if (d.rfind("cpu:", 0) == 0 && index_ok(4)) return d;
  if (d.rfind("cuda:", 0) == 0 && index_ok(5))
    throw std::invalid_argument("device '" + d +
                                "': the models of this build run on CPU devices only (cpu:N); "
                                "CUDA workers come with the CUDA device layer");
  throw std::invalid_argument("device '" + d + "' is not cpu:N or cuda:N");
}

}  // namespace

int run_run(const std::vector<std::string>& words) { return run_job(words, true); }
int run_coordinator(const std::vector<std::string>& words) { return run_job(words, false); }

int run_agent_command(const std::vector<std::string>& words, const Hooks& hooks) {
  Args args(
      words,
      {"join", "token-file", "devices", "name", "heartbeat-interval-ms", "failure-timeout-ms"}, {});
  workers::AgentOptions o;
  o.join = args.get("join");
  if (o.join.empty() || !args.has("token-file"))
    throw std::invalid_argument("needs --join HOST:PORT and --token-file F");
  if (args.has("devices")) {  // (first: a device this build cannot use is refused before all)
    o.devices.clear();
    std::stringstream ss(args.get("devices"));
    for (std::string d; std::getline(ss, d, ',');) o.devices.push_back(checked_device(d));
  }
  std::tie(o.job_id, o.token) = workers::read_token_file(args.get("token-file"));
  o.name = args.get("name");
  if (hooks.faults) o.faults = hooks.faults();
  o.heartbeat_interval = std::chrono::milliseconds(args.get_int("heartbeat-interval-ms", 200));
  o.failure_timeout = std::chrono::milliseconds(args.get_int("failure-timeout-ms", 3000));
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + o.job_id + "] [" +
                      (o.name.empty() ? "agent" : o.name) + "] [%l] %v");
  return workers::run_agent(o);
}

int run_status(const std::vector<std::string>& words) {
  Args args(words, {"run-dir", "coordinator", "token-file"}, {"json"});
  bool json = args.has("json");
  return admin_request(
      args, [](proto::Envelope::Builder e) { e.initBody().setStatusRequest(); },
      [&](actors::ControlMessage& r) {
        auto body = r.envelope().getBody();
        if (!body.isStatus()) {
          std::fprintf(stderr, "troupe status: unexpected answer\n");
          return 1;
        }
        auto s = body.getStatus();
        if (json) {
          std::string members = "[";
          for (auto m : s.getMembers()) {
            members += (members.size() > 1 ? "," : "") + coordinator::Json()
                                                             .integer("rank", m.getRank())
                                                             .integer("agent", m.getAgentId())
                                                             .integer("pid", m.getPid())
                                                             .str("host", m.getHost())
                                                             .str("device", m.getDevice())
                                                             .text();
          }
          members += "]";
          std::printf("%s\n", coordinator::Json()
                                  .str("job", s.getJobName().cStr())
                                  .str("state", s.getState().cStr())
                                  .integer("generation", long(s.getGeneration()))
                                  .integer("step", long(s.getStep()))
                                  .integer("steps", long(s.getSteps()))
                                  .num("loss", s.getLastLoss())
                                  .str("plan", s.getPlan().cStr())
                                  .raw("members", members)
                                  .text()
                                  .c_str());
        } else {
          std::printf("job %s: %s, generation %llu, step %llu/%llu, loss %.4f\n",
                      s.getJobName().cStr(), s.getState().cStr(),
                      (unsigned long long)s.getGeneration(), (unsigned long long)s.getStep(),
                      (unsigned long long)s.getSteps(), s.getLastLoss());
          if (s.getPlan().size() > 0)
            std::printf("pipeline: %s (rank = replica x stages + stage)\n", s.getPlan().cStr());
          std::printf("%6s %6s %8s %-20s %s\n", "rank", "agent", "pid", "host", "device");
          for (auto m : s.getMembers())
            std::printf("%6u %6u %8u %-20s %s\n", m.getRank(), m.getAgentId(), m.getPid(),
                        m.getHost().cStr(), m.getDevice().cStr());
        }
        return 0;
      });
}

int run_drain(const std::vector<std::string>& words) {
  Args args(words, {"run-dir", "coordinator", "token-file", "agent"}, {});
  if (!args.has("agent")) throw std::invalid_argument("needs --agent ID (see troupe status)");
  uint32_t id = uint32_t(args.get_int("agent", 0));
  return admin_request(
      args, [&](proto::Envelope::Builder e) { e.initBody().setDrainRequest(id); },
      [&](actors::ControlMessage& r) {
        auto body = r.envelope().getBody();
        if (body.isError()) {
          std::fprintf(stderr, "troupe drain: %s\n", body.getError().getMessage().cStr());
          return 1;
        }
        std::printf("troupe: agent %u leaves at the next step boundary\n", id);
        return 0;
      });
}

int run_scale(const std::vector<std::string>& words) {
  Args args(words, {"run-dir", "coordinator", "token-file", "workers"}, {});
  if (!args.has("workers")) throw std::invalid_argument("needs --workers N");
  int64_t n = args.get_int("workers", 0);
  if (n < 1 || n > 1000000) throw std::invalid_argument("--workers must be between 1 and 1000000");
  return admin_request(
      args, [&](proto::Envelope::Builder e) { e.initBody().setScaleRequest(uint32_t(n)); },
      [&](actors::ControlMessage& r) {
        auto body = r.envelope().getBody();
        if (body.isError()) {
          std::fprintf(stderr, "troupe scale: %s\n", body.getError().getMessage().cStr());
          return 1;
        }
        std::printf("troupe: scaling the job to %lld worker(s) at the next step boundary\n",
                    (long long)n);
        return 0;
      });
}

int run_stop(const std::vector<std::string>& words) {
  Args args(words, {"run-dir", "coordinator", "token-file"}, {});
  return admin_request(
      args, [](proto::Envelope::Builder e) { e.initBody().setStopRequest(); },
      [](actors::ControlMessage& r) {
        if (!r.envelope().getBody().isAck()) return 1;
        std::printf("troupe: stop requested; the job stops after the current step\n");
        return 0;
      });
}

}  // namespace troupe::cli
