// The bridge has three parts (see bridge.h for the interface):
//
//   Front      the handle users get: a CAF actor with no mailbox. Sends and requests are encoded
//              and queued to the transport on the caller's own thread; anything else is passed
//              on to Back with its sender and message id intact. A request's reply is enqueued
//              by the progress thread straight into the requester's mailbox, so a round trip
//              wakes only the two actors that talk (what CAF's own remote proxies do).
//   ReplyPort  the sender of inbound requests: when a local actor answers, its reply lands here
//              and is encoded back to the requesting node on the replier's thread.
//   Back       a detached actor for everything slow or periodic: connect, monitor, heartbeats,
//              the failure detector, request deadlines, stats.
//
// The transport's progress thread validates every frame and routes it: heartbeats and node
// events to Back, replies to the waiting requester, requests and one-way messages to the
// registered actor.
#include "actors/bridge.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "actors/failure_detector.h"

namespace troupe::actors {
namespace {

// A connection's failure as (code, message): refused when the node there refuses this one (it
// was fenced), else peer_lost (unreachable); ("") when it did not fail.
std::pair<comm::Errc, std::string> failure_of(std::exception_ptr err) {
  if (!err) return {comm::Errc::ok, ""};
  try {
    std::rethrow_exception(err);
  } catch (const comm::Error& e) {
    return {e.code(), e.what()};
  } catch (const std::exception& e) {
    return {comm::Errc::peer_lost, e.what()};
  }
  return {comm::Errc::peer_lost, "unknown"};
}

using Clock = std::chrono::steady_clock;

using tick_atom = caf::atom_constant<caf::atom("tick")>;
using inbound_atom = caf::atom_constant<caf::atom("inbound")>;
using heard_atom = caf::atom_constant<caf::atom("heard")>;
using up_atom = caf::atom_constant<caf::atom("nodeup")>;
using lost_atom = caf::atom_constant<caf::atom("nodelost")>;
using connected_atom = caf::atom_constant<caf::atom("connected")>;

std::string hex(uint64_t node) { return fmt::format("{:016x}", node); }

// State shared by Front, ReplyPort, Back and the progress thread. Everything here is
// thread-safe: atomics, or guarded by mu.
struct Shared {
  explicit Shared(const BridgeConfig& c)
      : config(c), validator(c.job_id, c.token, comm::FrameLimits{c.transport.max_frame_bytes}) {}

  struct Pending {  // a local actor's request to another node
    caf::strong_actor_ptr sender;
    caf::message_id mid;
    uint64_t node;
    Clock::time_point deadline;
  };
  struct Awaited {  // another node's request to a local actor
    uint64_t node;
    uint64_t request_id;
    uint64_t dst_actor;
    Clock::time_point deadline;
  };

  const BridgeConfig config;
  comm::FrameValidator validator;
  uint64_t self = 0;
  caf::actor_addr back;  // weak: the transport must not keep Back alive
  caf::strong_actor_ptr reply_port;

  std::mutex mu;
  std::unordered_map<uint64_t, caf::actor> registry;
  std::unordered_map<uint64_t, Pending> pending;
  std::unordered_map<uint64_t, Awaited> awaited;
  uint64_t next_request = 0;
  uint64_t next_awaited = 0;

  std::atomic<uint64_t> rejected_no_actor{0};
  std::atomic<uint64_t> rejections_seen{0};

  // Declared last, so destroyed first: the progress thread stops before the state it uses goes.
  std::shared_ptr<comm::Transport> transport_;  // use transport(): atomic access

  std::shared_ptr<comm::Transport> transport() const { return std::atomic_load(&transport_); }

  caf::actor registered(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = registry.find(id);
    return it == registry.end() ? caf::actor() : it->second;
  }

  comm::EnvelopeHeader header(uint64_t dst_actor, uint64_t request_id, bool is_reply,
                              uint64_t src_actor) const {
    comm::EnvelopeHeader h;
    h.job_id = config.job_id;
    h.token = config.token;
    h.generation = validator.generation();
    h.src_node = self;
    h.src_actor = src_actor;
    h.dst_actor = dst_actor;
    h.request_id = request_id;
    h.is_reply = is_reply;
    return h;
  }

