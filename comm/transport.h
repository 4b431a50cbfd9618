// The UCX transport: one per process. It owns the UCX context and worker, a listener on
// HOST:PORT (the Gate's, which relays well-formed connection setups to UCX's listener on an
// internal port: comm/gate.h), the endpoints to every peer, and the one progress thread that
// drives them all.
//
// Peers are identified by NodeId, a random 64-bit id chosen per process incarnation (a
// restarted process is a new node). A connection starts with a hello handshake that tells each
// side the other's NodeId; frames are opaque byte strings (the control plane puts Cap'n Proto
// envelopes in them), copied into 64-byte-aligned Buffers on receipt.
//
// Failures: every endpoint uses UCP_ERR_HANDLING_MODE_PEER, so a dead peer is reported to the
// handler's on_peer_lost (endpoint error), never as a hang. disconnect(node, fence=true) cuts a
// link on purpose (missed heartbeats) and fences the node: its frames and later hellos are
// refused, so a stopped process that wakes up cannot slip back in.
//
// Thread-safety: connect, send, disconnect, counters and is_connected may be called from any
// thread. Handler callbacks run on the progress thread, one at a time: keep them short.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "comm/buffer.h"
#include "comm/error.h"

namespace troupe::comm {

using NodeId = uint64_t;

struct TransportOptions {
  std::string listen_host = "127.0.0.1";
  uint16_t listen_port = 0;  // 0: any free port; address() reports the real one
  bool listen = true;
  NodeId node_id = 0;  // 0: a random id
  size_t max_frame_bytes = 16u << 20;
  bool shared_memory = true;  // sysv/posix between processes on one host (UCX_MM_ERROR_HANDLING)
  int spin_us = 50;           // busy-poll this long after activity before sleeping on the fd
};

struct TransportCounters {
  uint64_t frames_sent = 0;
  uint64_t frames_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t rejected_bad_header = 0;    // wrong magic/version/length of the transport header
  uint64_t rejected_oversized = 0;     // frame larger than max_frame_bytes
  uint64_t rejected_unknown_peer = 0;  // a frame before the hello, or a spoofed node id
  uint64_t rejected_fenced = 0;        // a frame or hello from a fenced node
  uint64_t send_failures = 0;          // sends to a lost or unknown peer, or failed in UCX
  uint64_t gate_accepted = 0;          // connections the gate relayed to UCX (comm/gate.h)
  uint64_t gate_refused = 0;           // cut by the gate: malformed, slow, or too many
};

// Splits "HOST:PORT"; throws Error(invalid_input) naming the address when it is malformed.
std::pair<std::string, uint16_t> split_host_port(const std::string& host_port);

class TransportHandler {
 public:
  virtual ~TransportHandler() = default;
  virtual void on_frame(NodeId from, Buffer frame) = 0;
  virtual void on_peer_connected(NodeId node) {}
  virtual void on_peer_lost(NodeId node, Errc why, const std::string& reason) = 0;
  // Called on the progress thread after each round of progress that did work, outside any UCX
  // callback: where deferred work (actors made runnable by on_frame) can run.
  virtual void after_progress() {}
};

class Transport {
 public:
  // Starts listening (if options.listen) and the progress thread. handler must outlive this.
  Transport(const TransportOptions& options, TransportHandler* handler);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  NodeId node_id() const;
  // "HOST:PORT" of the listener (the real port when listen_port was 0); empty if not listening.
  std::string address() const;

  // Connects to a listener and completes the hello handshake. Blocks the caller (never the
  // progress thread) up to timeout. Throws Error: timed_out, peer_lost (refused or failed),
  // invalid_input (bad address).
  NodeId connect(const std::string& host_port, std::chrono::milliseconds timeout);

  // The same without blocking: done(node, nullptr) or done(0, error) runs on the progress thread.
  using ConnectDone = std::function<void(NodeId, std::exception_ptr)>;
  void connect_async(const std::string& host_port, std::chrono::milliseconds timeout,
                     ConnectDone done);

  // Queues a frame; returns false (and counts a send failure) if the node is not connected.
  // Delivery failures after that surface as on_peer_lost.
  bool send(NodeId to, Buffer frame);

  // Cuts the link to node and reports it lost (as why, with reason). fence: refuse the node
  // from now on (its frames and hellos), so a stopped process that wakes up stays out.
  void disconnect(NodeId node, Errc why, const std::string& reason, bool fence);

  bool is_connected(NodeId node) const;
  TransportCounters counters() const;

  // Tests of bad input only: sends a frame whose transport header has the given magic.
  bool send_with_magic_for_test(NodeId to, Buffer frame, uint32_t magic);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::comm
