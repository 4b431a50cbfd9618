// This host and its processes as the data plane sees them: which members share this host (and
// so may share memory), whether a co-located member's process still exists, and how many cores
// this process may use.
#pragma once

#include <string>

namespace troupe::comm {

// The host name, the boot id and the pid namespace: containers that share a host name, or
// processes of another pid namespace, are not "this host" (their pids differ). Never has '@'.
std::string host_identity();
// Whether an identity host_identity() made tells hosts and pid namespaces apart: false when the
// boot id or the namespace could not be read there ("host//0"). (Inline: the run record's
// readers, which link no communicator, ask it of agents' identities.)
inline bool whole_host_identity(const std::string& identity) {
  const size_t ns = identity.rfind('/');
  const size_t boot =
      ns == std::string::npos || ns == 0 ? std::string::npos : identity.rfind('/', ns - 1);
  return boot != std::string::npos && ns > boot + 1 && ns + 1 < identity.size() &&
         identity.substr(ns + 1) != "0";
}

// Whether a process on this host is gone (exited, or a zombie waiting to be reaped).
bool process_gone(int pid);

// The cores this process may run on (its affinity mask).
int usable_cores();

}  // namespace troupe::comm