  bool send(uint64_t node, ControlMessage& msg, const comm::EnvelopeHeader& h) {
    auto t = transport();
    return t && t->send(node, msg.encode(h));
  }

  // Answers a waiting requester (on any thread; host: the caller's execution unit, if any).
  static void respond(const Pending& p, caf::message content, caf::execution_unit* host = nullptr) {
    if (p.sender) {
      p.sender->enqueue(
          caf::make_mailbox_element(nullptr, p.mid.response_id(), {}, std::move(content)), host);
    }
  }

  void fail_pending(uint64_t node, comm::Errc code, const std::string& reason) {
    std::vector<Pending> failed;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = pending.begin(); it != pending.end();) {
        if (node == 0 || it->second.node == node) {
          failed.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& p : failed) respond(p, caf::make_message(make_control_error(code, reason)));
  }

  void sweep(Clock::time_point now) {
    std::vector<Pending> expired;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = pending.begin(); it != pending.end();) {
        if (now > it->second.deadline) {
          expired.push_back(std::move(it->second));
          it = pending.erase(it);
        } else {
          ++it;
        }
      }
      for (auto it = awaited.begin(); it != awaited.end();) {
        if (now > it->second.deadline)
          it = awaited.erase(it);
        else
          ++it;
      }
    }
    for (auto& p : expired)
      respond(p, caf::make_message(make_control_error(comm::Errc::timed_out, "no reply in time")));
  }
};

// Runs actors made runnable by the progress thread on the progress thread itself, right after
// the frame that woke them: a control message costs no thread hand-off. Actors that still have
// work after a few rounds go to CAF's scheduler. Detached actors are unaffected (their own
// thread). Control-message handlers must therefore be short; long work belongs on a worker's
// own thread (ARCHITECTURE.md).
class InlineUnit : public caf::execution_unit {
 public:
  explicit InlineUnit(caf::actor_system* system) : caf::execution_unit(system) {}

  void exec_later(caf::resumable* job) override { jobs_.push_back(job); }

  void run() {
    for (int round = 0; round < 8 && !jobs_.empty(); ++round) {
      std::vector<caf::resumable*> batch;
      batch.swap(jobs_);
      for (auto* job : batch) {
        switch (job->resume(this, 64)) {
          case caf::resumable::resume_later:
            jobs_.push_back(job);
            break;
          default:
            caf::intrusive_ptr_release(job);
            break;
        }
      }
    }
    for (auto* job : jobs_) system().scheduler().enqueue(job);  // keeps the reference
    jobs_.clear();
  }

 private:
  std::vector<caf::resumable*> jobs_;
};

// Runs on the progress thread: validates frames and routes them.
class Handler : public comm::TransportHandler {
 public:
  Handler(Shared* shared, caf::actor_system* system) : shared_(shared), unit_(system) {}

  void after_progress() override { unit_.run(); }

  void on_frame(comm::NodeId from, comm::Buffer frame) override {
    auto result = shared_->validator.decode(std::move(frame), from);
    if (auto* rej = std::get_if<comm::Rejection>(&result)) {
      log_rejection(from, *rej);
      refuse(from, *rej);
      return;
    }
    ControlMessage msg(std::get<std::shared_ptr<const comm::DecodedFrame>>(std::move(result)));
    auto env = msg.envelope();
    if (env.getBody().isHeartbeat()) {
      if (auto back = caf::actor_cast<caf::actor>(shared_->back))
        caf::anon_send(back, heard_atom::value, from);
    } else if (env.getIsReply()) {
      on_reply(msg);
    } else if (env.getDstActor() == kBridgeActorId) {
      if (auto back = caf::actor_cast<caf::actor>(shared_->back))
        caf::anon_send(back, inbound_atom::value, std::move(msg));
    } else {
      on_message(from, msg);
    }
  }

  void on_peer_connected(comm::NodeId node) override {
    if (auto back = caf::actor_cast<caf::actor>(shared_->back))
      caf::anon_send(back, up_atom::value, node);
  }

