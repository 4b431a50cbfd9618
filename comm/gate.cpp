#include "comm/gate.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <list>
#include <vector>

#include "comm/error.h"
#include "comm/ucx.h"

namespace troupe::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kMaxBuffered = 1 << 20;  // a side that stops reading is cut past this

// One client, relayed to UCX's listener.
struct Relay {
  int client = -1, inner = -1;
  bool connecting = true;   // the inner connect is in progress
  bool first_done = false;  // the client's first message was complete (then no deadline)
  Clock::time_point deadline;
  std::string header;       // a header being read
  size_t payload_left = 0;  // private-data bytes of the current message still to pass
  size_t from_client = 0;   // bytes the client sent in all
  std::string to_inner, to_client;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

struct Gate::Impl {
  int listen_fd = -1, wake_fd = -1;
  SockAddr inner;
  std::chrono::milliseconds deadline;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> accepted{0}, malformed{0}, slow{0}, full{0};
  std::list<Relay> relays;
  int pending = 0;  // relays whose first message is not complete

  void loop();
  void accept_all();
  SockAddr inner_for(int client) const;
  bool on_client_readable(Relay& r);  // false: cut it
  bool take_client_bytes(Relay& r, const char* data, size_t n);
  bool flush(int fd, std::string& out);
  void cut(std::list<Relay>::iterator it);
};

// Passes the client's bytes on as whole connection-manager messages, checking each header: its
// length must fit the private data UCX reads. false: the bytes are not what UCX expects.
bool Gate::Impl::take_client_bytes(Relay& r, const char* data, size_t n) {
  r.from_client += n;
  if (r.from_client > Gate::kMaxSetupBytes) return false;
  while (n > 0) {
    if (r.payload_left > 0) {
      const size_t take = std::min(n, r.payload_left);
      r.to_inner.append(data, take);
      r.payload_left -= take;
      data += take;
      n -= take;
      continue;
    }
    const size_t take = std::min(n, Gate::kHeaderBytes - r.header.size());
    r.header.append(data, take);
    data += take;
    n -= take;
    if (r.header.size() < Gate::kHeaderBytes) break;
    uint64_t length = 0;
    std::memcpy(&length, r.header.data(), sizeof length);  // (size_t, this machine's order)
    if (length > Gate::kMaxPrivateData) return false;
    r.to_inner += r.header;
    r.header.clear();
    r.payload_left = size_t(length);
  }
  if (!r.first_done && r.from_client >= Gate::kHeaderBytes && r.header.empty() &&
      r.payload_left == 0) {
    r.first_done = true;
    --pending;
    accepted.fetch_add(1);
  }
  return true;
}

bool Gate::Impl::on_client_readable(Relay& r) {
  char buf[kReadChunk];
  const ssize_t n = ::read(r.client, buf, sizeof buf);
  if (n == 0) return false;  // the client left
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  if (!take_client_bytes(r, buf, size_t(n))) {
    malformed.fetch_add(1);
    return false;
  }
  return r.to_inner.size() <= kMaxBuffered;
}

// Writes what it can; false on an error.
bool Gate::Impl::flush(int fd, std::string& out) {
  while (!out.empty()) {
    const ssize_t n = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL);
    if (n < 0) return errno == EAGAIN || errno == EINTR;
    out.erase(0, size_t(n));
  }
  return true;
}

void Gate::Impl::cut(std::list<Relay>::iterator it) {
  if (!it->first_done) --pending;
  close_fd(it->client);
  close_fd(it->inner);
  relays.erase(it);
}

