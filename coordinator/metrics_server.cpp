#include "coordinator/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <chrono>
#include <stdexcept>

namespace troupe::coordinator {
namespace {

// HOST:PORT ([V6]:PORT too) -> host and port; throws naming what is wrong.
std::pair<std::string, int> split_address(const std::string& a) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == a.size())
    throw std::runtime_error("observability.metrics_listen = \"" + a + "\" is not HOST:PORT");
  std::string host = a.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  const std::string port = a.substr(colon + 1);
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port) > 65535)
    throw std::runtime_error("observability.metrics_listen = \"" + a + "\": bad port");
  return {host, std::stoi(port)};
}

constexpr size_t kThreads = 4;        // concurrent requests; a fifth waits for a free thread
constexpr time_t kReadTimeoutS = 2;   // a request not read in full by then is dropped
constexpr time_t kWriteTimeoutS = 5;  // an answer not taken by then is dropped

}  // namespace

MetricsServer::MetricsServer(const std::string& listen, std::function<std::string()> body)
    : server_(std::make_unique<httplib::Server>()) {
  auto [host, port] = split_address(listen);
  server_->new_task_queue = [] { return new httplib::ThreadPool(kThreads); };
  server_->set_read_timeout(kReadTimeoutS, 0);
  server_->set_write_timeout(kWriteTimeoutS, 0);
  server_->set_keep_alive_max_count(100);
  server_->set_payload_max_length(64 * 1024);
  // httplib's default adds SO_REUSEPORT: a second job on the same port would share it, each
  // scrape answered by either. SO_REUSEADDR alone: a port in use is refused.
  server_->set_socket_options([](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server_->Get("/metrics",
               [body = std::move(body)](const httplib::Request&, httplib::Response& res) {
                 res.set_content(body(), "text/plain; version=0.0.4; charset=utf-8");
               });
  // Another method on /metrics: 405 with the methods it has (RFC 9110 15.5.6); another path:
  // 404 (whatever its method; unknown paths get it by default).
  auto refuse = [](const httplib::Request& req, httplib::Response& res) {
    res.status = req.path == "/metrics" ? 405 : 404;
    if (res.status == 405) res.set_header("Allow", "GET, HEAD");
  };
  server_->Post(".*", refuse);
  server_->Put(".*", refuse);
  server_->Patch(".*", refuse);
  server_->Delete(".*", refuse);
  server_->Options(".*", refuse);
  const int bound =
      port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (bound <= 0)
    throw std::runtime_error("observability.metrics_listen: cannot listen on " + listen +
                             " (in use, or not an address of this host)");
  address_ =
      (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(bound);
  thread_ = std::thread([s = server_.get(), ended = ended_] {
    s->listen_after_bind();
    *ended = true;
  });
}

MetricsServer::~MetricsServer() {
  // (httplib's stop() acts only on a server whose thread is in its accept loop: one that comes
  // before is lost, and the thread would wait in accept for good.)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!server_->is_running() && !*ended_ && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (!server_->is_running() && !*ended_) {  // (its thread never ran: left to the process's exit
    thread_.detach();                        // with the server it will use, leaked)
    (void)server_.release();
    return;
  }
  server_->stop();
  thread_.join();
}

}  // namespace troupe::coordinator
