#include "actors/bridge.h"

#include <spdlog/spdlog.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "actors/failure_detector.h"

namespace troupe::actors {
namespace {

using Clock = std::chrono::steady_clock;

using init_atom = caf::atom_constant<caf::atom("init")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;
using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using reply_atom = caf::atom_constant<caf::atom("reply")>;
using heard_atom = caf::atom_constant<caf::atom("heard")>;
using up_atom = caf::atom_constant<caf::atom("nodeup")>;
using lost_atom = caf::atom_constant<caf::atom("nodelost")>;
using connected_atom = caf::atom_constant<caf::atom("connected")>;

// State shared between the bridge actor and the transport's progress thread.
struct Shared {
  explicit Shared(const BridgeConfig& config)
      : validator(config.job_id, config.token,
                  comm::FrameLimits{config.transport.max_frame_bytes, 4u << 20, 16}) {}

  comm::FrameValidator validator;
  caf::actor_addr bridge;  // weak: the transport must not keep the bridge alive

  std::mutex registry_mu;
  std::unordered_map<uint64_t, caf::actor> registry;

  std::atomic<uint64_t> rejected_no_actor{0};
  std::atomic<uint64_t> logged_rejections{0};

  caf::actor registered(uint64_t id) {
    std::lock_guard<std::mutex> lock(registry_mu);
    auto it = registry.find(id);
    return it == registry.end() ? caf::actor() : it->second;
  }
};

// Runs on the progress thread: validates frames and routes them.
class Handler : public comm::TransportHandler {
 public:
  explicit Handler(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}

  void on_frame(comm::NodeId from, comm::Buffer frame) override {
    auto result = shared_->validator.decode(std::move(frame), from);
    if (auto* rej = std::get_if<comm::Rejection>(&result)) {
      log_rejection(from, *rej);
      return;
    }
    ControlMessage msg(std::get<std::shared_ptr<const comm::DecodedFrame>>(std::move(result)));
    auto env = msg.envelope();
    auto bridge = caf::actor_cast<caf::actor>(shared_->bridge);
    if (!bridge) return;
    if (env.getBody().isHeartbeat()) {
      caf::anon_send(bridge, heard_atom::value, from);
    } else if (env.getIsReply()) {
      caf::anon_send(bridge, reply_atom::value, std::move(msg));
    } else if (env.getRequestId() != 0 || env.getDstActor() == kBridgeActorId) {
      caf::anon_send(bridge, inbound_atom::value, std::move(msg));
    } else if (auto dst = shared_->registered(env.getDstActor())) {
      caf::anon_send(dst, std::move(msg));
    } else {
      shared_->rejected_no_actor.fetch_add(1);
    }
  }

  void on_peer_connected(comm::NodeId node) override {
    if (auto bridge = caf::actor_cast<caf::actor>(shared_->bridge))
      caf::anon_send(bridge, up_atom::value, node);
  }

  void on_peer_lost(comm::NodeId node, comm::Errc why, const std::string& reason) override {
    if (auto bridge = caf::actor_cast<caf::actor>(shared_->bridge))
      caf::anon_send(bridge, lost_atom::value, node, std::string(comm::errc_name(why)), reason);
  }

 private:
  void log_rejection(comm::NodeId from, const comm::Rejection& rej) {
    // The first 20 rejections are logged, then one in 1000: a flood must not flood the log.
    uint64_t n = shared_->logged_rejections.fetch_add(1);
    if (n < 20 || n % 1000 == 0) {
      spdlog::warn("control plane: rejected a frame from node {:016x}: {}: {} ({} rejected so far)",
                   from, comm::reject_name(rej.reason), rej.detail, n + 1);
    }
  }

  std::shared_ptr<Shared> shared_;
};

class BridgeActor : public caf::event_based_actor {
 public:
  BridgeActor(caf::actor_config& cfg, BridgeConfig config)
      : caf::event_based_actor(cfg),
        config_(std::move(config)),
        shared_(std::make_shared<Shared>(config_)),
        detector_(config_.failure_timeout) {}