  void on_peer_lost(comm::NodeId node, comm::Errc why, const std::string& reason) override {
    shared_->fail_pending(node, comm::Errc::peer_lost, reason);
    if (auto back = caf::actor_cast<caf::actor>(shared_->back))
      caf::anon_send(back, lost_atom::value, node, uint8_t(why), reason);
  }

 private:
  void on_reply(ControlMessage& msg) {
    auto env = msg.envelope();
    Shared::Pending p;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      auto it = shared_->pending.find(env.getRequestId());
      if (it == shared_->pending.end()) return;  // late: the requester already gave up
      p = std::move(it->second);
      shared_->pending.erase(it);
    }
    if (env.getBody().isError()) {
      auto err = env.getBody().getError();
      auto code = comm::errc_from_wire(uint32_t(err.getErrc()));
      Shared::respond(p, caf::make_message(make_control_error(code, err.getMessage().cStr())),
                      &unit_);
    } else {
      Shared::respond(p, caf::make_message(std::move(msg)), &unit_);
    }
  }

  void on_message(comm::NodeId from, ControlMessage& msg) {
    auto env = msg.envelope();
    uint64_t request_id = env.getRequestId();
    uint64_t dst_actor = env.getDstActor();
    auto dst = shared_->registered(dst_actor);
    if (!dst) {
      shared_->rejected_no_actor.fetch_add(1);
      if (request_id != 0) {
        auto reply =
            make_error_reply(comm::Errc::no_actor, "no actor " + std::to_string(dst_actor) +
                                                       " at node " + hex(shared_->self));
        shared_->send(from, reply, shared_->header(env.getSrcActor(), request_id, true, 0));
      }
      return;
    }
    if (request_id == 0) {
      dst->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, std::move(msg)),
                   &unit_);
      return;
    }
    uint64_t local;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      local = ++shared_->next_awaited;
      shared_->awaited.emplace(local,
                               Shared::Awaited{from, request_id, dst_actor,
                                               Clock::now() + shared_->config.failure_timeout * 4});
    }
    dst->enqueue(caf::make_mailbox_element(shared_->reply_port, caf::make_message_id(local), {},
                                           std::move(msg)),
                 &unit_);
  }

  // A request refused for its job, token or generation gets an answer saying so (with the
  // sender's own job id and token echoed, which it will accept): a clear message, not a timeout.
  void refuse(comm::NodeId from, const comm::Rejection& rej) {
    if (!rej.frame) return;
    auto env = rej.frame->envelope();
    if (env.getRequestId() == 0 || env.getIsReply()) return;
    auto reply =
        make_error_reply(comm::Errc::refused, rej.reason == comm::Reject::wrong_job
                                                  ? kWrongJobOrToken
                                                  : rej.detail + "; rejoin the current generation");
    comm::EnvelopeHeader h =
        shared_->header(env.getSrcActor(), env.getRequestId(), true, env.getDstActor());
    h.job_id = env.getJobId().cStr();
    h.token.assign(reinterpret_cast<const char*>(env.getToken().begin()), env.getToken().size());
    h.generation = 0;
    if (auto t = shared_->transport()) t->send(from, reply.encode(h));
  }

  void log_rejection(comm::NodeId from, const comm::Rejection& rej) {
    // The first 20 rejections are logged, then one in 1000: a flood must not flood the log.
    uint64_t n = shared_->rejections_seen.fetch_add(1);
    if (n < 20 || n % 1000 == 0) {
      spdlog::warn("control plane: rejected a frame from node {}: {}: {} ({} rejected so far)",
                   hex(from), comm::reject_name(rej.reason), rej.detail, n + 1);
    }
  }

  Shared* shared_;
  InlineUnit unit_;
};

