#include "comm/transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "comm/gate.h"
#include "comm/ucx.h"

namespace troupe::comm {
namespace {

constexpr unsigned kAmId = 7;
constexpr uint32_t kMagic = 0x54525031;  // "TRP1"
constexpr uint16_t kVersion = 1;

enum class Kind : uint16_t { hello = 1, hello_ack = 2, hello_nack = 3, frame = 4 };

// The transport header of every active message. It travels as UCX's AM header, so the
// payload (the frame) stays exactly what the caller gave.
struct AmHeader {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;
  uint64_t node;
};

using Clock = std::chrono::steady_clock;

NodeId random_node_id() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^
                      uint64_t(Clock::now().time_since_epoch().count()));
  NodeId id = 0;
  while (id == 0) id = gen();
  return id;
}

}  // namespace

struct Transport::Impl {
  using ConnectDone = Transport::ConnectDone;
  // refused: a fenced node's hello was answered with a nack; the link stays open until that node
  // closes it (or kRefusedLinger passes), so the nack is read before any disconnect: closing at
  // once let the connecting side see its endpoint fail ("Endpoint timeout") instead.
  enum class PeerState { connecting, accepted, connected, refused, closing };
  static constexpr std::chrono::seconds kRefusedLinger{5};

  struct Peer {
    Impl* impl = nullptr;
    ucp_ep_h ep = nullptr;
    NodeId node = 0;
    PeerState state = PeerState::accepted;
    bool reported_lost = false;
    // connect() side only (and connect_deadline: how long a refused link lingers):
    ConnectDone connect_done;
    Clock::time_point connect_deadline{};
    std::string target;
  };

  struct SendCtx {
    Impl* impl;
    AmHeader header;
    Buffer frame;
  };

  struct RecvCtx {
    Impl* impl;
    NodeId node;
    Buffer frame;
  };

  struct ConnectOp {
    std::string host;
    uint16_t port;
    std::chrono::milliseconds timeout;
    ConnectDone done;
  };
  struct SendOp {
    NodeId node;
    Buffer frame;
    uint32_t magic;
  };
  struct DisconnectOp {
    NodeId node;
    Errc why;
    std::string reason;
    bool fence;
  };
  using Op = std::variant<ConnectOp, SendOp, DisconnectOp>;

  struct PendingRndv {
    Peer* peer;
    void* desc;
    size_t length;
  };

  TransportOptions options;
  TransportHandler* handler;
  NodeId self;
  UcxContext context;
  UcxWorker worker;
  std::unique_ptr<UcxListener> listener;  // UCX's, on an internal port ...
  std::unique_ptr<Gate> gate;             // ... behind the advertised one (comm/gate.h)
  std::string address;
  int wake_fd = -1;
  int ucx_fd = -1;

  // Shared with other threads.
  std::mutex ops_mu;
  std::deque<Op> ops;
  std::atomic<size_t> queued{0};
  std::atomic<bool> sleeping{false};
  std::atomic<bool> stopping{false};
  mutable std::mutex live_mu;
  std::unordered_set<NodeId> live;
  std::atomic<uint64_t> frames_sent{0}, frames_received{0}, bytes_sent{0}, bytes_received{0},
      rejected_bad_header{0}, rejected_oversized{0}, rejected_unknown_peer{0}, rejected_fenced{0},
      send_failures{0};

  // Progress thread only.
  std::unordered_map<ucp_ep_h, std::unique_ptr<Peer>> peers;
  std::unordered_map<NodeId, Peer*> by_node;
  std::unordered_set<NodeId> fenced;
  std::vector<PendingRndv> pending_rndv;
  std::vector<std::pair<Peer*, void*>> closing;  // peer, close request
  std::vector<Peer*> to_close;

  std::thread thread;
  bool endpoints_stuck = false;  // an endpoint's close never completed (shutdown says)

