// Errors of the communication layer, named by what the caller should do.
//
//   peer_lost      a peer died or its link broke: abort and rebuild (the transport's state
//                  toward that peer is unknown)
//   timed_out      a deadline passed (a hung or stopped peer, or a slow network)
//   aborted        the operation was cancelled by a local abort()
//   invalid_input  a frame, file or argument was malformed: tell the user, drop the input
//   io             the local system failed (UCX, sockets, files)
//   internal       an enforce failure: a bug in Troupe
//   refused        the receiver understood and will not do it (a finished job, too few workers
//                  left): tell the user its reason
//   no_actor       the destination process has no such actor (not started, or the wrong address)
//
// This is the one vocabulary above comm/ too: control-plane replies carry it on the wire
// (ErrorReply.errc in control.capnp) and actors receive it as a CAF error of category "troupe"
// whose code is the Errc (actors/messages.h).
// Thread-safety: Error is an immutable value; copy it freely.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace troupe::comm {

enum class Errc {
  ok = 0,
  peer_lost,
  timed_out,
  aborted,
  invalid_input,
  io,
  internal,
  refused,
  no_actor
};
constexpr int kErrcCount = 9;

const char* errc_name(Errc code);
// The Errc of a wire value (ErrorReply.errc); unknown values are `internal`.
Errc errc_from_wire(uint32_t value);

// The end of the error of a member whose operation failed because another gave up first (its
// notice): that other's own error says why.
constexpr const char* kGaveUpFirst = ", which gave up first";

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message)
      : std::runtime_error(std::string(errc_name(code)) + ": " + message), code_(code) {}
  Errc code() const { return code_; }

 private:
  Errc code_;
};

// Throws Error(code, message) with the source location appended.
[[noreturn]] void fail(Errc code, const std::string& message, const char* file, int line);

}  // namespace troupe::comm

#define TROUPE_FAIL(code, msg) ::troupe::comm::fail((code), (msg), __FILE__, __LINE__)

// An enforce: a condition that only a bug in Troupe can break.
#define TROUPE_ENFORCE(cond, msg)                                                              \
  do {                                                                                         \
    if (!(cond)) TROUPE_FAIL(::troupe::comm::Errc::internal, std::string(#cond ": ") + (msg)); \
  } while (0)
