// The bridge: one actor per process that owns the UCX transport and carries ControlMessages
// between CAF actors in different processes.
//
//   - register:  (register_atom, uint64 actor_id, actor)      makes a local actor reachable
//   - connect:   (connect_atom, "HOST:PORT") -> uint64 node    handshake with another process
//   - send:      (send_atom, RemoteAddress, ControlMessage)    one way
//   - request:   (request_atom, RemoteAddress, ControlMessage, uint32 timeout_ms)
//                  -> ControlMessage, or an error: peer_lost, timed_out, no_actor, remote
//   - monitor:   (monitor_atom, uint64 node)  the sender gets a NodeDown when the node is lost
//   - demonitor: (demonitor_atom, uint64 node) it no longer does (a node that leaves unwatched
//                is logged as disconnected, not as lost)
//   - observe:   (observe_atom)               the sender gets NodeUp/NodeDown for every node
//   - info:      (info_atom) -> (uint64 node_id, std::string address)
//   - generation:(generation_atom, uint64 g)  stamps outbound messages, drops older inbound ones
//   - disconnect:(disconnect_atom, uint64 node, string reason) cut and fence a node: it is
//     reported lost (timed_out, the reason) as one silent past the failure timeout
//   - silence:   (silence_atom) -> std::vector<uint64> {node, milliseconds since last heard, ...}
//                for every node the failure detector watches
//   - timing:    (timing_atom, uint32 heartbeat_ms, uint32 failure_ms) heartbeats and the
//                failure timeout from now on (an agent takes its job's once it has joined)
//
// A registered actor receives one-way messages as ControlMessage and requests as a CAF request
// whose reply (a ControlMessage) the bridge sends back. Messages to this node's own actors are
// delivered in-process and never touch UCX.
//
// Heartbeats: every heartbeat_interval the bridge sends a heartbeat to every connected node; a
// node not heard from for failure_timeout is cut, fenced and reported lost (code timed_out).
// An endpoint error is reported at once (code peer_lost). Whichever comes first wins.
//
// Bad frames (random bytes, truncated, oversized, wrong job or token, stale generation) are
// dropped, logged (rate limited) and counted; the bridge goes on serving everyone else.
#pragma once

#include <caf/all.hpp>
#include <chrono>
#include <string>

#include "actors/messages.h"
#include "comm/transport.h"

namespace troupe::actors {

// The answer to a request of another job's id or token (refused): the request can never be valid
// there, as admin commands say (exit 2).
constexpr const char* kWrongJobOrToken = "wrong job id or token for this job";

struct BridgeConfig {
  comm::TransportOptions transport;
  std::string job_id = "troupe";
  std::string token;
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds failure_timeout{2000};
  std::chrono::milliseconds connect_timeout{5000};
  // A watched node's loss is acted on this long after the transport reports it (0: at once), so
  // that what it delivered just before is handled first: an agent handed the coordinator's
  // Shutdown unwatches it, and the coordinator's exit right after is then no loss.
  std::chrono::milliseconds loss_grace{0};
};

// The bridge settings of a training job's processes (coordinator, agents, admin commands): the
// control plane goes over tcp, never shared memory. UCX's shared-memory FIFO is written by the
// sender in place; a sender SIGKILLed in the middle of a write leaves a slot the receiver waits
// on for ever, and the coordinator, which hears from every agent, would stop hearing from all
// of them (seen in the pipeline tests: every survivor "silent" 1.6 s after one was killed). A
// communicator lives one generation, so the data plane keeps shared memory.
BridgeConfig job_bridge_config(const std::string& job_id, const std::string& token);

// Spawns the bridge on its own thread (a detached actor). Throws comm::Error if the transport
// cannot start (e.g. the listen address is taken).
caf::actor spawn_bridge(caf::actor_system& system, const BridgeConfig& config);

// The actor id of the bridge itself (serves statsRequest).
constexpr uint64_t kBridgeActorId = 0;

}  // namespace troupe::actors
