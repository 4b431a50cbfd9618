// `troupe bench control`: control-plane round trip (p50, p99) and one-way message rate between
// actors in two processes, next to raw UCX active messages between two processes in the same
// run. Both peers are started here (a `troupe node` and a `troupe bench raw-ucx-server`).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <future>
#include <numeric>
#include <thread>

#include "actors/bridge.h"
#include "actors/services.h"
#include "bench/bench.h"
#include "bench/raw_ucx.h"
#include "cli/parse.h"
#include "coordinator/process.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct TroupeResult {
  std::vector<double> rtt_us;
  double messages_per_s = 0;
};

using next_atom = caf::atom_constant<caf::atom("next")>;

// An actor that does `n` sequential echo requests to a remote actor through the bridge.
caf::behavior rtt_actor(caf::event_based_actor* self, caf::actor bridge, actors::RemoteAddress dst,
                        int n, int payload,
                        std::shared_ptr<std::promise<std::vector<double>>> done) {
  auto samples = std::make_shared<std::vector<double>>();
  auto buf = std::make_shared<std::vector<char>>(payload, 'x');
  self->send(self, next_atom::value);
  return {
      [=](next_atom) {
        if (static_cast<int>(samples->size()) == n) {
          done->set_value(*samples);
          self->quit();
          return;
        }
        auto t = Clock::now();
        self->request(bridge, std::chrono::seconds(5), actors::request_atom::value, dst,
                      actors::make_echo(samples->size(), buf->data(), buf->size()), uint32_t(5000))
            .then(
                [=](actors::ControlMessage&) {
                  samples->push_back(
                      std::chrono::duration<double, std::micro>(Clock::now() - t).count());
                  self->send(self, next_atom::value);
                },
                [=](caf::error& e) {
                  done->set_exception(std::make_exception_ptr(std::runtime_error(to_string(e))));
                  self->quit();
                });
      },
  };
}

TroupeResult troupe_run(const std::string& address, int round_trips, int messages, int payload,
                        int spin_us) {
  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  actors::BridgeConfig bc;
  bc.job_id = "bench";
  bc.token = "bench-token";
  bc.transport.spin_us = spin_us;
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  uint64_t peer = 0;
  std::string error;
  self->request(bridge, std::chrono::seconds(10), actors::connect_atom::value, address)
      .receive([&](uint64_t n) { peer = n; }, [&](caf::error& e) { error = system.render(e); });
  if (!error.empty()) throw std::runtime_error("connect: " + error);

  TroupeResult out;
  auto run_rtt = [&](int n) {
    auto done = std::make_shared<std::promise<std::vector<double>>>();
    auto fut = done->get_future();
    system.spawn(rtt_actor, bridge, actors::RemoteAddress{peer, actors::kEchoActorId}, n, payload,
                 done);
    if (fut.wait_for(std::chrono::seconds(60)) != std::future_status::ready)
      throw std::runtime_error("round trips did not finish in 60 s");
    return fut.get();
  };
  run_rtt(200);  // warm-up
  out.rtt_us = run_rtt(round_trips);

  // One way: a sender actor streams messages to the remote sink; the rate counts until the sink
  // has seen them all.
  std::vector<char> buf(payload, 'x');
  auto sink = actors::RemoteAddress{peer, actors::kSinkActorId};
  auto count = [&]() -> uint64_t {
    uint64_t c = 0;
    self->request(bridge, std::chrono::seconds(5), actors::request_atom::value, sink,
                  actors::make_echo(0, nullptr, 0), uint32_t(5000))
        .receive(
            [&](actors::ControlMessage& r) { c = r.envelope().getBody().getEcho().getSequence(); },
            [&](caf::error& e) { throw std::runtime_error(system.render(e)); });
    return c;
  };
  uint64_t before = count();
  auto t0 = Clock::now();
  auto sender = system.spawn([=](caf::event_based_actor* s) {
    for (int i = 0; i < messages; ++i)
      s->send(bridge, actors::send_atom::value, sink, actors::make_echo(i, buf.data(), buf.size()));
  });
  uint64_t got = 0;
  while ((got = count() - before) < uint64_t(messages) &&
         Clock::now() - t0 < std::chrono::seconds(60)) {
    std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  out.messages_per_s = got / std::chrono::duration<double>(Clock::now() - t0).count();
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  return out;
}

}  // namespace