// UCX's listener at the address the client reached (of the interface it came in on): UCX answers
// with that interface's transport addresses. With a wildcard listen (0.0.0.0) a relay to
// 0.0.0.0 arrived over loopback, and UCX offered a client on another host loopback's addresses
// ("failed to connect to remote address on device lo": unreachable).
SockAddr Gate::Impl::inner_for(int client) const {
  SockAddr to = inner;
  sockaddr_in local{};
  socklen_t len = sizeof local;
  if (::getsockname(client, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
      local.sin_family == AF_INET) {
    local.sin_port = reinterpret_cast<const sockaddr_in*>(&inner.storage)->sin_port;
    std::memcpy(&to.storage, &local, sizeof local);
    to.length = sizeof local;
  }
  return to;
}

void Gate::Impl::accept_all() {
  while (true) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    if (pending >= Gate::kMaxPending || int(relays.size()) >= Gate::kMaxRelays) {
      full.fetch_add(1);
      ::close(fd);
      continue;
    }
    Relay r;
    r.client = fd;
    r.deadline = Clock::now() + deadline;
    r.inner = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    const int one = 1;
    ::setsockopt(r.inner, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    const SockAddr to = inner_for(fd);
    if (r.inner < 0 ||
        (::connect(r.inner, reinterpret_cast<const sockaddr*>(&to.storage), to.length) != 0 &&
         errno != EINPROGRESS)) {
      close_fd(r.inner);
      ::close(fd);
      continue;
    }
    ++pending;
    relays.push_back(std::move(r));
  }
}

void Gate::Impl::loop() {
  while (!stop.load()) {
    std::vector<pollfd> fds{{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    std::vector<std::list<Relay>::iterator> order;
    auto now = Clock::now();
    int timeout_ms = -1;
    for (auto it = relays.begin(); it != relays.end(); ++it) {
      short in_ev = POLLIN, client_ev = POLLIN;
      if (it->connecting || !it->to_inner.empty()) in_ev |= POLLOUT;
      if (!it->to_client.empty()) client_ev |= POLLOUT;
      fds.push_back({it->client, client_ev, 0});
      fds.push_back({it->inner, in_ev, 0});
      order.push_back(it);
      if (!it->first_done) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(it->deadline - now);
        int ms = int(std::max<int64_t>(0, left.count())) + 1;
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      }
    }
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) return;
    if (fds[1].revents) {
      uint64_t n;
      (void)!::read(wake_fd, &n, sizeof n);
    }
    now = Clock::now();
    for (size_t k = 0; k < order.size(); ++k) {
      Relay& r = *order[k];
      const pollfd& c = fds[2 + 2 * k];
      const pollfd& i = fds[3 + 2 * k];
      bool ok = true;
      if (r.connecting && (i.revents & (POLLOUT | POLLERR | POLLHUP))) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(r.inner, SOL_SOCKET, SO_ERROR, &err, &len);
        ok = err == 0;
        r.connecting = false;
      }
      if (ok && (c.revents & (POLLIN | POLLHUP | POLLERR))) ok = on_client_readable(r);
      if (ok && !r.connecting && (i.revents & (POLLIN | POLLHUP | POLLERR))) {
        char buf[kReadChunk];
        const ssize_t n = ::read(r.inner, buf, sizeof buf);
        ok = n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
        if (n > 0) r.to_client.append(buf, size_t(n));
        ok = ok && r.to_client.size() <= kMaxBuffered;
      }
      if (ok && !r.connecting) ok = flush(r.inner, r.to_inner);
      if (ok) ok = flush(r.client, r.to_client);
      if (ok && !r.first_done && now > r.deadline) {
        slow.fetch_add(1);
        ok = false;
      }
      if (!ok) cut(order[k]);
    }
    if (fds[0].revents) accept_all();
  }
}

Gate::Gate(const std::string& host, uint16_t port, uint16_t inner_port,
           std::chrono::milliseconds first_message_deadline)
    : impl_(std::make_unique<Impl>()) {
  impl_->deadline = first_message_deadline;
  impl_->inner = resolve(host, inner_port);
  SockAddr addr = resolve(host, port);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr.storage), addr.length) != 0 ||
      ::listen(fd, 128) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    TROUPE_FAIL(Errc::io, "cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  sockaddr_in bound{};
  socklen_t len = sizeof bound;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(bound.sin_port);
  impl_->listen_fd = fd;
  impl_->wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread([impl = impl_.get()] { impl->loop(); });
}

Gate::~Gate() {
  impl_->stop.store(true);
  uint64_t one = 1;
  (void)!::write(impl_->wake_fd, &one, sizeof one);
  thread_.join();
  for (auto it = impl_->relays.begin(); it != impl_->relays.end();) impl_->cut(it++);
  close_fd(impl_->listen_fd);
  close_fd(impl_->wake_fd);
}

GateCounters Gate::counters() const {
  return {impl_->accepted.load(), impl_->malformed.load(), impl_->slow.load(), impl_->full.load()};
}

}  // namespace troupe::comm