// Receives local actors' replies to requests from other nodes and sends them back.
class ReplyPort : public caf::monitorable_actor {
 public:
  ReplyPort(caf::actor_config& cfg, std::weak_ptr<Shared> shared)
      : caf::monitorable_actor(cfg), shared_(std::move(shared)) {}

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) override {
    auto shared = shared_.lock();
    if (!shared || !what || !what->mid.is_response()) return;
    Shared::Awaited a;
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      auto it = shared->awaited.find(what->mid.request_id().integer_value());
      if (it == shared->awaited.end()) return;
      a = it->second;
      shared->awaited.erase(it);
    }
    caf::message content = what->move_content_to_message();
    ControlMessage reply;
    if (content.match_elements<ControlMessage>()) {
      reply = content.get_as<ControlMessage>(0);
    }
    if (!reply.valid()) {
      // An actor answers with a ControlMessage (an ErrorReply for a refusal); anything else
      // is a bug in that actor.
      std::string why = content.match_elements<caf::error>()
                            ? to_string(content.get_as<caf::error>(0))
                            : "the actor gave no reply";
      reply = make_error_reply(comm::Errc::internal, why);
    }
    shared->send(a.node, reply, shared->header(0, a.request_id, true, a.dst_actor));
  }

  const char* name() const override { return "troupe.reply_port"; }

 private:
  std::weak_ptr<Shared> shared_;
};

// The handle users get. Sends and requests never wait in a mailbox.
class Front : public caf::monitorable_actor {
 public:
  Front(caf::actor_config& cfg, std::shared_ptr<Shared> shared, caf::actor back)
      : caf::monitorable_actor(cfg), shared_(std::move(shared)), back_(std::move(back)) {}

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* host) override {
    if (!what) return;
    caf::message content = what->move_content_to_message();
    if (content.match_elements<send_atom, RemoteAddress, ControlMessage>()) {
      auto dst = content.get_as<RemoteAddress>(1);
      ControlMessage msg = content.get_as<ControlMessage>(2);
      one_way(dst, msg, host);
    } else if (content.match_elements<request_atom, RemoteAddress, ControlMessage, uint32_t>()) {
      auto dst = content.get_as<RemoteAddress>(1);
      ControlMessage msg = content.get_as<ControlMessage>(2);
      auto timeout = std::chrono::milliseconds(content.get_as<uint32_t>(3));
      request(std::move(what->sender), what->mid, dst, msg, timeout, host);
    } else {
      back_->enqueue(caf::make_mailbox_element(std::move(what->sender), what->mid,
                                               std::move(what->stages), std::move(content)),
                     host);
    }
  }

  const char* name() const override { return "troupe.bridge"; }

 private:
  void one_way(const RemoteAddress& dst, ControlMessage& msg, caf::execution_unit* host) {
    if (dst.node == shared_->self) {  // in-process: never touches UCX
      msg.prepare(shared_->header(dst.actor, 0, false, 0));
      if (auto a = shared_->registered(dst.actor))
        a->enqueue(caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, msg), host);
      return;
    }
    shared_->send(dst.node, msg, shared_->header(dst.actor, 0, false, 0));
  }

  void request(caf::strong_actor_ptr sender, caf::message_id mid, const RemoteAddress& dst,
               ControlMessage& msg, std::chrono::milliseconds timeout, caf::execution_unit* host) {
    Shared::Pending p{std::move(sender), mid, dst.node, Clock::now() + timeout};
    if (dst.node == shared_->self && dst.actor == kBridgeActorId) {  // this bridge's own stats
      back_->enqueue(caf::make_mailbox_element(std::move(p.sender), mid, {}, stats_atom::value),
                     host);
      return;
    }
    if (dst.node == shared_->self) {  // in-process: the local actor answers the requester itself
      auto a = shared_->registered(dst.actor);
      if (!a) {
        Shared::respond(p, caf::make_message(make_control_error(
                               comm::Errc::no_actor, "no actor " + std::to_string(dst.actor))));
        return;
      }
      msg.prepare(shared_->header(dst.actor, 0, false, 0));
      a->enqueue(caf::make_mailbox_element(std::move(p.sender), mid, {}, msg), host);
      return;
    }
    auto t = shared_->transport();
    if (!t || !t->is_connected(dst.node)) {
      Shared::respond(
          p, caf::make_message(make_control_error(comm::Errc::peer_lost,
                                                  "node " + hex(dst.node) + " is not connected")));
      return;
    }
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      id = ++shared_->next_request;
      shared_->pending.emplace(id, std::move(p));
    }
    t->send(dst.node, msg.encode(shared_->header(dst.actor, id, false, 0)));
  }

  std::shared_ptr<Shared> shared_;
  caf::actor back_;
};

