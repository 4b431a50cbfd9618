// RUN_DIR/trace.json: the workers' spans of observability.trace_steps in the Chrome trace event
// format (JSON object with "traceEvents"; viewable in Perfetto or chrome://tracing). A process
// per agent (named after it), a thread per worker thread (device, and its reducer thread).
// Rewritten whole (temporary file, rename) each time a worker's chunk arrives, so the file is
// always complete JSON.
//
// Thread-safety: none; owned by the coordinator's actor.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "actors/job_protocol.h"

namespace troupe::coordinator {

class TraceFile {
 public:
  explicit TraceFile(std::string path) : path_(std::move(path)) {}

  // A worker's chunk (agent_name: for the process's name). Returns "" or why the file could
  // not be written.
  std::string add(const actors::TraceChunk& chunk, const std::string& agent_name);

 private:
  std::string path_;
  nlohmann::json events_ = nlohmann::json::array();
  std::map<uint32_t, std::string> named_;  // agents whose process_name is in events_
};

}  // namespace troupe::coordinator