  caf::behavior make_behavior() override {
    shared_->bridge = address();
    set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
    return {
        [this](init_atom) -> caf::result<uint64_t, std::string> {
          try {
            handler_ = std::make_unique<Handler>(shared_);
            transport_ = std::make_unique<comm::Transport>(config_.transport, handler_.get());
          } catch (const std::exception& e) {
            return make_control_error(ControlErrc::refused, e.what());
          }
          delayed_send(this, config_.heartbeat_interval, tick_atom::value);
          return {transport_->node_id(), transport_->address()};
        },
        [this](info_atom) -> caf::result<uint64_t, std::string> {
          return {transport_->node_id(), transport_->address()};
        },
        [this](register_atom, uint64_t id, caf::actor who) {
          monitor(who);
          std::lock_guard<std::mutex> lock(shared_->registry_mu);
          shared_->registry[id] = std::move(who);
        },
        [this](generation_atom, uint64_t g) { shared_->validator.set_generation(g); },
        [this](connect_atom, const std::string& addr) -> caf::result<uint64_t> {
          auto rp = make_response_promise<uint64_t>();
          uint64_t id = ++next_connect_;
          connects_.emplace(id, rp);
          auto self = caf::actor_cast<caf::actor>(this);
          caf::actor_addr weak = address();
          transport_->connect_async(
              addr, config_.connect_timeout, [weak, id](comm::NodeId node, std::exception_ptr err) {
                std::string what;
                if (err) {
                  try {
                    std::rethrow_exception(err);
                  } catch (const std::exception& e) {
                    what = e.what();
                  }
                }
                if (auto b = caf::actor_cast<caf::actor>(weak))
                  caf::anon_send(b, connected_atom::value, id, node, what);
              });
          return rp;
        },
        [this](connected_atom, uint64_t id, uint64_t node, const std::string& error) {
          auto it = connects_.find(id);
          if (it == connects_.end()) return;
          if (error.empty()) {
            it->second.deliver(node);
          } else {
            it->second.deliver(make_control_error(ControlErrc::refused, error));
          }
          connects_.erase(it);
        },
        [this](send_atom, const RemoteAddress& dst, ControlMessage& msg) {
          send_to(dst, msg, 0, false, 0);
        },
        [this](request_atom, const RemoteAddress& dst, ControlMessage& msg,
               uint32_t timeout_ms) -> caf::result<ControlMessage> {
          return start_request(dst, msg, std::chrono::milliseconds(timeout_ms));
        },
        [this](monitor_atom, uint64_t node) {
          auto who = caf::actor_cast<caf::actor>(current_sender());
          if (!who) return;
          if (!transport_->is_connected(node) && node != transport_->node_id()) {
            send(who, NodeDown{node, "peer_lost", "not connected"});
            return;
          }
          watchers_[node].push_back(who);
        },
        [this](observe_atom) {
          if (auto who = caf::actor_cast<caf::actor>(current_sender())) observers_.push_back(who);
        },
        [this](disconnect_atom, uint64_t node) {
          transport_->disconnect(node, comm::Errc::peer_lost, "disconnected by request", true);
        },
        [this](stats_atom) -> ControlMessage { return stats_message(); },
        [this](heard_atom, uint64_t node) { detector_.heard(node, Clock::now()); },
        [this](up_atom, uint64_t node) {
          detector_.watch(node, Clock::now());
          heartbeat_targets_.insert(node);
          for (auto& o : observers_) send(o, NodeUp{node});
        },
        [this](lost_atom, uint64_t node, const std::string& code, const std::string& reason) {
          node_lost(node, code, reason);
        },
        [this](reply_atom, ControlMessage& msg) { on_reply(msg); },
        [this](inbound_atom, ControlMessage& msg) { on_inbound(msg); },
        [this](tick_atom) {
          on_tick();
          delayed_send(this, config_.heartbeat_interval, tick_atom::value);
        },
    };
  }

  void on_exit() override {
    // Stop the progress thread before the shared state goes away.
    transport_.reset();
    handler_.reset();
    for (auto& [id, p] : pending_) p.promise.deliver(make_control_error(ControlErrc::peer_lost, "bridge stopped"));
    pending_.clear();
    for (auto& [id, rp] : connects_) rp.deliver(make_control_error(ControlErrc::refused, "bridge stopped"));
    connects_.clear();
    std::lock_guard<std::mutex> lock(shared_->registry_mu);
    shared_->registry.clear();
  }

 private:
  struct Pending {
    caf::typed_response_promise<ControlMessage> promise;
    uint64_t node;
    Clock::time_point deadline;
  };

  comm::EnvelopeHeader header(const RemoteAddress& dst, uint64_t request_id, bool is_reply,
                              uint64_t src_actor) const {
    comm::EnvelopeHeader h;
    h.job_id = config_.job_id;
    h.token = config_.token;
    h.generation = shared_->validator.generation();
    h.src_node = transport_->node_id();
    h.src_actor = src_actor;
    h.dst_actor = dst.actor;
    h.request_id = request_id;
    h.is_reply = is_reply;
    return h;
  }