class Back : public caf::event_based_actor {
 public:
  Back(caf::actor_config& cfg, std::shared_ptr<Shared> shared)
      : caf::event_based_actor(cfg),
        shared_(std::move(shared)),
        heartbeat_interval_(shared_->config.heartbeat_interval),
        detector_(shared_->config.failure_timeout, heartbeat_interval_) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) { on_down(dm); });
    delayed_send(this, heartbeat_interval_, tick_atom::value);
    return {
        [this](info_atom) -> caf::result<uint64_t, std::string> {
          auto t = shared_->transport();
          return {shared_->self, t ? t->address() : std::string()};
        },
        [this](register_atom, uint64_t id, caf::actor who) {
          monitor(who);
          std::lock_guard<std::mutex> lock(shared_->mu);
          shared_->registry[id] = std::move(who);
        },
        [this](generation_atom, uint64_t g) { shared_->validator.set_generation(g); },
        [this](connect_atom, const std::string& addr) -> caf::result<uint64_t> {
          auto rp = make_response_promise<uint64_t>();
          uint64_t id = ++next_connect_;
          connects_.emplace(id, rp);
          caf::actor_addr weak = address();
          shared_->transport()->connect_async(
              addr, shared_->config.connect_timeout,
              [weak, id](comm::NodeId node, std::exception_ptr err) {
                auto [code, what] = failure_of(err);
                if (auto b = caf::actor_cast<caf::actor>(weak))
                  caf::anon_send(b, connected_atom::value, id, node, what, uint8_t(code));
              });
          return rp;
        },
        [this](connected_atom, uint64_t id, uint64_t node, const std::string& error, uint8_t code) {
          auto it = connects_.find(id);
          if (it == connects_.end()) return;
          if (error.empty()) {
            it->second.deliver(node);
          } else {
            it->second.deliver(make_control_error(comm::errc_from_wire(code), error));
          }
          connects_.erase(it);
        },
        [this](demonitor_atom, uint64_t node) {
          auto who = caf::actor_cast<caf::actor>(current_sender());
          auto w = watchers_.find(node);
          if (!who || w == watchers_.end()) return;
          w->second.erase(std::remove(w->second.begin(), w->second.end(), who), w->second.end());
          if (w->second.empty()) watchers_.erase(w);
        },
        [this](monitor_atom, uint64_t node) {
          auto who = caf::actor_cast<caf::actor>(current_sender());
          if (!who) return;
          if (node != shared_->self && !shared_->transport()->is_connected(node)) {
            send(who, NodeDown{node, comm::Errc::peer_lost, "not connected"});
            return;
          }
          watchers_[node].push_back(who);
        },
        [this](observe_atom) {
          if (auto who = caf::actor_cast<caf::actor>(current_sender())) observers_.push_back(who);
        },
        [this](disconnect_atom, uint64_t node, const std::string& reason) {
          if (auto t = shared_->transport())
            t->disconnect(node, comm::Errc::timed_out, reason, true);
        },
        [this](stats_atom) -> ControlMessage { return stats_message(); },
        [this](silence_atom) {
          std::vector<uint64_t> out;
          for (const auto& s : detector_.silences(Clock::now()))
            out.insert(out.end(), {s.node, uint64_t(std::max<int64_t>(0, s.silent_for.count()))});
          return out;
        },
        [this](heard_atom, uint64_t node) { detector_.heard(node, Clock::now()); },
        [this](up_atom, uint64_t node) {
          detector_.watch(node, Clock::now());
          heartbeat_targets_.insert(node);
          for (auto& o : observers_) send(o, NodeUp{node});
        },
        [this](lost_atom, uint64_t node, uint8_t code, const std::string& reason) {
          const auto grace = shared_->config.loss_grace;
          if (grace.count() > 0 && watchers_.count(node) && deferred_losses_.insert(node).second)
            return void(delayed_send(this, grace, lost_atom::value, node, code, reason));
          deferred_losses_.erase(node);
          node_lost(node, comm::errc_from_wire(code), reason);
        },
        [this](inbound_atom, ControlMessage& msg) { on_inbound(msg); },
        [this](tick_atom) {
          on_tick();
          delayed_send(this, heartbeat_interval_, tick_atom::value);
        },
        [this](timing_atom, uint32_t heartbeat_ms, uint32_t failure_ms) {
          heartbeat_interval_ = std::chrono::milliseconds(heartbeat_ms);
          detector_.retime(std::chrono::milliseconds(failure_ms), heartbeat_interval_);
        },
    };
  }

  void on_exit() override {
    // Stop the progress thread first; then nothing else touches the shared state.
    std::atomic_store(&shared_->transport_, std::shared_ptr<comm::Transport>());
    shared_->fail_pending(0, comm::Errc::peer_lost, "the bridge stopped");
    for (auto& [id, rp] : connects_)
      rp.deliver(make_control_error(comm::Errc::refused, "the bridge stopped"));
    connects_.clear();
    // Watchers and observers may hold the bridge themselves: drop them, or neither goes away.
    watchers_.clear();
    observers_.clear();
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->registry.clear();
    shared_->awaited.clear();
    shared_->reply_port.reset();
  }

 private:
  // A message for the bridge itself from another node (statsRequest).
  void on_inbound(ControlMessage& msg) {
    auto env = msg.envelope();
    if (env.getBody().isStatsRequest() && env.getRequestId() != 0) {
      auto reply = stats_message();
      shared_->send(env.getSrcNode(), reply,
                    shared_->header(env.getSrcActor(), env.getRequestId(), true, kBridgeActorId));
    }
  }

  void on_tick() {
    auto now = Clock::now();
    auto t = shared_->transport();
    if (!t) return;
    ++heartbeat_seq_;
    for (uint64_t node : heartbeat_targets_) {
      auto hb = ControlMessage::build([&](proto::Envelope::Builder e) {
        e.initBody().initHeartbeat().setSequence(heartbeat_seq_);
      });
      shared_->send(node, hb, shared_->header(kBridgeActorId, 0, false, kBridgeActorId));
    }
    for (auto& exp : detector_.expire(now)) {
      std::string reason = "missed heartbeats: silent for " +
                           std::to_string(exp.silent_for.count()) + " ms (failure timeout " +
                           std::to_string(detector_.timeout().count()) + " ms)";
      t->disconnect(exp.node, comm::Errc::timed_out, reason, /*fence=*/true);
    }
    shared_->sweep(now);
  }

  void node_lost(uint64_t node, comm::Errc code, const std::string& reason) {
    detector_.forget(node);
    heartbeat_targets_.erase(node);
    // A node someone watches (an agent of the job) is lost; one nobody watches (an admin
    // command, an agent after the job's end) has only disconnected.
    if (watchers_.count(node))
      spdlog::warn("control plane: node {} lost: {}: {}", hex(node), comm::errc_name(code), reason);
    else  // (routine: every admin command's link ends so)
      spdlog::debug("control plane: node {} disconnected ({}: {})", hex(node),
                    comm::errc_name(code), reason);
    NodeDown down{node, code, reason};
    auto w = watchers_.find(node);
    if (w != watchers_.end()) {
      for (auto& a : w->second) send(a, down);
      watchers_.erase(w);
    }
    for (auto& o : observers_) send(o, down);
  }

  void on_down(const caf::down_msg& dm) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (auto it = shared_->registry.begin(); it != shared_->registry.end();) {
      if (it->second.address() == dm.source)
        it = shared_->registry.erase(it);
      else
        ++it;
    }
  }

  ControlMessage stats_message() const {
    auto t = shared_->transport();
    comm::TransportCounters c = t ? t->counters() : comm::TransportCounters{};
    const auto& v = shared_->validator;
    return ControlMessage::build([&](proto::Envelope::Builder e) {
      auto s = e.initBody().initStats();
      s.setFramesReceived(c.frames_received);
      s.setFramesSent(c.frames_sent);
      s.setFramesAccepted(v.accepted());
      s.setRejectedMalformed(v.rejected(comm::Reject::malformed) +
                             v.rejected(comm::Reject::unknown_kind) +
                             v.rejected(comm::Reject::spoofed));
      s.setRejectedOversized(v.rejected(comm::Reject::oversized) + c.rejected_oversized);
      s.setRejectedWrongJob(v.rejected(comm::Reject::wrong_job));
      s.setRejectedStale(v.rejected(comm::Reject::stale));
      s.setRejectedFenced(c.rejected_fenced);
      s.setRejectedNoActor(shared_->rejected_no_actor.load());
      s.setRejectedTransport(c.rejected_bad_header + c.rejected_unknown_peer);
    });
  }

  std::shared_ptr<Shared> shared_;
  std::chrono::milliseconds heartbeat_interval_;
  FailureDetector detector_;
  std::unordered_map<uint64_t, caf::typed_response_promise<uint64_t>> connects_;
  std::unordered_map<uint64_t, std::vector<caf::actor>> watchers_;
  std::vector<caf::actor> observers_;
  std::unordered_set<uint64_t> heartbeat_targets_;
  std::unordered_set<uint64_t> deferred_losses_;  // reported, acted on after loss_grace
  uint64_t next_connect_ = 0;
  uint64_t heartbeat_seq_ = 0;
};