Summary summarize(std::vector<double> s) {
  Summary out;
  if (s.empty()) return out;
  std::sort(s.begin(), s.end());
  out.p50 = s[s.size() / 2];
  out.p99 = s[std::min(s.size() - 1, size_t(s.size() * 0.99))];
  out.mean = std::accumulate(s.begin(), s.end(), 0.0) / s.size();
  return out;
}

int run_control_bench(const std::vector<std::string>& words) {
  CLI::App app{
      "Control-plane round trip and message rate between two processes, next to raw "
      "UCX active messages.",
      "troupe bench control"};
  int spin_us = comm::TransportOptions{}.spin_us, round_trips = 5000, messages = 200000,
      payload = 8;
  bool json = false;
  app.add_option("--round-trips", round_trips, "timed request/reply round trips")
      ->check(cli::kPositive);
  app.add_option("--messages", messages, "one-way messages for the rate")->check(cli::kPositive);
  app.add_option("--payload-bytes", payload, "bytes of each echo's payload")
      ->check(cli::kNonNegative);
  app.add_option("--spin-us", spin_us, "the progress thread spins this long before it sleeps")
      ->check(cli::kNonNegative);
  app.add_flag("--json", json, "JSON lines");
  if (auto rc = cli::parse(app, words)) return *rc;
  std::string exe = coordinator::self_executable();

  RawUcxResult raw;
  {
    coordinator::ChildProcess server({{exe, "bench", "raw-ucx-server"}, "", "", {}});
    auto line = server.wait_for_line("raw listening ", std::chrono::seconds(10));
    if (!line) throw std::runtime_error("the raw UCX server did not start");
    raw = raw_ucx_client(line->substr(line->rfind(' ') + 1), round_trips, messages, payload);
    server.signal(SIGTERM);
    server.wait(std::chrono::seconds(2));
  }
  TroupeResult tr;
  {
    coordinator::ChildProcess node(
        {{exe, "node", "--listen", "127.0.0.1:0", "--job-id", "bench", "--token", "bench-token",
          "--spin-us", std::to_string(spin_us)},
         "",
         "",
         {}});
    auto line = node.wait_for_line("node ", std::chrono::seconds(10));
    if (!line) throw std::runtime_error("the troupe node did not start");
    tr = troupe_run(line->substr(line->rfind(' ') + 1), round_trips, messages, payload, spin_us);
    node.signal(SIGTERM);
    node.wait(std::chrono::seconds(2));
  }
  Summary r = summarize(raw.rtt_us), t = summarize(tr.rtt_us);
  if (json) {
    std::printf(
        "{\"bench\":\"control\",\"impl\":\"raw_ucx_am\",\"transports\":\"%s\",\"payload_bytes\":%d,"
        "\"rtt_p50_us\":%.2f,\"rtt_p99_us\":%.2f,\"messages_per_s\":%.0f}\n",
        raw.transports.c_str(), payload, r.p50, r.p99, raw.messages_per_s);
    std::printf(
        "{\"bench\":\"control\",\"impl\":\"troupe_actors\",\"payload_bytes\":%d,"
        "\"rtt_p50_us\":%.2f,\"rtt_p99_us\":%.2f,\"messages_per_s\":%.0f,"
        "\"rtt_p50_ratio_vs_raw\":%.2f}\n",
        payload, t.p50, t.p99, tr.messages_per_s, t.p50 / r.p50);
  } else {
    std::printf(
        "control plane between two processes on loopback, %d-byte payload, %d round trips,"
        " %d one-way messages\nraw UCX lanes: %s\n\n",
        payload, round_trips, messages, raw.transports.c_str());
    std::printf("%-28s %12s %12s %14s\n", "", "rtt p50 us", "rtt p99 us", "one-way msg/s");
    std::printf("%-28s %12.2f %12.2f %14.0f\n", "raw UCX active messages", r.p50, r.p99,
                raw.messages_per_s);
    std::printf("%-28s %12.2f %12.2f %14.0f\n", "troupe actor to actor", t.p50, t.p99,
                tr.messages_per_s);
    std::printf("%-28s %12.1fx %11.1fx %13.2fx\n", "troupe / raw", t.p50 / r.p50, t.p99 / r.p99,
                tr.messages_per_s / raw.messages_per_s);
  }
  return 0;
}

}  // namespace troupe::bench
