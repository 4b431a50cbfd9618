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

actors::BridgeConfig bridge_config_from(const Args& args) {
  actors::BridgeConfig bc;
  if (args.has("listen")) {
    auto [host, port] = comm::split_host_port(args.get("listen"));
    bc.transport.listen_host = host;
    bc.transport.listen_port = port;
  }
  bc.job_id = args.get("job-id", "troupe-demo");
  bc.token = args.get("token", "demo-token");
  if (args.has("token-file")) {
    std::ifstream in(args.get("token-file"));
    if (!in) throw std::invalid_argument("cannot read --token-file " + args.get("token-file"));
    std::getline(in, bc.token);
  }
  bc.heartbeat_interval = std::chrono::milliseconds(args.get_int("heartbeat-interval-ms", 200));
  bc.failure_timeout = std::chrono::milliseconds(args.get_int("failure-timeout-ms", 2000));
  bc.transport.spin_us = static_cast<int>(args.get_int("spin-us", bc.transport.spin_us));
  bc.transport.max_frame_bytes =
      static_cast<size_t>(args.get_int("max-frame-bytes", int64_t(bc.transport.max_frame_bytes)));
  if (bc.heartbeat_interval.count() <= 0 || bc.failure_timeout <= bc.heartbeat_interval) {
    throw std::invalid_argument(
        "--failure-timeout-ms must be larger than --heartbeat-interval-ms (and both positive)");
  }
  return bc;
}

int run_node(const std::vector<std::string>& words) {
  Args args(words,
            {"listen", "connect", "job-id", "token", "token-file", "heartbeat-interval-ms",
             "failure-timeout-ms", "generation", "spin-us", "max-frame-bytes"},
            {"rejoin"});
  auto bc = bridge_config_from(args);
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
  if (args.has("generation")) {
    caf::anon_send(bridge, actors::generation_atom::value, uint64_t(args.get_int("generation", 0)));
  }
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

  std::string target = args.get("connect");
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
          if (args.has("rejoin") && !target.empty() && !rejoined) {
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
