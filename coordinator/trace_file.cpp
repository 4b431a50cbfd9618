#include "coordinator/trace_file.h"

#include <cstdio>
#include <fstream>

namespace troupe::coordinator {

std::string TraceFile::add(const actors::TraceChunk& c, const std::string& agent_name) {
  if (!named_.count(c.agent)) {
    named_[c.agent] = agent_name;
    events_.push_back({{"ph", "M"},
                       {"name", "process_name"},
                       {"pid", c.agent},
                       {"args", {{"name", agent_name}}}});
  }
  for (uint32_t thread : {0u, 1u})
    events_.push_back(
        {{"ph", "M"},
         {"name", "thread_name"},
         {"pid", c.agent},
         {"tid", c.device * 2 + thread},
         {"args",
          {{"name", "worker " + std::to_string(c.device) + (thread ? " reducer" : "") + " (rank " +
                        std::to_string(c.rank) + ")"}}}});
  for (const auto& e : c.events)
    events_.push_back({{"ph", "X"},
                       {"name", e.name},
                       {"cat", e.category},
                       {"ts", e.ts_us},
                       {"dur", e.dur_us},
                       {"pid", c.agent},
                       {"tid", c.device * 2 + e.thread},
                       {"args", {{"step", e.step}, {"rank", c.rank}}}});
  const std::string tmp = path_ + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"traceEvents", events_}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    if (!out.flush()) return "cannot write " + tmp;
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) return "cannot rename " + tmp;
  return "";
}

}  // namespace troupe::coordinator