  static UcxContextOptions context_options(const TransportOptions& o) {
    UcxContextOptions c;
    c.shared_memory = o.shared_memory;
    c.tag = false;
    return c;
  }

  Impl(const TransportOptions& opts, TransportHandler* h)
      : options(opts),
        handler(h),
        self(opts.node_id ? opts.node_id : random_node_id()),
        context(context_options(opts)),
        worker(context, /*thread_multi=*/false) {
    ucp_am_handler_param_t am{};
    am.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    am.id = kAmId;
    am.cb = &Impl::am_callback;
    am.arg = this;
    TROUPE_UCS_CHECK(ucp_worker_set_am_recv_handler(worker.get(), &am));
    if (options.listen) {
      ucp_listener_conn_handler_t conn{&Impl::conn_callback, this};
      listener = std::make_unique<UcxListener>(worker, options.listen_host, 0, conn);
      gate = std::make_unique<Gate>(options.listen_host, options.listen_port, listener->port());
      address = advertised_host(options.listen_host) + ":" + std::to_string(gate->port());
    }
    ucx_fd = worker.event_fd();
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) TROUPE_FAIL(Errc::io, "eventfd failed");
    thread = std::thread([this] { loop(); });
  }

  ~Impl() {
    stopping.store(true);
    wake();
    if (thread.joinable()) thread.join();
    if (wake_fd >= 0) close(wake_fd);
    if (endpoints_stuck) {  // (UCX would abort destroying them: left to the process's exit)
      worker.abandon();
      context.abandon();
    }
  }

  void wake() {
    uint64_t one = 1;
    ssize_t rc = write(wake_fd, &one, sizeof one);
    (void)rc;
  }

  void post(Op op) {
    {
      std::lock_guard<std::mutex> lock(ops_mu);
      ops.push_back(std::move(op));
      queued.fetch_add(1);
    }
    if (sleeping.load()) wake();
  }

  // ---- progress thread ------------------------------------------------------------------

  void loop() {
    auto last_active = Clock::now();
    const auto spin = std::chrono::microseconds(options.spin_us);
    while (!stopping.load()) {
      // One progress call a round (each polls the tcp interface with a syscall); the sends
      // that the handler's deferred work queues go out in the same round.
      bool worked = drain_ops();
      worked |= ucp_worker_progress(worker.get()) != 0;
      worked |= start_rndv_receives();
      if (worked) {
        handler->after_progress();
        drain_ops();
      }
      worked |= close_pending();
      check_connect_deadlines();
      auto now = Clock::now();
      if (worked) {
        last_active = now;
        continue;
      }
      if (now - last_active < spin) continue;
      sleeping.store(true);
      if (queued.load() != 0) {
        sleeping.store(false);
        continue;
      }
      ucs_status_t st = ucp_worker_arm(worker.get());
      if (st == UCS_ERR_BUSY) {
        sleeping.store(false);
        continue;
      }
      pollfd fds[2] = {{ucx_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      poll(fds, 2, 50);
      sleeping.store(false);
      uint64_t drained;
      while (read(wake_fd, &drained, sizeof drained) > 0) {
      }
      last_active = Clock::now();
    }
    shutdown();
  }

  void shutdown() {
    // Send what was queued before the stop, then fail connects in flight and close every
    // endpoint: flushing first (so a last message, e.g. a shutdown, arrives), forcing after 1 s.
    drain_ops();
    for (int i = 0; i < 100 && ucp_worker_progress(worker.get()) != 0; ++i) {
    }
    for (auto& [ep, peer] : peers) {
      if (peer->connect_done) {
        fail_connect(peer.get(), Errc::aborted,
                     "transport shut down while connecting to " + peer->target);
      }
      if (peer->state != PeerState::closing) to_close.push_back(peer.get());
    }
    close_pending(/*force=*/false);
    auto deadline = Clock::now() + std::chrono::seconds(1);
    while (!closing.empty() && Clock::now() < deadline) {
      ucp_worker_progress(worker.get());
      close_pending(false);
    }
    endpoints_stuck = !closing.empty();
    for (auto& [peer, req] : closing) ucp_request_free(req);
    closing.clear();
    peers.clear();
    gate.reset();
    listener.reset();
  }

  bool drain_ops() {
    if (queued.load() == 0) return false;
    std::deque<Op> batch;
    {
      std::lock_guard<std::mutex> lock(ops_mu);
      batch.swap(ops);
      queued.store(0);
    }
    for (auto& op : batch) {
      if (auto* c = std::get_if<ConnectOp>(&op)) {
        do_connect(*c);
      } else if (auto* s = std::get_if<SendOp>(&op)) {
        do_send(s->node, std::move(s->frame), s->magic);
      } else if (auto* d = std::get_if<DisconnectOp>(&op)) {
        do_disconnect(d->node, d->why, d->reason, d->fence);
      }
    }
    return true;
  }

  ucp_ep_params_t ep_params(Peer* peer) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Impl::error_callback;
    params.err_handler.arg = peer;
    return params;
  }

  void do_connect(ConnectOp& op) {
    auto peer = std::make_unique<Peer>();
    peer->impl = this;
    peer->state = PeerState::connecting;
    peer->connect_done = std::move(op.done);
    peer->connect_deadline = Clock::now() + op.timeout;
    peer->target = op.host + ":" + std::to_string(op.port);
    SockAddr addr;
    try {
      addr = resolve(op.host, op.port);
    } catch (...) {
      peer->connect_done(0, std::current_exception());
      return;
    }
    ucp_ep_params_t params = ep_params(peer.get());
    params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.storage);
    params.sockaddr.addrlen = addr.length;
    ucp_ep_h ep = nullptr;
    ucs_status_t st = ucp_ep_create(worker.get(), &params, &ep);
    if (st != UCS_OK) {
      fail_connect(peer.get(), Errc::peer_lost,
                   "cannot connect to " + peer->target + ": " + ucs_status_string(st));
      return;
    }
    peer->ep = ep;
    Peer* raw = peer.get();
    peers.emplace(ep, std::move(peer));
    am_send(raw, Kind::hello, kMagic, Buffer());
  }

  void do_send(NodeId node, Buffer frame, uint32_t magic) {
    auto it = by_node.find(node);
    if (it == by_node.end() || it->second->state != PeerState::connected) {
      send_failures.fetch_add(1);
      return;
    }
    size_t bytes = frame.size();
    if (am_send(it->second, Kind::frame, magic, std::move(frame))) {
      frames_sent.fetch_add(1);
      bytes_sent.fetch_add(bytes);
    }
  }

  void do_disconnect(NodeId node, Errc why, const std::string& reason, bool fence) {
    if (fence) fenced.insert(node);
    auto it = by_node.find(node);
    if (it == by_node.end()) return;
    lose(it->second, why, reason);
  }

  void fail_connect(Peer* peer, Errc why, const std::string& reason) {
    auto done = std::move(peer->connect_done);
    peer->connect_done = nullptr;
    done(0, std::make_exception_ptr(Error(why, reason)));
  }

  bool am_send(Peer* peer, Kind kind, uint32_t magic, Buffer frame) {
    auto* ctx =
        new SendCtx{this, AmHeader{magic, kVersion, uint16_t(kind), self}, std::move(frame)};
    ucp_request_param_t param{};
    param.op_attr_mask =
        UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = &Impl::send_callback;
    param.user_data = ctx;
    param.flags = UCP_AM_SEND_FLAG_REPLY;
    ucs_status_ptr_t req = ucp_am_send_nbx(peer->ep, kAmId, &ctx->header, sizeof(AmHeader),
                                           ctx->frame.data(), ctx->frame.size(), &param);
    if (req == nullptr) {
      delete ctx;
      return true;
    }
    if (UCS_PTR_IS_ERR(req)) {
      delete ctx;
      send_failures.fetch_add(1);
      lose(peer, Errc::peer_lost,
           std::string("send failed: ") + ucs_status_string(UCS_PTR_STATUS(req)));
      return false;
    }
    return true;  // send_callback frees ctx and the request
  }

  static void send_callback(void* request, ucs_status_t status, void* user_data) {
    auto* ctx = static_cast<SendCtx*>(user_data);
    if (status != UCS_OK) ctx->impl->send_failures.fetch_add(1);
    delete ctx;
    ucp_request_free(request);
  }

  static void conn_callback(ucp_conn_request_h conn_request, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    auto peer = std::make_unique<Peer>();
    peer->impl = self;
    peer->state = PeerState::accepted;
    ucp_ep_params_t params = self->ep_params(peer.get());
    params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
    params.conn_request = conn_request;
    ucp_ep_h ep = nullptr;
    if (ucp_ep_create(self->worker.get(), &params, &ep) != UCS_OK) return;
    peer->ep = ep;
    self->peers.emplace(ep, std::move(peer));
  }

  static void error_callback(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* peer = static_cast<Peer*>(arg);
    peer->impl->lose(peer, Errc::peer_lost,
                     std::string("endpoint error: ") + ucs_status_string(status));
  }

  // Marks a peer lost, reports it once (if it was the node's current link), and schedules the
  // endpoint's close. Safe to call from UCX callbacks.
  void lose(Peer* peer, Errc why, const std::string& reason) {
    if (peer->state == PeerState::closing) return;
    bool was_connected = peer->state == PeerState::connected;
    peer->state = PeerState::closing;
    if (peer->connect_done) {
      fail_connect(peer, why, "connection to " + peer->target + " failed: " + reason);
    }
    if (was_connected) {
      auto it = by_node.find(peer->node);
      if (it != by_node.end() && it->second == peer) {
        by_node.erase(it);
        {
          std::lock_guard<std::mutex> lock(live_mu);
          live.erase(peer->node);
        }
        handler->on_peer_lost(peer->node, why, reason);
      }
    }
    to_close.push_back(peer);
  }

  // Starts closing the endpoints of lost peers and frees those whose close completed.
  bool close_pending(bool force = true) {
    bool worked = false;
    for (Peer* peer : to_close) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
      ucs_status_ptr_t req = ucp_ep_close_nbx(peer->ep, &param);
      if (req == nullptr || UCS_PTR_IS_ERR(req)) {
        peers.erase(peer->ep);
      } else {
        closing.emplace_back(peer, req);
      }
      worked = true;
    }
    to_close.clear();
    for (size_t i = 0; i < closing.size();) {
      auto [peer, req] = closing[i];
      if (ucp_request_check_status(req) != UCS_INPROGRESS) {
        ucp_request_free(req);
        peers.erase(peer->ep);
        closing[i] = closing.back();
        closing.pop_back();
        worked = true;
      } else {
        ++i;
      }
    }
    return worked;
  }

  void check_connect_deadlines() {
    auto now = Clock::now();
    for (auto& [ep, peer] : peers) {
      if (peer->connect_done && now > peer->connect_deadline) {
        lose(peer.get(), Errc::timed_out, "no hello answer from " + peer->target);
      } else if (peer->state == PeerState::refused && now > peer->connect_deadline) {
        lose(peer.get(), Errc::refused, "a refused node kept its link open");
      }
    }
  }

  Peer* find_peer(const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return nullptr;
    auto it = peers.find(param->reply_ep);
    return it == peers.end() ? nullptr : it->second.get();
  }

  static ucs_status_t am_callback(void* arg, const void* header, size_t header_length, void* data,
                                  size_t length, const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->on_am(header, header_length, data, length, param);
  }

  ucs_status_t on_am(const void* header_ptr, size_t header_length, void* data, size_t length,
                     const ucp_am_recv_param_t* param) {
    AmHeader header{};
    if (header_length != sizeof(AmHeader)) {
      rejected_bad_header.fetch_add(1);
      return UCS_OK;
    }
    std::memcpy(&header, header_ptr, sizeof header);
    if (header.magic != kMagic || header.version != kVersion || header.node == 0) {
      rejected_bad_header.fetch_add(1);
      return UCS_OK;
    }
    Peer* peer = find_peer(param);
    if (peer == nullptr || peer->state == PeerState::closing) {
      rejected_unknown_peer.fetch_add(1);
      return UCS_OK;
    }
    switch (Kind(header.kind)) {
      case Kind::hello:
        return on_hello(peer, header.node);
      case Kind::hello_ack:
        return on_hello_answer(peer, header.node, true);
      case Kind::hello_nack:
        return on_hello_answer(peer, header.node, false);
      case Kind::frame:
        break;
      default:
        rejected_bad_header.fetch_add(1);
        return UCS_OK;
    }
    if (fenced.count(header.node)) {
      rejected_fenced.fetch_add(1);
      return UCS_OK;
    }
    if (peer->state != PeerState::connected || peer->node != header.node) {
      rejected_unknown_peer.fetch_add(1);
      return UCS_OK;
    }
    if (length > options.max_frame_bytes) {
      rejected_oversized.fetch_add(1);
      return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_MESSAGE_TRUNCATED : UCS_OK;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
      pending_rndv.push_back({peer, data, length});
      return UCS_INPROGRESS;
    }
    deliver(peer->node, Buffer::copy_of(data, length));
    return UCS_OK;
  }

  void deliver(NodeId node, Buffer frame) {
    frames_received.fetch_add(1);
    bytes_received.fetch_add(frame.size());
    handler->on_frame(node, std::move(frame));
  }

  ucs_status_t on_hello(Peer* peer, NodeId node) {
    if (peer->state != PeerState::accepted) {
      rejected_unknown_peer.fetch_add(1);
      return UCS_OK;
    }
    if (fenced.count(node)) {
      rejected_fenced.fetch_add(1);
      // (a send that failed at once lost the peer: it is closing already)
      if (!am_send(peer, Kind::hello_nack, kMagic, Buffer())) return UCS_OK;
      peer->state = PeerState::refused;
      peer->connect_deadline = Clock::now() + kRefusedLinger;
      return UCS_OK;
    }
    peer->node = node;
    am_send(peer, Kind::hello_ack, kMagic, Buffer());
    mark_connected(peer);
    return UCS_OK;
  }

  ucs_status_t on_hello_answer(Peer* peer, NodeId node, bool accepted) {
    if (peer->state != PeerState::connecting) {
      rejected_unknown_peer.fetch_add(1);
      return UCS_OK;
    }
    if (!accepted) {
      lose(peer, Errc::refused,
           "refused by " + peer->target + ": this node was fenced; rejoin as a new node");
      return UCS_OK;
    }
    // A node this side fenced (lost to a stall) and now connected to on purpose (an agent
    // rejoining its coordinator): its frames count again, or the link "succeeds" and every frame
    // on it, the join's answer too, is dropped as a fenced node's.
    fenced.erase(node);
    peer->node = node;
    mark_connected(peer);
    auto done = std::move(peer->connect_done);
    peer->connect_done = nullptr;
    done(node, nullptr);
    return UCS_OK;
  }

  void mark_connected(Peer* peer) {
    peer->state = PeerState::connected;
    // A second link to the same node (both sides connected) replaces the first for sending;
    // the older one stays open until it fails and is then dropped without a report.
    by_node[peer->node] = peer;
    {
      std::lock_guard<std::mutex> lock(live_mu);
      live.insert(peer->node);
    }
    handler->on_peer_connected(peer->node);
  }

  bool start_rndv_receives() {
    if (pending_rndv.empty()) return false;
    std::vector<PendingRndv> batch;
    batch.swap(pending_rndv);
    for (auto& p : batch) {
      auto* ctx = new RecvCtx{this, p.peer->node, Buffer(p.length)};
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      param.cb.recv_am = &Impl::rndv_callback;
      param.user_data = ctx;
      ucs_status_ptr_t req =
          ucp_am_recv_data_nbx(worker.get(), p.desc, ctx->frame.data(), p.length, &param);
      if (req == nullptr) {
        deliver(ctx->node, std::move(ctx->frame));
        delete ctx;
      } else if (UCS_PTR_IS_ERR(req)) {
        delete ctx;
      }
    }
    return true;
  }

  static void rndv_callback(void* request, ucs_status_t status, size_t length, void* user_data) {
    auto* ctx = static_cast<RecvCtx*>(user_data);
    if (status == UCS_OK) ctx->impl->deliver(ctx->node, std::move(ctx->frame));
    delete ctx;
    ucp_request_free(request);
  }
};

