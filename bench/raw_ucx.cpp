#include "bench/raw_ucx.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "bench/bench.h"
#include "comm/ucx.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;
enum : unsigned { kPing = 11, kPong = 12, kOneWay = 13, kCountQuery = 14, kCountReply = 15 };

struct ServerState {
  ucp_worker_h worker = nullptr;
  ucp_ep_h ep = nullptr;
  uint64_t one_way = 0;
};

void wait_request(ucp_worker_h worker, ucs_status_ptr_t req) {
  if (req == nullptr) return;
  if (UCS_PTR_IS_ERR(req)) throw std::runtime_error(ucs_status_string(UCS_PTR_STATUS(req)));
  while (ucp_request_check_status(req) == UCS_INPROGRESS) ucp_worker_progress(worker);
  ucp_request_free(req);
}

ucs_status_ptr_t am_send(ucp_ep_h ep, unsigned id, const void* data, size_t n) {
  ucp_request_param_t p{};
  p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  p.flags = UCP_AM_SEND_FLAG_REPLY;
  return ucp_am_send_nbx(ep, id, nullptr, 0, data, n, &p);
}

ucp_ep_params_t peer_params() {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = [](void*, ucp_ep_h, ucs_status_t) {};
  return params;
}

void set_handler(ucp_worker_h w, unsigned id, ucp_am_recv_callback_t cb, void* arg) {
  ucp_am_handler_param_t h{};
  h.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                 UCP_AM_HANDLER_PARAM_FIELD_ARG;
  h.id = id;
  h.cb = cb;
  h.arg = arg;
  TROUPE_UCS_CHECK(ucp_worker_set_am_recv_handler(w, &h));
}

std::atomic<bool> g_stop{false};

comm::UcxContextOptions raw_context_options() {
  comm::UcxContextOptions o;
  o.shared_memory = true;
  o.tag = false;
  return o;
}

std::string lane_transports(ucp_ep_h ep) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  ucp_ep_print_info(ep, f);
  fclose(f);
  std::string text(buf, len);
  if (getenv("TROUPE_DEBUG_LANES")) fputs(text.c_str(), stderr);
  free(buf);
  // Lines look like "#   lane[1]:  3:sysv/memory.0 md[2] -> ... am am_bw#0": collect the
  // transport/device of each lane that carries active messages or bulk data.
  std::string out;
  size_t pos = 0;
  while ((pos = text.find("lane[", pos)) != std::string::npos) {
    size_t eol = text.find('\n', pos);
    std::string line = text.substr(pos, eol - pos);
    pos = eol;
    size_t start = line.find(':');
    if (start == std::string::npos || line.find(" cm ") != std::string::npos) continue;
    size_t tl_begin = line.find(':', start + 1);
    if (tl_begin == std::string::npos) continue;
    size_t tl_end = line.find(' ', tl_begin);
    std::string tl = line.substr(tl_begin + 1, tl_end - tl_begin - 1);
    std::string role = line.find(" am ") != std::string::npos ? "(am)" : "";
    out += (out.empty() ? "" : ",") + tl + role;
  }
  return out;
}

}  // namespace

