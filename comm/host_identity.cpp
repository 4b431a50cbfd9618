#include "comm/host_identity.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>

namespace troupe::comm {

std::string host_identity() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat st {};
  unsigned long long pidns = stat("/proc/self/ns/pid", &st) == 0 ? st.st_ino : 0;
  std::string id = std::string(buf) + "/" + boot + "/" + std::to_string(pidns);
  std::replace(id.begin(), id.end(), '@', '_');
  return id;
}

// (read(2), not a stream: a process reaped between the open and the read makes the read fail
// with ESRCH, which libstdc++'s filebuf throws as an exception instead of ending the input.)
bool process_gone(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  // Gone: no /proc/PID (ENOENT), or reaped since the open (ESRCH, or nothing to read). Any other
  // error (out of descriptors) says nothing of the process; nor does ENOENT under /proc mounted
  // with hidepid=2, for another user's process, which kill(2) says is there (EPERM).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) return !(::kill(pid, 0) != 0 && errno == EPERM);
  if (fd < 0) return errno == ESRCH;
  char buf[512];
  ssize_t n;
  do n = ::read(fd, buf, sizeof buf);
  while (n < 0 && errno == EINTR);
  const int read_errno = errno;
  ::close(fd);
  if (n < 0) return read_errno == ESRCH;
  if (n == 0) return true;
  const std::string stat(buf, size_t(n));
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return false;
  char state = stat[close + 2];
  return state == 'Z' || state == 'X';
}

int usable_cores() {
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  return sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus)
                                                       : int(sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace troupe::comm
