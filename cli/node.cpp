// `troupe node`: a control-plane node hosting the echo and sink services. It is what the demo,
// the multi-process tests and `troupe bench control` start as their peer process.
//
// stdout carries one event per line, for scripts and tests:
//   node <id> listening <host:port>
//   connected <id>
//   node_down <id> <code> <reason>
//   rejoined <id>  |  rejoin refused: <reason>
#include <signal.h>
#include <spdlog/fmt/fmt.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include "actors/bridge.h"
#include "actors/services.h"
#include "cli/commands.h"
#include "cli/parse.h"

namespace troupe::cli {
namespace {

std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop.store(true); }

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

void say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace

void BridgeFlags::add_to(CLI::App& app) {
  app.add_option("--listen", listen, "HOST:PORT to listen on (port 0: any)");
  app.add_option("--job-id", job_id, "the job id its frames carry");
  app.add_option("--token", token, "the job's token");
  app.add_option("--token-file", token_file, "reads the token from this file")->excludes("--token");
  app.add_option("--heartbeat-interval-ms", heartbeat_ms, "heartbeats to every peer");
  app.add_option("--failure-timeout-ms", failure_ms, "a peer silent this long is lost");
  app.add_option("--spin-us", spin_us, "the progress thread spins this long before it sleeps");
  app.add_option("--max-frame-bytes", max_frame_bytes, "larger frames are refused");
}

actors::BridgeConfig BridgeFlags::config() const {
  actors::BridgeConfig bc;
  if (!listen.empty()) {
    auto [host, port] = comm::split_host_port(listen);
    bc.transport.listen_host = host;
    bc.transport.listen_port = port;
  }
  bc.job_id = job_id;
  bc.token = token;
  if (!token_file.empty()) {
    std::ifstream in(token_file);
    if (!in) throw std::invalid_argument("cannot read --token-file " + token_file);
    std::getline(in, bc.token);
  }
  bc.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
  bc.failure_timeout = std::chrono::milliseconds(failure_ms);
  if (spin_us >= 0) bc.transport.spin_us = int(spin_us);
  if (max_frame_bytes > 0) bc.transport.max_frame_bytes = size_t(max_frame_bytes);
  if (bc.heartbeat_interval.count() <= 0 || bc.failure_timeout <= bc.heartbeat_interval) {
    throw std::invalid_argument(
        "--failure-timeout-ms must be larger than --heartbeat-interval-ms (and both positive)");
  }
  return bc;
}

int run_node(const std::vector<std::string>& words) {
  CLI::App app{
      "A control-plane node with the echo and sink services (the peer of the demo, the "
      "control-plane tests and benchmark). One event per line on stdout.",
      "troupe node"};
  BridgeFlags flags;
  flags.add_to(app);
  std::string target;
  uint64_t generation = 0;
  bool rejoin = false;
  app.add_option("--connect", target, "HOST:PORT of a node to connect to and monitor");
  app.add_option("--generation", generation, "stamps outbound messages, drops older inbound ones");
  app.add_flag("--rejoin", rejoin, "connects again once after the peer is lost");
  if (auto rc = parse(app, words)) return *rc;
  auto bc = flags.config();
  signal(SIGTERM, on_signal);
  signal(SIGINT, on_signal);

  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  caf::anon_send(bridge, actors::register_atom::value, actors::kEchoActorId,
                 actors::spawn_echo(system));
  caf::anon_send(bridge, actors::register_atom::value, actors::kSinkActorId,
                 actors::spawn_sink(system));
  if (app.count("--generation")) caf::anon_send(bridge, actors::generation_atom::value, generation);
  std::string address;
  uint64_t node_id = 0;
  self->request(bridge, std::chrono::seconds(5), actors::info_atom::value)
      .receive(
          [&](uint64_t id, std::string& addr) {
            node_id = id;
            address = addr;
          },
          [&](caf::error& e) { throw std::runtime_error(system.render(e)); });
  say("node " + hex(node_id) + " listening " + address);

  auto connect = [&](const std::string& target) -> std::pair<uint64_t, std::string> {
    uint64_t peer = 0;
    std::string error;
    self->request(bridge, std::chrono::seconds(10), actors::connect_atom::value, target)
        .receive([&](uint64_t n) { peer = n; }, [&](caf::error& e) { error = system.render(e); });
    return {peer, error};
  };

  if (!target.empty()) {
    auto [peer, error] = connect(target);
    if (!error.empty()) {
      say("connect failed: " + error);
      return 1;
    }
    say("connected " + hex(peer));
    self->send(bridge, actors::monitor_atom::value, peer);
  }
  self->send(bridge, actors::observe_atom::value);

  bool rejoined = false;
  while (!g_stop.load()) {
    self->receive(
        [&](actors::NodeUp&) {},
        [&](actors::NodeDown& d) {
          say("node_down " + hex(d.node) + " " + comm::errc_name(d.code) + " " + d.reason);
          if (rejoin && !target.empty() && !rejoined) {
            rejoined = true;
            auto [peer, error] = connect(target);
            if (error.empty())
              say("rejoined " + hex(peer));
            else
              say("rejoin refused: " + error);
          }
        },
        caf::after(std::chrono::milliseconds(100)) >> [] {});
  }
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  return 0;
}

}  // namespace troupe::cli