Transport::Transport(const TransportOptions& options, TransportHandler* handler)
    : impl_(std::make_unique<Impl>(options, handler)) {}

Transport::~Transport() = default;

NodeId Transport::node_id() const { return impl_->self; }

std::string Transport::address() const { return impl_->address; }

void Transport::connect_async(const std::string& host_port, std::chrono::milliseconds timeout,
                              ConnectDone done) {
  std::pair<std::string, uint16_t> hp;
  try {
    hp = split_host_port(host_port);
  } catch (...) {
    done(0, std::current_exception());
    return;
  }
  impl_->post(Impl::ConnectOp{hp.first, hp.second, timeout, std::move(done)});
}

NodeId Transport::connect(const std::string& host_port, std::chrono::milliseconds timeout) {
  auto promise = std::make_shared<std::promise<NodeId>>();
  auto future = promise->get_future();
  connect_async(host_port, timeout, [promise](NodeId node, std::exception_ptr error) {
    if (error)
      promise->set_exception(error);
    else
      promise->set_value(node);
  });
  // The progress thread enforces the deadline; the slack only guards against a stuck thread.
  if (future.wait_for(timeout + std::chrono::seconds(2)) != std::future_status::ready) {
    TROUPE_FAIL(Errc::timed_out, "connecting to " + host_port + " timed out");
  }
  return future.get();
}

