// The agent: joins the coordinator, then supervises one worker per device (DeviceSupervisor,
// each on its own thread) and follows the coordinator's messages through its actor into the
// GenerationBoard until it is told to shut down or loses the coordinator.
#include "workers/agent.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

#include "actors/bridge.h"
#include "actors/job_protocol.h"
#include "actors/services.h"
#include "actors/signals.h"
#include "workers/device_supervisor.h"
#include "workers/generation_board.h"

namespace troupe::workers {
namespace {

using actors::ControlMessage;

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// Every log line names the job, the agent, the generation and this agent's ranks.
void log_as(const std::string& job, const std::string& agent, const actors::GenerationStart& g,
            uint32_t agent_id) {
  std::string ranks;
  for (const auto& m : g.members)
    if (m.worker.agent == agent_id) ranks += (ranks.empty() ? "" : ",") + std::to_string(m.rank);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + job + "] [" + agent + "] [gen " +
                      std::to_string(g.generation) + " rank " + (ranks.empty() ? "-" : ranks) +
                      "] [%l] %v");
}

// The agent's actor: the coordinator's pushes, onto the board.
// (It shares the board: it may run after run_agent has returned.)
caf::actor spawn_agent_actor(caf::actor_system& system, std::shared_ptr<GenerationBoard> board,
                             const std::string& job, const std::string& name,
                             std::shared_ptr<std::atomic<uint32_t>> agent_id) {
  return system.spawn([board, job, name, agent_id](caf::event_based_actor*) -> caf::behavior {
    return {[board, job, name, agent_id](ControlMessage& m) -> ControlMessage {
      auto body = m.envelope().getBody();
      if (body.isGenerationStart()) {
        auto g = actors::decode(body.getGenerationStart());
        log_as(job, name, g, agent_id->load());
        board->start(std::move(g));
      } else if (body.isCheckpointAtStep()) {
        board->checkpoint_at_step(body.getCheckpointAtStep());
      } else if (body.isStopAtNextStep()) {
        board->stop_at_next_step();
      } else if (body.isLeaveGeneration()) {
        board->leave(body.getLeaveGeneration());
      } else if (body.isShutdown()) {
        auto s = actors::decode(body.getShutdown());
        board->shut_down(s.exit_code, s.reason);
      }
      return actors::make_ack();
    }};
  });
}

// Connects to the coordinator and joins: its node and the job spec, or the reason it cannot.
struct Joined {
  uint64_t coordinator = 0;
  actors::JobSpec spec;
  std::string error;
};

Joined join(caf::scoped_actor& self, const caf::actor& bridge, const AgentOptions& o,
            const std::string& name) {
  Joined j;
  auto render = [&](const caf::error& e) { j.error = self->system().render(e); };
  self->request(bridge, std::chrono::seconds(30), actors::connect_atom::value, o.join)
      .receive([&](uint64_t n) { j.coordinator = n; }, render);
  if (!j.error.empty()) {
    j.error = "cannot reach the coordinator at " + o.join + ": " + j.error;
    return j;
  }
  self->send(bridge, actors::monitor_atom::value, j.coordinator);
  actors::Join request{name, host_name(), uint32_t(getpid()), o.devices};
  ControlMessage reply;
  self->request(bridge, std::chrono::seconds(35), actors::request_atom::value,
                actors::RemoteAddress{j.coordinator, actors::kCoordinatorActorId},
                actors::encode(request), uint32_t(30000))
      .receive([&](ControlMessage& r) { reply = r; }, render);
  if (j.error.empty() && !reply.envelope().getBody().isJobSpec())
    j.error = "the coordinator answered without a job spec";
  if (!j.error.empty())
    j.error = "join refused: " + j.error;
  else
    j.spec = actors::decode(reply.envelope().getBody().getJobSpec());
  return j;
}

// Why this program cannot train the job's kinds ("" when it can): a job of a program's own
// model or data set needs agents from that program.
std::string missing_kind(const actors::JobSpec& spec, const models::Extensions* ext) {
  auto has = [&](bool builtin, bool added, const char* key, const std::string& kind) {
    return builtin || added ? std::string()
                            : std::string("the job's ") + key + " = \"" + kind +
                                  "\" is not a kind this program has: run the agents from the "
                                  "program that added it (its troupe::main)";
  };
  const std::string m = has(spec.model_kind == "mlp" || spec.model_kind == "gpt",
                            ext && ext->model(spec.model_kind), "model.kind", spec.model_kind);
  if (!m.empty()) return m;
  return has(
      spec.data_kind == "synthetic" || spec.data_kind == "text" || spec.data_kind == "tokens",
      ext && ext->dataset(spec.data_kind), "data.kind", spec.data_kind);
}

// The local launcher's coordinator process (TROUPE_LAUNCHED_BY; 0: started by hand). Its agents
// get SIGHUP when it ends (their parent-death signal).
pid_t launcher_pid() {
  const char* by = std::getenv("TROUPE_LAUNCHED_BY");
  return by ? pid_t(std::atoi(by)) : 0;
}

// SIGTERM or SIGINT to an agent is a leave: it asks the coordinator to drain it (it then leaves
// at the next step boundary and exits 0). If the coordinator refuses (too few workers would be
// left) or cannot be asked, it exits at once with 128 + the signal; so does a second signal.
// A SIGHUP to a launched agent: the coordinator's process that launched it ended, and nobody is
// left to ask; it leaves at once with 1, saying so (the coordinator's loss would say it too,
// within elastic.failure_timeout_ms).
void on_signal(caf::scoped_actor& self, const caf::actor& bridge, GenerationBoard& board,
               uint64_t coordinator, uint32_t agent_id, int sig, bool again) {
  const std::string name = actors::signal_name(sig);
  if (sig == SIGHUP && launcher_pid() > 0) {
    board.shut_down(1, "the coordinator's process (pid " + std::to_string(launcher_pid()) +
                           "), which launched this agent, ended: leaving");
    return;
  }
  if (again) {
    std::fprintf(stderr, "troupe agent: %s again: exiting at once\n", name.c_str());
    std::_Exit(128 + sig);
  }
  spdlog::warn("{}: asking the coordinator to drain this agent", name);
  std::string error;
  self->request(bridge, std::chrono::seconds(10), actors::request_atom::value,
                actors::RemoteAddress{coordinator, actors::kCoordinatorActorId},
                actors::make_drain_request(agent_id), uint32_t(5000))
      .receive([](ControlMessage&) {},
               [&](caf::error& e) {
                 auto ce = actors::control_error(e);
                 error = ce ? ce->message : self->system().render(e);
               });
  if (!error.empty())
    board.shut_down(128 + sig, name + " and the coordinator did not drain this agent (" + error +
                                   "): leaving at once");
}

// Until the coordinator's shutdown, or its loss; signals ask for a drain.
void await_shutdown(caf::scoped_actor& self, const caf::actor& bridge, GenerationBoard& board,
                    uint64_t coordinator, uint32_t agent_id, actors::SignalWatcher& signals) {
  int seen = 0;
  while (!board.shutting_down()) {
    self->receive(
        [&](actors::NodeDown& d) {
          if (d.node == coordinator)
            board.shut_down(1, "the coordinator was lost (" + std::string(comm::errc_name(d.code)) +
                                   ": " + d.reason + ")");
        },
        caf::after(std::chrono::milliseconds(100)) >> [] {});
    for (int sig; (sig = signals.next()) != 0; ++seen)
      on_signal(self, bridge, board, coordinator, agent_id, sig, seen > 0);
  }
}

}  // namespace

