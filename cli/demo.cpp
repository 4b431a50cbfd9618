// `troupe demo control`: the two-process control-plane demo that `make run` shows until the
// training job exists. Starts a peer `troupe node`, connects, exchanges echo requests and
// one-way messages between actors in the two processes, then SIGKILLs the peer and shows how
// fast its loss is detected. Exits non-zero if any step fails.
#include <signal.h>

#include <cstdio>

#include "actors/bridge.h"
#include "actors/services.h"
#include "cli/commands.h"
#include "coordinator/process.h"

namespace troupe::cli {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The demo's side of the conversation: its actor system, its bridge and the peer's node.
struct DemoSide {
  caf::actor_system& system;
  caf::scoped_actor& self;
  caf::actor bridge;
  uint64_t peer = 0;
};

// Starts `troupe node` and returns its address ("" when it did not say).
std::string start_peer(coordinator::ChildProcess& peer) {
  std::printf("started a peer process: troupe node (pid %d)\n", peer.pid());
  auto line = peer.wait_for_line("node ", std::chrono::seconds(10));
  if (!line) {
    std::printf("FAILED: the peer did not report its address\n");
    return "";
  }
  std::printf("peer says: %s\n", line->c_str());
  return line->substr(line->rfind(' ') + 1);
}

bool connect_to(DemoSide& d, const std::string& address) {
  auto t0 = Clock::now();
  bool ok = true;
  d.self->request(d.bridge, std::chrono::seconds(10), actors::connect_atom::value, address)
      .receive([&](uint64_t n) { d.peer = n; },
               [&](caf::error& e) {
                 std::printf("FAILED: connect: %s\n", d.system.render(e).c_str());
                 ok = false;
               });
  if (ok)
    std::printf("connected to node %016llx in %.1f ms (UCX handshake)\n",
                static_cast<unsigned long long>(d.peer), ms_since(t0));
  return ok;
}

// Five requests to the peer's echo actor; each reply must carry what was sent.
bool echo_round_trips(DemoSide& d) {
  bool ok = true;
  for (uint64_t i = 1; i <= 5 && ok; ++i) {
    auto t = Clock::now();
    std::string text = "hello #" + std::to_string(i);
    d.self
        ->request(d.bridge, std::chrono::seconds(5), actors::request_atom::value,
                  actors::RemoteAddress{d.peer, actors::kEchoActorId},
                  actors::make_echo(i, text.data(), text.size()), uint32_t(5000))
        .receive(
            [&](actors::ControlMessage& reply) {
              auto e = reply.envelope().getBody().getEcho();
              std::string back(reinterpret_cast<const char*>(e.getPayload().begin()),
                               e.getPayload().size());
              std::printf("echo %llu: sent '%s', got '%s' back in %.0f us\n",
                          static_cast<unsigned long long>(i), text.c_str(), back.c_str(),
                          ms_since(t) * 1000);
              ok = back == text && e.getSequence() == i;
            },
            [&](caf::error& e) {
              std::printf("FAILED: echo: %s\n", d.system.render(e).c_str());
              ok = false;
            });
  }
  return ok;
}

// 1000 one-way messages to the peer's sink, which must count them all.
bool one_way_messages(DemoSide& d) {
  const uint64_t n = 1000;
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; ++i) {
    d.self->send(d.bridge, actors::send_atom::value,
                 actors::RemoteAddress{d.peer, actors::kSinkActorId},
                 actors::make_echo(i, nullptr, 0));
  }
  bool ok = true;
  uint64_t counted = 0;
  while (ok && counted < n && ms_since(t0) < 10000) {
    d.self
        ->request(d.bridge, std::chrono::seconds(5), actors::request_atom::value,
                  actors::RemoteAddress{d.peer, actors::kSinkActorId},
                  actors::make_echo(0, nullptr, 0), uint32_t(5000))
        .receive(
            [&](actors::ControlMessage& r) {
              counted = r.envelope().getBody().getEcho().getSequence();
            },
            [&](caf::error&) { ok = false; });
  }
  std::printf("sent %llu one-way messages; the peer's sink counted %llu in %.1f ms\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(counted),
              ms_since(t0));
  return ok && counted == n;
}

// SIGKILLs the peer; its loss must be reported within 5 s.
bool kill_and_watch(DemoSide& d, coordinator::ChildProcess& peer) {
  d.self->send(d.bridge, actors::monitor_atom::value, d.peer);
  std::printf("killing the peer with SIGKILL...\n");
  auto t0 = Clock::now();
  peer.signal(SIGKILL);
  bool ok = true;
  d.self->receive(
      [&](actors::NodeDown& down) {
        std::printf("peer lost after %.1f ms: %s: %s\n", ms_since(t0), comm::errc_name(down.code),
                    down.reason.c_str());
      },
      caf::after(std::chrono::seconds(5)) >>
          [&] {
            std::printf("FAILED: the peer's death was not reported within 5 s\n");
            ok = false;
          });
  return ok;
}

}  // namespace

int run_demo_control(const std::vector<std::string>& words) {
  CLI::App app{
      "Two processes exchange control messages; then the peer is SIGKILLed and its loss "
      "detected (exits non-zero if a step fails).",
      "troupe demo control"};
  if (auto rc = parse(app, words)) return *rc;
  coordinator::ChildProcess peer({{coordinator::self_executable(), "node", "--listen",
                                   "127.0.0.1:0", "--job-id", "demo", "--token", "demo-token"},
                                  "",
                                  "",
                                  {}});
  const std::string address = start_peer(peer);
  if (address.empty()) return 1;

  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  actors::BridgeConfig bc;
  bc.job_id = "demo";
  bc.token = "demo-token";
  caf::scoped_actor self{system};
  DemoSide d{system, self, actors::spawn_bridge(system, bc)};
  if (!connect_to(d, address)) return 1;
  bool ok = echo_round_trips(d);
  ok = ok && one_way_messages(d);
  ok = kill_and_watch(d, peer) && ok;
  caf::anon_send_exit(d.bridge, caf::exit_reason::user_shutdown);
  std::printf(ok ? "control-plane demo: OK\n" : "control-plane demo: FAILED\n");
  return ok ? 0 : 1;
}

}  // namespace troupe::cli