// Owns the handler for as long as the transport runs (the transport calls into it).
struct TransportWithHandler {
  std::unique_ptr<Handler> handler;
  std::unique_ptr<comm::Transport> transport;
  ~TransportWithHandler() {
    transport.reset();
  }  // joins the progress thread before the handler goes
};

}  // namespace

caf::error make_control_error(comm::Errc code, const std::string& message) {
  return caf::error(static_cast<uint8_t>(code), caf::atom("troupe"), caf::make_message(message));
}

std::optional<ControlError> control_error(const caf::error& e) {
  if (e.category() != caf::atom("troupe")) return std::nullopt;
  ControlError out{comm::errc_from_wire(e.code()), ""};
  if (e.context().match_elements<std::string>()) out.message = e.context().get_as<std::string>(0);
  return out;
}

void add_control_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<RemoteAddress>("troupe_remote_address");
  cfg.add_message_type<NodeDown>("troupe_node_down");
  cfg.add_message_type<NodeUp>("troupe_node_up");
  cfg.add_error_category(caf::atom("troupe"),
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           std::string out = "troupe.";
                           out += comm::errc_name(comm::errc_from_wire(code));
                           if (ctx.match_elements<std::string>())
                             out += ": " + ctx.get_as<std::string>(0);
                           return out;
                         });
}

