// This host and its processes as the data plane sees them: which members share this host (and
// so may share memory), whether a co-located member's process still exists, and how many cores
// this process may use.
#pragma once

#include <string>

namespace troupe::comm {

// The host name, the boot id and the pid namespace: containers that share a host name, or
// processes of another pid namespace, are not "this host" (their pids differ). Never has '@'.
std::string host_identity();

// Whether a process on this host is gone (exited, or a zombie waiting to be reaped).
bool process_gone(int pid);

// The cores this process may run on (its affinity mask).
int usable_cores();

}  // namespace troupe::comm
