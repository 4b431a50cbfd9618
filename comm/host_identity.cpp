#include "comm/host_identity.h"

#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

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

bool process_gone(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  if (!in) return true;
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
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