int run_raw_ucx_server(const std::vector<std::string>& args) {
  signal(SIGTERM, [](int) { g_stop.store(true); });
  comm::UcxContext ctx(raw_context_options());
  comm::UcxWorker worker(ctx, false);
  ServerState st;
  st.worker = worker.get();
  set_handler(
      worker.get(), kPing,
      [](void* arg, const void*, size_t, void* data, size_t n, const ucp_am_recv_param_t* p) {
        ucs_status_ptr_t r = am_send(p->reply_ep, kPong, data, n);
        if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);  // eager: data copied
        return UCS_OK;
      },
      &st);
  set_handler(
      worker.get(), kOneWay,
      [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
        ++static_cast<ServerState*>(arg)->one_way;
        return UCS_OK;
      },
      &st);
  set_handler(
      worker.get(), kCountQuery,
      [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t* p) {
        auto* s = static_cast<ServerState*>(arg);
        static uint64_t reply;
        reply = s->one_way;
        ucs_status_ptr_t r = am_send(p->reply_ep, kCountReply, &reply, sizeof reply);
        if (r != nullptr && !UCS_PTR_IS_ERR(r)) ucp_request_free(r);
        return UCS_OK;
      },
      &st);
  ucp_listener_conn_handler_t conn{[](ucp_conn_request_h req, void* arg) {
                                     auto* s = static_cast<ServerState*>(arg);
                                     ucp_ep_params_t params = peer_params();
                                     params.field_mask |= UCP_EP_PARAM_FIELD_CONN_REQUEST;
                                     params.conn_request = req;
                                     ucp_ep_create(s->worker, &params, &s->ep);
                                   },
                                   &st};
  comm::UcxListener listener(worker, "127.0.0.1", 0, conn);
  std::printf("raw listening 127.0.0.1:%u\n", listener.port());
  std::fflush(stdout);
  while (!g_stop.load()) ucp_worker_progress(worker.get());
  return 0;
}

RawUcxResult raw_ucx_client(const std::string& address, int round_trips, int messages,
                            int payload_bytes) {
  struct ClientState {
    bool pong = false;
    uint64_t count = 0;
    bool count_ready = false;
  } st;
  comm::UcxContext ctx(raw_context_options());
  comm::UcxWorker worker(ctx, false);
  set_handler(
      worker.get(), kPong,
      [](void* arg, const void*, size_t, void*, size_t, const ucp_am_recv_param_t*) {
        static_cast<ClientState*>(arg)->pong = true;
        return UCS_OK;
      },
      &st);
  set_handler(
      worker.get(), kCountReply,
      [](void* arg, const void*, size_t, void* data, size_t n, const ucp_am_recv_param_t*) {
        auto* s = static_cast<ClientState*>(arg);
        std::memcpy(&s->count, data, sizeof s->count);
        s->count_ready = true;
        return UCS_OK;
      },
      &st);
  auto [host, port] = comm::split_host_port(address);
  comm::SockAddr sa = comm::resolve(host, port);
  ucp_ep_params_t params = peer_params();
  params.field_mask |= UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa.storage);
  params.sockaddr.addrlen = sa.length;
  ucp_ep_h ep = nullptr;
  TROUPE_UCS_CHECK(ucp_ep_create(worker.get(), &params, &ep));

  std::vector<char> payload(payload_bytes, 'x');
  RawUcxResult out;
  auto ping = [&] {
    st.pong = false;
    wait_request(worker.get(), am_send(ep, kPing, payload.data(), payload.size()));
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (!st.pong) {
      ucp_worker_progress(worker.get());
      if (Clock::now() > deadline) throw std::runtime_error("raw UCX: no pong within 5 s");
    }
  };
  for (int i = 0; i < 200; ++i) ping();  // warm-up (wire-up of the lanes)
  out.transports = lane_transports(ep);
  out.rtt_us.reserve(round_trips);
  for (int i = 0; i < round_trips; ++i) {
    auto t = Clock::now();
    ping();
    out.rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  auto t0 = Clock::now();
  for (int i = 0; i < messages; ++i) {
    ucs_status_ptr_t r = am_send(ep, kOneWay, payload.data(), payload.size());
    if (r != nullptr) wait_request(worker.get(), r);
  }
  auto deadline = Clock::now() + std::chrono::seconds(30);
  while (true) {
    st.count_ready = false;
    wait_request(worker.get(), am_send(ep, kCountQuery, nullptr, 0));
    while (!st.count_ready && Clock::now() < deadline) ucp_worker_progress(worker.get());
    if (st.count >= uint64_t(messages) || Clock::now() >= deadline) break;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  out.messages_per_s = st.count / secs;

  ucp_request_param_t cp{};
  cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &cp);
  if (r != nullptr && !UCS_PTR_IS_ERR(r)) wait_request(worker.get(), r);
  return out;
}

}  // namespace troupe::bench
