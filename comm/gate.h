// The front door of a process's control-plane port.
//
// Why: UCX's TCP connection manager (uct tcp_sockcm, 1.13 and still on master) trusts the length
// in the first header a client sends. Random bytes give it a length past its 2 KiB buffer; it
// stops reading when the buffer is full while the socket stays readable, and its async thread
// spins on the level-triggered event for the rest of the process's life (4 KB of random bytes
// to a coordinator: 0.38 -> 0.93 cores, training throughput halved; docs/design.md).
//
// What: the advertised port is the gate's. It accepts, reads what a client sends as the
// connection manager's messages (a 16-byte header {size_t length; uint8_t status;} then
// `length` bytes of private data) and relays them, and UCX's answers back, to UCX's listener on
// an internal port of the same address. A header whose length does not fit the private data,
// more bytes than a connection setup needs, or no header within the deadline: the connection is
// cut, and UCX never sees it. Bounded: at most kMaxPending connections waiting for their first
// message, kMaxRelays relayed; the rest are closed at once. One thread, poll(2), no busy loop.
//
// Thread-safety: the gate runs on its own thread; port() and counters() from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace troupe::comm {

struct GateCounters {
  uint64_t accepted = 0;   // connections relayed to UCX
  uint64_t malformed = 0;  // cut: a header UCX would have choked on, or too many bytes
  uint64_t slow = 0;       // cut: no first message within the deadline
  uint64_t full = 0;       // closed at once: too many connections
};

class Gate {
 public:
  static constexpr size_t kHeaderBytes = 16;       // sizeof(uct_tcp_sockcm_priv_data_hdr_t)
  static constexpr size_t kMaxPrivateData = 2048;  // UCX_TCP_CM_PRIV_DATA_LEN's default
  static constexpr size_t kMaxSetupBytes = 64 << 10;
  static constexpr int kMaxPending = 64, kMaxRelays = 4096;

  // Listens on host:port (0: any) and relays to host:inner_port. Throws Error(io).
  Gate(const std::string& host, uint16_t port, uint16_t inner_port,
       std::chrono::milliseconds first_message_deadline = std::chrono::milliseconds(2000));
  ~Gate();
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  uint16_t port() const { return port_; }
  GateCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace troupe::comm
