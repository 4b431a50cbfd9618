// The one wrapping layer over UCX's C API: a check macro and RAII owners for the context, the
// worker and the listener. Endpoints are owned by the Transport, which must progress the worker
// to close them.
//
// Thread-safety: the owners are not thread-safe; each belongs to the thread that progresses it.
#pragma once

#include <ucp/api/ucp.h>

#include <string>
#include <utility>

#include "comm/error.h"
#include "comm/transport.h"

namespace troupe::comm {

// Turns a UCX status into an Error(io) naming the call, file and line.
#define TROUPE_UCS_CHECK(expr)                                                           \
  do {                                                                                   \
    ucs_status_t troupe_status_ = (expr);                                                \
    if (troupe_status_ != UCS_OK)                                                        \
      TROUPE_FAIL(::troupe::comm::Errc::io,                                              \
                  std::string(#expr) + " failed: " + ucs_status_string(troupe_status_)); \
  } while (0)

struct UcxContextOptions {
  bool shared_memory = true;  // let sysv/posix carry messages even with peer error handling
  bool tag = true;            // tag matching, used by the data plane
  // UCX's keepalive round (empty: UCX's default, 20 s). Shared-memory endpoints learn of a dead
  // peer only from keepalive, so the data plane sets it well below its failure timeout.
  std::string keepalive_interval;
};

class UcxContext {
 public:
  explicit UcxContext(const UcxContextOptions& options);
  ~UcxContext();
  UcxContext(UcxContext&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  UcxContext& operator=(UcxContext&&) = delete;
  ucp_context_h get() const { return handle_; }
  void abandon() { handle_ = nullptr; }  // (with its worker: UcxWorker::abandon)

 private:
  ucp_context_h handle_ = nullptr;
};

class UcxWorker {
 public:
  // thread_multi: UCS_THREAD_MODE_MULTI; otherwise single (one progress thread owns it).
  UcxWorker(const UcxContext& context, bool thread_multi);
  ~UcxWorker();
  UcxWorker(UcxWorker&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;
  UcxWorker& operator=(UcxWorker&&) = delete;
  ucp_worker_h get() const { return handle_; }
  int event_fd() const;
  // Left to the process's exit instead of destroyed: UCX aborts destroying a worker one of whose
  // endpoints never finished closing (one whose connection never formed, to a listener that is
  // not UCX's, keeps its first send pending).
  void abandon() { handle_ = nullptr; }

 private:
  ucp_worker_h handle_ = nullptr;
};

class UcxListener {
 public:
  // Listens on host:port (port 0: any free port); conn_handler runs on the progress thread.
  UcxListener(const UcxWorker& worker, const std::string& host, uint16_t port,
              ucp_listener_conn_handler_t conn_handler);
  ~UcxListener();
  UcxListener(const UcxListener&) = delete;
  UcxListener& operator=(const UcxListener&) = delete;
  ucp_listener_h get() const { return handle_; }
  uint16_t port() const { return port_; }

 private:
  ucp_listener_h handle_ = nullptr;
  uint16_t port_ = 0;
};

// Parses "host:port" (IPv4 or a name) into a sockaddr; throws Error(invalid_input).
struct SockAddr {
  sockaddr_storage storage{};
  socklen_t length = 0;
};
SockAddr resolve(const std::string& host, uint16_t port);
// The host others reach a listener on listen_host by: itself, or for the wildcard 0.0.0.0 the
// address of the default route's interface, else the first IPv4 address of an interface that is
// up, running and not loopback (127.0.0.1 when there is none).
std::string advertised_host(const std::string& listen_host);

// UCX's own log lines (its warnings and errors: a refused connect, a device it cannot reach) go
// to `sink`, not to stderr, where Troupe names what they mean itself; unless UCX_LOG_LEVEL is
// set, which keeps UCX's own printing. The sink is called from any thread.
using UcxLogSink = void (*)(bool error, const std::string& message);
void route_ucx_log(UcxLogSink sink);

}  // namespace troupe::comm