void configure_system(caf::actor_system_config& cfg, size_t max_threads) {
  cfg.set("scheduler.max-threads", max_threads);
  // A shared queue wakes an idle worker at once; work stealing lets it sleep up to 10 ms.
  cfg.set("scheduler.policy", caf::atom("sharing"));
  add_control_types(cfg);
}

BridgeConfig job_bridge_config(const std::string& job_id, const std::string& token) {
  BridgeConfig c;
  c.job_id = job_id;
  c.token = token;
  c.transport.shared_memory = false;
  return c;
}

caf::actor spawn_bridge(caf::actor_system& system, const BridgeConfig& config) {
  auto shared = std::make_shared<Shared>(config);
  auto back = system.spawn<Back, caf::detached>(shared);
  shared->back = back.address();
  caf::actor_config cfg;
  shared->reply_port = caf::make_actor<ReplyPort, caf::strong_actor_ptr>(
      system.next_actor_id(), system.node(), &system, cfg, std::weak_ptr<Shared>(shared));
  auto owner = std::make_shared<TransportWithHandler>();
  owner->handler = std::make_unique<Handler>(shared.get(), &system);
  try {
    owner->transport = std::make_unique<comm::Transport>(config.transport, owner->handler.get());
  } catch (const std::exception& e) {
    caf::anon_send_exit(back, caf::exit_reason::user_shutdown);
    throw comm::Error(comm::Errc::io, std::string("cannot start the control plane: ") + e.what());
  }
  shared->self = owner->transport->node_id();
  // The aliasing constructor: the transport pointer keeps its handler alive with it.
  std::atomic_store(&shared->transport_,
                    std::shared_ptr<comm::Transport>(owner, owner->transport.get()));
  return caf::make_actor<Front, caf::actor>(system.next_actor_id(), system.node(), &system, cfg,
                                            shared, back);
}

}  // namespace troupe::actors