  // One way. Local destinations are served in-process.
  void send_to(const RemoteAddress& dst, ControlMessage& msg, uint64_t request_id, bool is_reply,
               uint64_t src_actor) {
    if (dst.node == transport_->node_id()) {
      msg.prepare(header(dst, request_id, is_reply, src_actor));
      if (auto a = shared_->registered(dst.actor)) send(a, msg);
      return;
    }
    transport_->send(dst.node, msg.encode(header(dst, request_id, is_reply, src_actor)));
  }

  caf::result<ControlMessage> start_request(const RemoteAddress& dst, ControlMessage& msg,
                                            std::chrono::milliseconds timeout) {
    auto rp = make_response_promise<ControlMessage>();
    if (dst.node == transport_->node_id()) {
      auto a = shared_->registered(dst.actor);
      if (!a) return make_control_error(ControlErrc::no_actor, "actor " + std::to_string(dst.actor));
      msg.prepare(header(dst, 0, false, 0));
      request(a, timeout, msg).then([rp](ControlMessage& r) mutable { rp.deliver(r); },
                                    [rp](caf::error& e) mutable { rp.deliver(e); });
      return rp;
    }
    if (!transport_->is_connected(dst.node)) {
      return make_control_error(ControlErrc::peer_lost, "node " + hex(dst.node) + " is not connected");
    }
    uint64_t id = ++next_request_;
    pending_.emplace(id, Pending{rp, dst.node, Clock::now() + timeout});
    transport_->send(dst.node, msg.encode(header(dst, id, false, 0)));
    return rp;
  }

  void on_reply(ControlMessage& msg) {
    auto env = msg.envelope();
    auto it = pending_.find(env.getRequestId());
    if (it == pending_.end()) return;  // late: the requester already timed out
    if (env.getBody().isError()) {
      auto err = env.getBody().getError();
      auto code = std::string(err.getCode().cStr()) == "no_actor" ? ControlErrc::no_actor
                                                                  : ControlErrc::remote;
      it->second.promise.deliver(make_control_error(code, err.getMessage().cStr()));
    } else {
      it->second.promise.deliver(msg);
    }
    pending_.erase(it);
  }

  // A request (or a message for the bridge itself) from another node.
  void on_inbound(ControlMessage& msg) {
    auto env = msg.envelope();
    RemoteAddress reply_to{env.getSrcNode(), env.getSrcActor()};
    uint64_t request_id = env.getRequestId();
    if (env.getDstActor() == kBridgeActorId) {
      if (env.getBody().isStatsRequest() && request_id != 0) {
        auto reply = stats_message();
        send_to(reply_to, reply, request_id, true, kBridgeActorId);
      }
      return;
    }
    auto dst = shared_->registered(env.getDstActor());
    if (!dst) {
      shared_->rejected_no_actor.fetch_add(1);
      auto reply = make_error_reply("no_actor", "no actor " + std::to_string(env.getDstActor()) +
                                                    " at node " + hex(transport_->node_id()));
      send_to(reply_to, reply, request_id, true, 0);
      return;
    }
    uint64_t dst_actor = env.getDstActor();
    request(dst, config_.failure_timeout, msg)
        .then(
            [this, reply_to, request_id, dst_actor](ControlMessage& reply) {
              send_to(reply_to, reply, request_id, true, dst_actor);
            },
            [this, reply_to, request_id, dst_actor](caf::error& e) {
              auto reply = make_error_reply("remote", to_string(e));
              send_to(reply_to, reply, request_id, true, dst_actor);
            });
  }