std::pair<std::string, std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the token file '" + path + "'");
  std::string job, token;
  in >> job >> token;
  if (job.empty() || token.empty())
    throw std::invalid_argument("the token file '" + path + "' is not 'JOB_ID TOKEN'");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    std::fprintf(stderr,
                 "troupe: warning: the token file '%s' can be read by others (mode %03o): anyone "
                 "who reads it can control the job; chmod 600 it\n",
                 path.c_str(), unsigned(st.st_mode & 0777));
  return {job, token};
}

int run_agent(const AgentOptions& o) {
  actors::SignalWatcher signals;  // (before any thread starts)
  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  actors::BridgeConfig bc = actors::job_bridge_config(o.job_id, o.token);
  bc.heartbeat_interval = o.heartbeat_interval;
  bc.failure_timeout = o.failure_timeout;
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  const std::string name = o.name.empty() ? host_name() + ":" + std::to_string(getpid()) : o.name;
  auto board = std::make_shared<GenerationBoard>();
  auto agent_id = std::make_shared<std::atomic<uint32_t>>(UINT32_MAX);
  auto agent = spawn_agent_actor(system, board, o.job_id, name, agent_id);
  self->send(bridge, actors::register_atom::value, actors::kAgentActorId, agent);
  auto stop_all = [&](int code) {
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
    return code;
  };

  Joined joined = join(self, bridge, o, name);
  if (!joined.error.empty()) {
    std::fprintf(stderr, "troupe agent: %s\n", joined.error.c_str());
    return stop_all(1);
  }
  if (std::string why = missing_kind(joined.spec, o.extensions.get()); !why.empty()) {
    std::fprintf(stderr, "troupe agent: %s\n", why.c_str());
    return stop_all(2);
  }
  agent_id->store(joined.spec.agent_id);
  spdlog::info("agent {} joined job '{}' as agent {} with {} device(s)", name, joined.spec.job_name,
               joined.spec.agent_id, o.devices.size());

  DeviceContext ctx;
  ctx.spec = worker_spec_of(joined.spec);
  ctx.spec.agent_name = name;
  ctx.spec.faults = o.faults;
  ctx.spec.extensions = o.extensions;
  ctx.agent_id = joined.spec.agent_id;
  ctx.first_generation = joined.spec.first_generation;
  ctx.board = board.get();
  actors::RemoteAddress to_coord{joined.coordinator, actors::kCoordinatorActorId};
  ctx.send = [&bridge, to_coord](ControlMessage m) {
    caf::anon_send(bridge, actors::send_atom::value, to_coord, std::move(m));
  };
  ctx.max_restarts = int(joined.spec.worker_max_restarts);
  ctx.restart_window = std::chrono::milliseconds(joined.spec.worker_restart_window_ms);
  std::vector<std::thread> threads;
  for (uint32_t d = 0; d < o.devices.size(); ++d)
    threads.emplace_back(
        [&ctx, d, device = o.devices[d]] { DeviceSupervisor(ctx, d, device).run(); });

  await_shutdown(self, bridge, *board, joined.coordinator, joined.spec.agent_id, signals);
  for (auto& t : threads) t.join();
  const int code = board->exit_code();
  if (code != 0)
    std::fprintf(stderr, "troupe agent: %s\n", board->reason().c_str());
  else
    spdlog::info("shut down by the coordinator: {}", board->reason());
  return stop_all(code);
}

}  // namespace troupe::workers
