#include "comm/ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <ucs/debug/log_def.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstring>
#include <mutex>

namespace troupe::comm {
namespace {

std::atomic<UcxLogSink> ucx_log_sink{nullptr};

ucs_log_func_rc_t on_ucx_log(const char* file, unsigned line, const char*, ucs_log_level_t level,
                             const ucs_log_component_config_t*, const char* format, va_list ap) {
  const UcxLogSink sink = ucx_log_sink.load();
  if (!sink || level > UCS_LOG_LEVEL_WARN) return UCS_LOG_FUNC_RC_CONTINUE;
  char text[512];
  std::vsnprintf(text, sizeof text, format, ap);
  const char* base = std::strrchr(file, '/');
  sink(level <= UCS_LOG_LEVEL_ERROR,
       std::string(base ? base + 1 : file) + ":" + std::to_string(line) + " " + text);
  return UCS_LOG_FUNC_RC_STOP;
}

}  // namespace

void route_ucx_log(UcxLogSink sink) {
  if (std::getenv("UCX_LOG_LEVEL")) return;
  ucx_log_sink.store(sink);
  static std::once_flag pushed;
  std::call_once(pushed, [] { ucs_log_push_handler(&on_ucx_log); });
}

UcxContext::UcxContext(const UcxContextOptions& options) {
  ucp_config_t* config = nullptr;
  TROUPE_UCS_CHECK(ucp_config_read(nullptr, nullptr, &config));
  // With UCP_ERR_HANDLING_MODE_PEER, UCX 1.13 skips shared-memory transports unless the mm
  // transports are told to support error handling. An explicit UCX_MM_ERROR_HANDLING wins.
  if (options.shared_memory && std::getenv("UCX_MM_ERROR_HANDLING") == nullptr) {
    ucs_status_t st = ucp_config_modify(config, "MM_ERROR_HANDLING", "y");
    if (st != UCS_OK)
      std::fprintf(
          stderr,
          "troupe: UCX has no MM_ERROR_HANDLING setting (%s): shared memory may be unused\n",
          ucs_status_string(st));
  }
  if (!options.keepalive_interval.empty() && std::getenv("UCX_KEEPALIVE_INTERVAL") == nullptr) {
    TROUPE_UCS_CHECK(
        ucp_config_modify(config, "KEEPALIVE_INTERVAL", options.keepalive_interval.c_str()));
    TROUPE_UCS_CHECK(ucp_config_modify(config, "KEEPALIVE_NUM_EPS", "inf"));
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP | (options.tag ? UCP_FEATURE_TAG : 0);
  params.mt_workers_shared = 0;
  ucs_status_t status = ucp_init(&params, config, &handle_);
  ucp_config_release(config);
  TROUPE_UCS_CHECK(status);
}

UcxContext::~UcxContext() {
  if (handle_) ucp_cleanup(handle_);
}

UcxWorker::UcxWorker(const UcxContext& context, bool thread_multi) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = thread_multi ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SINGLE;
  TROUPE_UCS_CHECK(ucp_worker_create(context.get(), &params, &handle_));
}

UcxWorker::~UcxWorker() {
  if (handle_) ucp_worker_destroy(handle_);
}

int UcxWorker::event_fd() const {
  int fd = -1;
  TROUPE_UCS_CHECK(ucp_worker_get_efd(handle_, &fd));
  return fd;
}

UcxListener::UcxListener(const UcxWorker& worker, const std::string& host, uint16_t port,
                         ucp_listener_conn_handler_t conn_handler) {
  SockAddr addr = resolve(host, port);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr.storage);
  params.sockaddr.addrlen = addr.length;
  params.conn_handler = conn_handler;
  ucs_status_t status = ucp_listener_create(worker.get(), &params, &handle_);
  if (status != UCS_OK) {
    TROUPE_FAIL(Errc::io, "cannot listen on " + host + ":" + std::to_string(port) + ": " +
                              ucs_status_string(status));
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  TROUPE_UCS_CHECK(ucp_listener_query(handle_, &attr));
  if (attr.sockaddr.ss_family == AF_INET) {
    port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  } else {
    port_ = ntohs(reinterpret_cast<const sockaddr_in6*>(&attr.sockaddr)->sin6_port);
  }
}

UcxListener::~UcxListener() {
  if (handle_) ucp_listener_destroy(handle_);
}

SockAddr resolve(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    TROUPE_FAIL(Errc::invalid_input, "cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  SockAddr out;
  std::memcpy(&out.storage, result->ai_addr, result->ai_addrlen);
  out.length = result->ai_addrlen;
  freeaddrinfo(result);
  reinterpret_cast<sockaddr_in*>(&out.storage)->sin_port = htons(port);
  return out;
}

// The source address of the default route: a UDP socket's connect picks the route and sends
// nothing. "" without one.
std::string default_route_address() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in out{};
  out.sin_family = AF_INET;
  out.sin_port = htons(9);
  ::inet_pton(AF_INET, "203.0.113.1", &out.sin_addr);  // (TEST-NET-3: any address off this host)
  sockaddr_in local{};
  socklen_t len = sizeof local;
  char text[INET_ADDRSTRLEN] = {};
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&out), sizeof out) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
                  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof text) != nullptr;
  ::close(fd);
  return ok && std::string(text).rfind("127.", 0) != 0 ? text : "";
}

std::string advertised_host(const std::string& listen_host) {
  if (listen_host != "0.0.0.0") return listen_host;
  if (std::string routed = default_route_address(); !routed.empty()) return routed;
  ifaddrs* all = nullptr;
  std::string found = "127.0.0.1";
  if (::getifaddrs(&all) != 0) return found;
  for (const ifaddrs* i = all; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) ||
        !(i->ifa_flags & IFF_RUNNING) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text)) {
      found = text;
      break;
    }
  }
  ::freeifaddrs(all);
  return found;
}

std::pair<std::string, uint16_t> split_host_port(const std::string& host_port) {
  auto colon = host_port.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size()) {
    TROUPE_FAIL(Errc::invalid_input, "address '" + host_port + "' is not HOST:PORT");
  }
  std::string port_text = host_port.substr(colon + 1);
  char* end = nullptr;
  long port = std::strtol(port_text.c_str(), &end, 10);
  if (*end != '\0' || port < 0 || port > 65535) {
    TROUPE_FAIL(Errc::invalid_input, "address '" + host_port + "' has a bad port");
  }
  return {host_port.substr(0, colon), static_cast<uint16_t>(port)};
}

}  // namespace troupe::comm
