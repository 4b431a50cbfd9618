#include "comm/error.h"

namespace troupe::comm {

const char* errc_name(Errc code) {
  switch (code) {
    case Errc::ok:
      return "ok";
    case Errc::peer_lost:
      return "peer_lost";
    case Errc::timed_out:
      return "timed_out";
    case Errc::aborted:
      return "aborted";
    case Errc::invalid_input:
      return "invalid_input";
    case Errc::io:
      return "io";
    case Errc::internal:
      return "internal";
    case Errc::refused:
      return "refused";
    case Errc::no_actor:
      return "no_actor";
  }
  return "unknown";
}

Errc errc_from_wire(uint32_t value) {
  return value > 0 && value < uint32_t(kErrcCount) ? Errc(value) : Errc::internal;
}

void fail(Errc code, const std::string& message, const char* file, int line) {
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  throw Error(code, message + " (" + base + ":" + std::to_string(line) + ")");
}

}  // namespace troupe::comm