bool Transport::send(NodeId to, Buffer frame) {
  if (!is_connected(to)) {
    impl_->send_failures.fetch_add(1);
    return false;
  }
  impl_->post(Impl::SendOp{to, std::move(frame), kMagic});
  return true;
}

bool Transport::send_with_magic_for_test(NodeId to, Buffer frame, uint32_t magic) {
  if (!is_connected(to)) return false;
  impl_->post(Impl::SendOp{to, std::move(frame), magic});
  return true;
}

void Transport::disconnect(NodeId node, Errc why, const std::string& reason, bool fence) {
  impl_->post(Impl::DisconnectOp{node, why, reason, fence});
}

bool Transport::is_connected(NodeId node) const {
  std::lock_guard<std::mutex> lock(impl_->live_mu);
  return impl_->live.count(node) != 0;
}

TransportCounters Transport::counters() const {
  TransportCounters c;
  c.frames_sent = impl_->frames_sent.load();
  c.frames_received = impl_->frames_received.load();
  c.bytes_sent = impl_->bytes_sent.load();
  c.bytes_received = impl_->bytes_received.load();
  c.rejected_bad_header = impl_->rejected_bad_header.load();
  c.rejected_oversized = impl_->rejected_oversized.load();
  c.rejected_unknown_peer = impl_->rejected_unknown_peer.load();
  c.rejected_fenced = impl_->rejected_fenced.load();
  c.send_failures = impl_->send_failures.load();
  if (impl_->gate) {
    GateCounters g = impl_->gate->counters();
    c.gate_accepted = g.accepted;
    c.gate_refused = g.malformed + g.slow + g.full;
  }
  return c;
}

}  // namespace troupe::comm
