// CAF glue for the control plane: atoms, message types, errors. Include only where actors are
// defined (CAF headers are costly to compile).
#pragma once

#include <caf/all.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "actors/control_message.h"
#include "comm/error.h"

namespace troupe::actors {

// Where a control-plane actor lives: (node id, actor id within that node).
struct RemoteAddress {
  uint64_t node = 0;
  uint64_t actor = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, RemoteAddress& x) {
  return f(caf::meta::type_name("remote_address"), x.node, x.actor);
}

// Delivered to every actor that monitors a node when the node is lost, like a down_msg.
struct NodeDown {
  uint64_t node = 0;
  comm::Errc code = comm::Errc::peer_lost;  // peer_lost (endpoint error), timed_out (heartbeats)
  std::string reason;                       // for a person
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeDown& x) {
  return f(caf::meta::type_name("node_down"), x.node, x.code, x.reason);
}

// Delivered to observers when a node completes the handshake.
struct NodeUp {
  uint64_t node = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, NodeUp& x) {
  return f(caf::meta::type_name("node_up"), x.node);
}

// Atoms (at most 10 characters in CAF 0.17).
using connect_atom = caf::atom_constant<caf::atom("connect")>;
using send_atom = caf::atom_constant<caf::atom("rsend")>;
using request_atom = caf::atom_constant<caf::atom("rrequest")>;
using register_atom = caf::atom_constant<caf::atom("register")>;
using monitor_atom = caf::atom_constant<caf::atom("rmonitor")>;
using demonitor_atom = caf::atom_constant<caf::atom("rdemon")>;
using observe_atom = caf::atom_constant<caf::atom("observe")>;
using info_atom = caf::atom_constant<caf::atom("info")>;
using stats_atom = caf::atom_constant<caf::atom("stats")>;
using generation_atom = caf::atom_constant<caf::atom("gen")>;
using disconnect_atom = caf::atom_constant<caf::atom("disconn")>;
using silence_atom = caf::atom_constant<caf::atom("silence")>;
using timing_atom = caf::atom_constant<caf::atom("timing")>;

// Errors of the control plane: CAF errors of category atom("troupe") whose code is a comm::Errc
// (the one vocabulary, comm/error.h) and whose context is the message. A request answers one
// when the node is lost before the reply (peer_lost), no reply comes in time (timed_out), the
// destination has no such actor (no_actor), the connection is refused (refused), or the remote
// actor answered with an error (its Errc).
caf::error make_control_error(comm::Errc code, const std::string& message);

// The Errc and message of a control-plane error; nullopt for any other CAF error.
struct ControlError {
  comm::Errc code = comm::Errc::internal;
  std::string message;
};
std::optional<ControlError> control_error(const caf::error& e);

// Registers the types above and the error category. Call on every actor_system_config that
// spawns a bridge.
void add_control_types(caf::actor_system_config& cfg);

// The settings every Troupe process uses: at most max_threads scheduler threads (several
// processes share a few cores) and the control-plane types.
void configure_system(caf::actor_system_config& cfg, size_t max_threads = 2);

}  // namespace troupe::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::ControlMessage)
