// The coordinator's Prometheus endpoint (observability.metrics_listen = "HOST:PORT"; port 0
// picks one): GET /metrics answers the text exposition format from a callback; every other
// request gets 404 (a malformed one 400). Built on cpp-httplib (Debian's libcpp-httplib-dev):
// a small pool of threads, each request read within a deadline, so a slow or stuck client ties
// up one thread for at most that long and cannot stop the scrapes. RAII: the destructor stops
// the server and joins its thread.
//
// Thread-safety: construct and destroy from one thread; the callback runs on the server's
// threads (it must be thread-safe: JobMetrics::exposition is).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace troupe::coordinator {

class MetricsServer {
 public:
  // Binds HOST:PORT; throws std::runtime_error naming the address when it cannot.
  MetricsServer(const std::string& listen, std::function<std::string()> body);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  const std::string& address() const { return address_; }  // HOST:PORT as bound

 private:
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  // Its thread left the accept loop (shared: a thread left to the process's exit outlives this).
  std::shared_ptr<std::atomic<bool>> ended_ = std::make_shared<std::atomic<bool>>(false);
  std::string address_;
};

}  // namespace troupe::coordinator
