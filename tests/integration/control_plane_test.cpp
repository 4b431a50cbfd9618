// The control plane between real processes on loopback: request/response between actors in
// different processes, node loss on SIGKILL (endpoint error) and SIGSTOP (missed heartbeats),
// fencing of a stopped process that wakes up, and bad frames that are refused while the node
// keeps serving everyone else.
#include <gtest/gtest.h>
#include <signal.h>

#include <deque>
#include <random>

#include "actors/bridge.h"
#include "actors/services.h"
#include "tests/harness/harness.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using actors::ControlMessage;
using actors::RemoteAddress;
using testing::NodeProcess;
using testing::TempDir;

const char* kJob = "job-under-test";
const char* kToken = "token-under-test";

std::vector<std::string> node_args(std::vector<std::string> more = {}) {
  std::vector<std::string> a{"--job-id", kJob, "--token", kToken};
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

class ControlPlane : public ::testing::Test {
 protected:
  void SetUp() override {
    actors::configure_system(cfg_);
    system_ = std::make_unique<caf::actor_system>(cfg_);
    self_ = std::make_unique<caf::scoped_actor>(*system_);
  }
  void TearDown() override {
    if (bridge_) caf::anon_send_exit(bridge_, caf::exit_reason::user_shutdown);
    bridge_ = caf::actor();
    self_.reset();
    system_.reset();
  }

  void start_bridge(std::chrono::milliseconds heartbeat = 200ms,
                    std::chrono::milliseconds timeout = 2000ms) {
    actors::BridgeConfig bc;
    bc.job_id = kJob;
    bc.token = kToken;
    bc.heartbeat_interval = heartbeat;
    bc.failure_timeout = timeout;
    bridge_ = actors::spawn_bridge(*system_, bc);
    (*self_)
        ->request(bridge_, 5s, actors::info_atom::value)
        .receive(
            [&](uint64_t id, std::string& addr) {
              node_ = id;
              address_ = addr;
            },
            [&](caf::error& e) { FAIL() << system_->render(e); });
  }

  uint64_t connect(const std::string& addr) {
    uint64_t peer = 0;
    (*self_)
        ->request(bridge_, 10s, actors::connect_atom::value, addr)
        .receive([&](uint64_t n) { peer = n; },
                 [&](caf::error& e) { ADD_FAILURE() << system_->render(e); });
    return peer;
  }

  // A request through the bridge; returns the reply or the rendered error.
  std::variant<ControlMessage, std::string> request(RemoteAddress dst, ControlMessage msg,
                                                    uint32_t timeout_ms = 5000) {
    std::variant<ControlMessage, std::string> out = std::string("no answer");
    (*self_)
        ->request(bridge_, std::chrono::milliseconds(timeout_ms + 1000),
                  actors::request_atom::value, dst, std::move(msg), timeout_ms)
        .receive([&](ControlMessage& r) { out = r; },
                 [&](caf::error& e) { out = system_->render(e); });
    return out;
  }

  proto::Stats::Reader stats_of(uint64_t node, ControlMessage& holder) {
    auto r = request(
        {node, actors::kBridgeActorId},
        ControlMessage::build([](proto::Envelope::Builder e) { e.initBody().setStatsRequest(); }));
    EXPECT_TRUE(std::holds_alternative<ControlMessage>(r)) << std::get<std::string>(r);
    holder = std::get<ControlMessage>(r);
    return holder.envelope().getBody().getStats();
  }

  caf::actor_system_config cfg_;
  std::unique_ptr<caf::actor_system> system_;
  std::unique_ptr<caf::scoped_actor> self_;
  caf::actor bridge_;
  uint64_t node_ = 0;
  std::string address_;
};

TEST_F(ControlPlane, RequestResponseBetweenActorsInTwoProcesses) {
  TempDir dir;
  NodeProcess peer(dir, "peer", node_args());
  start_bridge();
  uint64_t peer_node = connect(peer.address());
  ASSERT_EQ(peer_node, peer.node_id());
  auto frames = [&] {  // (sent, received) by this node's transport
    std::pair<uint64_t, uint64_t> out{0, 0};
    (*self_)
        ->request(bridge_, 5s, actors::stats_atom::value)
        .receive(
            [&](ControlMessage& m) {
              auto s = m.envelope().getBody().getStats();
              out = {s.getFramesSent(), s.getFramesReceived()};
            },
            [&](caf::error& e) { ADD_FAILURE() << caf::to_string(e); });
    return out;
  };
  const auto before = frames();

  for (uint64_t i = 1; i <= 20; ++i) {
    std::string text = "ping " + std::to_string(i);
    auto r = request({peer_node, actors::kEchoActorId},
                     actors::make_echo(i, text.data(), text.size(), "n"));
    ASSERT_TRUE(std::holds_alternative<ControlMessage>(r)) << std::get<std::string>(r);
    auto env = std::get<ControlMessage>(r).envelope();
    EXPECT_TRUE(env.getIsReply());
    EXPECT_EQ(env.getSrcNode(), peer_node);
    auto e = env.getBody().getEcho();
    EXPECT_EQ(e.getSequence(), i);
    EXPECT_EQ(
        std::string(reinterpret_cast<const char*>(e.getPayload().begin()), e.getPayload().size()),
        text);
  }

  // One-way messages arrive, all of them.
  for (uint64_t i = 0; i < 500; ++i)
    (*self_)->send(bridge_, actors::send_atom::value,
                   RemoteAddress{peer_node, actors::kSinkActorId},
                   actors::make_echo(i, nullptr, 0));
  uint64_t counted = 0;
  auto deadline = Clock::now() + 10s;
  while (counted < 500 && Clock::now() < deadline) {
    auto r = request({peer_node, actors::kSinkActorId}, actors::make_echo(0, nullptr, 0));
    ASSERT_TRUE(std::holds_alternative<ControlMessage>(r));
    counted = std::get<ControlMessage>(r).envelope().getBody().getEcho().getSequence();
  }
  EXPECT_EQ(counted, 500u);
  // The counters InProcessMessagesNeverTouchUcx compares do move with remote traffic: 20
  // requests, 500 one-way messages and the sink's polls went out, as many replies came back.
  const auto after = frames();
  EXPECT_GE(after.first - before.first, 521u);
  EXPECT_GE(after.second - before.second, 21u);

  // A request to an actor that does not exist there is an error, not a hang.
  auto r = request({peer_node, 777}, actors::make_echo(1, nullptr, 0));
  ASSERT_TRUE(std::holds_alternative<std::string>(r));
  EXPECT_NE(std::get<std::string>(r).find("no_actor"), std::string::npos)
      << std::get<std::string>(r);
}

TEST_F(ControlPlane, InProcessMessagesNeverTouchUcx) {
  start_bridge();
  (*self_)->send(bridge_, actors::register_atom::value, actors::kEchoActorId,
                 actors::spawn_echo(*system_));
  ControlMessage before_holder, after_holder;
  (*self_)
      ->request(bridge_, 5s, actors::stats_atom::value)
      .receive([&](ControlMessage& m) { before_holder = m; }, [&](caf::error&) {});
  for (uint64_t i = 0; i < 50; ++i) {
    auto r = request({node_, actors::kEchoActorId}, actors::make_echo(i, "x", 1));
    ASSERT_TRUE(std::holds_alternative<ControlMessage>(r)) << std::get<std::string>(r);
    EXPECT_EQ(std::get<ControlMessage>(r).envelope().getBody().getEcho().getSequence(), i);
  }
  (*self_)
      ->request(bridge_, 5s, actors::stats_atom::value)
      .receive([&](ControlMessage& m) { after_holder = m; }, [&](caf::error&) {});
  auto b = before_holder.envelope().getBody().getStats();
  auto a = after_holder.envelope().getBody().getStats();
  EXPECT_EQ(a.getFramesSent(), b.getFramesSent());
  EXPECT_EQ(a.getFramesReceived(), b.getFramesReceived());
}

// The transport tells (peer_lost), not the heartbeats: before their 2 s timeout could fire (the
// latency itself is a benchmark's business: ~40 ms here).
TEST_F(ControlPlane, SigkillOfThePeerFiresTheMonitorBeforeTheHeartbeatTimeout) {
  TempDir dir;
  NodeProcess peer(dir, "peer", node_args());
  start_bridge();
  uint64_t peer_node = connect(peer.address());
  (*self_)->send(bridge_, actors::monitor_atom::value, peer_node);
  // Make sure the monitor is registered before the kill.
  ASSERT_TRUE(std::holds_alternative<ControlMessage>(
      request({peer_node, actors::kEchoActorId}, actors::make_echo(1, nullptr, 0))));
  auto t0 = Clock::now();
  ASSERT_TRUE(peer.signal(SIGKILL));
  bool fired = false;
  (*self_)->receive(
      [&](actors::NodeDown& d) {
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::printf("SIGKILL -> node down in %.1f ms (%s: %s)\n", ms, comm::errc_name(d.code),
                    d.reason.c_str());
        EXPECT_EQ(d.node, peer_node);
        EXPECT_EQ(d.code, comm::Errc::peer_lost);
        EXPECT_LT(ms, 2000.0);
        fired = true;
      },
      caf::after(5s) >> [] {});
  EXPECT_TRUE(fired) << "no NodeDown within 5 s of SIGKILL";
  // Requests to the dead node fail at once.
  auto r = request({peer_node, actors::kEchoActorId}, actors::make_echo(2, nullptr, 0));
  ASSERT_TRUE(std::holds_alternative<std::string>(r));
  EXPECT_NE(std::get<std::string>(r).find("peer_lost"), std::string::npos)
      << std::get<std::string>(r);
}

TEST_F(ControlPlane, SigstopIsDetectedByHeartbeatsAndTheWokenPeerIsFenced) {
  TempDir dir;
  const auto timeout = 1000ms;
  start_bridge(100ms, timeout);
  (*self_)->send(bridge_, actors::observe_atom::value);
  NodeProcess peer(dir, "peer",
                   node_args({"--connect", address_, "--rejoin", "--heartbeat-interval-ms", "100",
                              "--failure-timeout-ms", "1000"}));
  ASSERT_TRUE(peer.wait_for_line("connected ", 10s));
  uint64_t peer_node = peer.node_id();
  bool up = false;
  (*self_)->receive([&](actors::NodeUp& u) { up = u.node == peer_node; }, caf::after(5s) >> [] {});
  ASSERT_TRUE(up);
  std::this_thread::sleep_for(300ms);  // a few heartbeats both ways

  auto t0 = Clock::now();
  ASSERT_TRUE(peer.signal(SIGSTOP));
  bool fired = false;
  (*self_)->receive(
      [&](actors::NodeDown& d) {
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        std::printf("SIGSTOP -> node down in %.1f ms (%s: %s)\n", ms, comm::errc_name(d.code),
                    d.reason.c_str());
        EXPECT_EQ(d.node, peer_node);
        EXPECT_EQ(d.code, comm::Errc::timed_out);
        EXPECT_GE(ms, timeout.count() * 0.9);     // not before the deadline
        EXPECT_LT(ms, timeout.count() + 5000.0);  // and by it (room for a loaded machine)
        fired = true;
      },
      caf::after(10s) >> [] {});
  ASSERT_TRUE(fired) << "the stopped peer was not detected";

  ASSERT_TRUE(peer.signal(SIGCONT));
  // The woken peer learns it lost its link, tries to rejoin under the same node id, and is refused.
  auto down = peer.wait_for_line("node_down ", 10s);
  ASSERT_TRUE(down);
  auto rejoin = peer.wait_for_line("rejoin", 10s);
  ASSERT_TRUE(rejoin);
  EXPECT_NE(rejoin->find("rejoin refused"), std::string::npos) << *rejoin;
  EXPECT_NE(rejoin->find("fenced"), std::string::npos) << *rejoin;
  // And it was never accepted back here.
  bool came_back = false;
  (*self_)->receive([&](actors::NodeUp& u) { came_back = u.node == peer_node; },
                    caf::after(500ms) >> [] {});
  EXPECT_FALSE(came_back);
  ControlMessage holder;
  auto st = stats_of(node_, holder);
  EXPECT_GE(st.getRejectedFenced(), 1u);
}

// A raw transport client: sends whatever bytes it likes and collects replies.
struct RawClient : comm::TransportHandler {
  std::mutex mu;
  std::deque<comm::Buffer> frames;
  void on_frame(comm::NodeId, comm::Buffer f) override {
    std::lock_guard<std::mutex> lock(mu);
    frames.push_back(std::move(f));
  }
  void on_peer_lost(comm::NodeId, comm::Errc, const std::string&) override {}
};

comm::Buffer envelope_frame(uint64_t src, const std::string& job, const std::string& token,
                            uint64_t generation, uint64_t dst_actor, uint64_t request_id,
                            bool stats) {
  capnp::MallocMessageBuilder b;
  auto env = b.initRoot<proto::Envelope>();
  comm::EnvelopeHeader h;
  h.job_id = job;
  h.token = token;
  h.generation = generation;
  h.src_node = src;
  h.dst_actor = dst_actor;
  h.request_id = request_id;
  comm::set_header(env, h);
  if (stats)
    env.initBody().setStatsRequest();
  else
    env.initBody().initEcho().setSequence(1);
  return comm::encode(b);
}

TEST_F(ControlPlane, BadFramesAreRefusedCountedAndTheNodeKeepsServing) {
  TempDir dir;
  NodeProcess peer(dir, "peer",
                   node_args({"--generation", "5", "--max-frame-bytes", "65536",
                              "--failure-timeout-ms", "30000"}));
  start_bridge();
  uint64_t peer_node = connect(peer.address());

  RawClient raw;
  comm::Transport t(comm::TransportOptions{"127.0.0.1", 0, false}, &raw);
  ASSERT_EQ(t.connect(peer.address(), 5s), peer_node);
  std::mt19937_64 rng(7);
  const int random_frames = 50;
  for (int i = 0; i < random_frames; ++i) {
    comm::Buffer b(8 * (1 + rng() % 32));
    for (size_t j = 0; j < b.size(); ++j) b.data()[j] = static_cast<uint8_t>(rng());
    t.send(peer_node, std::move(b));
  }
  comm::Buffer good = envelope_frame(t.node_id(), kJob, kToken, 5, actors::kEchoActorId, 0, false);
  t.send(peer_node, comm::Buffer::copy_of(good.data(), good.size() / 2 / 8 * 8));  // truncated
  t.send(peer_node, comm::Buffer(100000));                                         // oversized
  t.send(peer_node, envelope_frame(t.node_id(), kJob, "wrong-token", 5, 1, 0, false));
  t.send(peer_node, envelope_frame(t.node_id(), "wrong-job", kToken, 5, 1, 0, false));
  t.send(peer_node, envelope_frame(t.node_id(), kJob, kToken, 3, 1, 0, false));      // stale
  t.send(peer_node, envelope_frame(t.node_id() + 1, kJob, kToken, 5, 1, 0, false));  // spoofed
  t.send_with_magic_for_test(peer_node, envelope_frame(t.node_id(), kJob, kToken, 5, 1, 0, false),
                             0xdeadbeef);

  // Everyone else is still served.
  for (uint64_t i = 0; i < 10; ++i) {
    auto r = request({peer_node, actors::kEchoActorId}, actors::make_echo(i, nullptr, 0));
    ASSERT_TRUE(std::holds_alternative<ControlMessage>(r)) << std::get<std::string>(r);
  }
  // The raw client, well-behaved now, asks for the counters.
  t.send(peer_node, envelope_frame(t.node_id(), kJob, kToken, 5, actors::kBridgeActorId, 1, true));
  // Its first frames back may be the refusals of its bad ones (a wrong job or a stale
  // generation is told why): the reply is the frame with the counters.
  comm::FrameValidator v(kJob, kToken);
  std::shared_ptr<const comm::DecodedFrame> reply;
  auto deadline = Clock::now() + 5s;
  while (!reply && Clock::now() < deadline) {
    comm::Buffer frame;
    {
      std::lock_guard<std::mutex> lock(raw.mu);
      if (!raw.frames.empty()) {
        frame = std::move(raw.frames.front());
        raw.frames.pop_front();
      }
    }
    if (frame.empty()) {
      std::this_thread::sleep_for(5ms);
      continue;
    }
    auto decoded = v.decode(std::move(frame), 0);
    auto* f = std::get_if<std::shared_ptr<const comm::DecodedFrame>>(&decoded);
    if (f && (*f)->envelope().getBody().isStats()) reply = *f;
  }
  ASSERT_TRUE(reply) << "no stats reply";
  auto st = reply->envelope().getBody().getStats();
  std::printf(
      "rejected: malformed %llu, oversized %llu, wrong job %llu, stale %llu, transport %llu\n",
      (unsigned long long)st.getRejectedMalformed(), (unsigned long long)st.getRejectedOversized(),
      (unsigned long long)st.getRejectedWrongJob(), (unsigned long long)st.getRejectedStale(),
      (unsigned long long)st.getRejectedTransport());
  EXPECT_GE(st.getRejectedMalformed(), uint64_t(random_frames) + 1 + 1);  // + truncated + spoofed
  EXPECT_EQ(st.getRejectedOversized(), 1u);
  EXPECT_EQ(st.getRejectedWrongJob(), 2u);
  EXPECT_EQ(st.getRejectedStale(), 1u);
  EXPECT_EQ(st.getRejectedTransport(), 1u);
  EXPECT_TRUE(peer.alive());
}

TEST_F(ControlPlane, ConnectToNothingFailsWithinTheDeadline) {
  start_bridge();
  auto t0 = Clock::now();
  std::string error;
  (*self_)
      ->request(bridge_, 20s, actors::connect_atom::value, std::string("127.0.0.1:1"))
      .receive([&](uint64_t) {}, [&](caf::error& e) { error = system_->render(e); });
  EXPECT_FALSE(error.empty());
  EXPECT_LT(Clock::now() - t0, 10s);
}

}  // namespace
}  // namespace troupe