  void on_tick() {
    auto now = Clock::now();
    // Heartbeats to every watched node.
    ++heartbeat_seq_;
    for (uint64_t node : heartbeat_targets_) {
      auto hb = ControlMessage::build([&](proto::Envelope::Builder e) {
        auto b = e.initBody().initHeartbeat();
        b.setSequence(heartbeat_seq_);
      });
      transport_->send(node, hb.encode(header({node, kBridgeActorId}, 0, false, kBridgeActorId)));
    }
    for (auto& exp : detector_.expire(now)) {
      std::string reason = "missed heartbeats: silent for " + std::to_string(exp.silent_for.count()) +
                           " ms (failure timeout " +
                           std::to_string(config_.failure_timeout.count()) + " ms)";
      transport_->disconnect(exp.node, comm::Errc::timed_out, reason, /*fence=*/true);
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now > it->second.deadline) {
        it->second.promise.deliver(make_control_error(ControlErrc::timed_out, "no reply in time"));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void node_lost(uint64_t node, const std::string& code, const std::string& reason) {
    detector_.forget(node);
    heartbeat_targets_.erase(node);
    spdlog::warn("control plane: node {} lost: {}: {}", hex(node), code, reason);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.node == node) {
        it->second.promise.deliver(make_control_error(ControlErrc::peer_lost, reason));
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    NodeDown down{node, code, reason};
    auto w = watchers_.find(node);
    if (w != watchers_.end()) {
      for (auto& a : w->second) send(a, down);
      watchers_.erase(w);
    }
    for (auto& o : observers_) send(o, down);
  }

  void on_down(const caf::down_msg& dm) {
    std::lock_guard<std::mutex> lock(shared_->registry_mu);
    for (auto it = shared_->registry.begin(); it != shared_->registry.end();) {
      if (it->second.address() == dm.source) it = shared_->registry.erase(it); else ++it;
    }
  }

  ControlMessage stats_message() const {
    auto t = transport_->counters();
    const auto& v = shared_->validator;
    return ControlMessage::build([&](proto::Envelope::Builder e) {
      auto s = e.initBody().initStats();
      s.setFramesReceived(t.frames_received);
      s.setFramesAccepted(v.accepted());
      s.setRejectedMalformed(v.rejected(comm::Reject::malformed) + v.rejected(comm::Reject::unknown_kind) +
                             v.rejected(comm::Reject::spoofed));
      s.setRejectedOversized(v.rejected(comm::Reject::oversized) + t.rejected_oversized);
      s.setRejectedWrongJob(v.rejected(comm::Reject::wrong_job));
      s.setRejectedStale(v.rejected(comm::Reject::stale));
      s.setRejectedFenced(t.rejected_fenced);
      s.setRejectedNoActor(shared_->rejected_no_actor.load());
      s.setRejectedTransport(t.rejected_bad_header + t.rejected_unknown_peer);
    });
  }

  static std::string hex(uint64_t node) { return fmt::format("{:016x}", node); }

  BridgeConfig config_;
  std::shared_ptr<Shared> shared_;
  std::unique_ptr<Handler> handler_;
  std::unique_ptr<comm::Transport> transport_;
  FailureDetector detector_;
  std::unordered_map<uint64_t, Pending> pending_;
  std::unordered_map<uint64_t, caf::typed_response_promise<uint64_t>> connects_;
  std::unordered_map<uint64_t, std::vector<caf::actor>> watchers_;
  std::vector<caf::actor> observers_;
  std::unordered_set<uint64_t> heartbeat_targets_;
  uint64_t next_request_ = 0;
  uint64_t next_connect_ = 0;
  uint64_t heartbeat_seq_ = 0;
};

}  // namespace

caf::error make_control_error(ControlErrc code, const std::string& context) {
  return caf::error(static_cast<uint8_t>(code), caf::atom("troupe"), caf::make_message(context));
}

void add_control_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<RemoteAddress>("troupe_remote_address");
  cfg.add_message_type<NodeDown>("troupe_node_down");
  cfg.add_message_type<NodeUp>("troupe_node_up");
  cfg.add_error_category(caf::atom("troupe"), [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    const char* names[] = {"", "peer_lost", "timed_out", "no_actor", "remote", "refused"};
    std::string out = "troupe.";
    out += code < 6 ? names[code] : "unknown";
    if (ctx.match_elements<std::string>()) out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
}

void configure_system(caf::actor_system_config& cfg, size_t max_threads) {
  cfg.set("scheduler.max-threads", max_threads);
  add_control_types(cfg);
}

caf::actor spawn_bridge(caf::actor_system& system, const BridgeConfig& config) {
  auto bridge = system.spawn<BridgeActor, caf::detached>(config);
  caf::scoped_actor self{system};
  std::string error;
  self->request(bridge, std::chrono::seconds(10), init_atom::value)
      .receive([](uint64_t, const std::string&) {},
               [&](caf::error& e) { error = system.render(e); });
  if (!error.empty()) {
    caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
    throw comm::Error(comm::Errc::io, "cannot start the control plane: " + error);
  }
  return bridge;
}

}  // namespace troupe::actors
