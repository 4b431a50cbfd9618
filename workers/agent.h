// The agent: one per host. It joins the coordinator (presenting the job token), receives the job
// spec, runs one worker per device on the worker's own thread, and follows the coordinator's
// generations until told to shut down. Exits non-zero with a one-line reason when the job cannot
// go on (coordinator lost, refused, a worker failed).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/extension.h"
#include "workers/faults.h"

namespace troupe::workers {

struct AgentOptions {
  std::string join;    // coordinator HOST:PORT
  std::string job_id;  // from the token file
  std::string token;   // from the token file
  std::vector<std::string> devices{"cpu:0"};
  // Where a coordinator that takes the run over says its address (RUN_DIR/coordinator.addr, next
  // to the token file); "": it is looked for at `join` only.
  std::string address_file;
  std::string name;  // for logs; default: host:pid
  // The control plane's heartbeats and failure timeout: until it has joined; then the job's
  // (elastic.heartbeat_interval_ms, failure_timeout_ms), each unless its own_ flag (given by hand).
  std::chrono::milliseconds heartbeat_interval{200};
  std::chrono::milliseconds failure_timeout{3000};
  bool own_heartbeat = false, own_failure_timeout = false;
  // How long it waits for a coordinator that does not listen yet at `join` (started after it):
  // 0, one try.
  std::chrono::milliseconds join_timeout{0};
  // Whether a signal asks it to leave (run_agent's watcher): the wait for a coordinator ends.
  std::function<bool()> interrupted;
  // Faults a test injects into the workers (the test build's `troupe_test` only; null here).
  std::shared_ptr<FaultInjector> faults;
  // The program's own model and data kinds (troupe::main); null: the built-in ones only. A job
  // whose kind the program lacks is refused at the join (exit 2).
  std::shared_ptr<const models::Extensions> extensions;
  // The kinds it trains, sent in its Join ("model:gpt", "data:tokens", ...: actors::Join::kinds),
  // so that a coordinator refuses it for a job it cannot train; empty: the built-in kinds and
  // `extensions`' (a loop of its own, troupe::ElasticLoop, says "model:external").
  std::vector<std::string> kinds;
  // The process is this agent's alone (`troupe agent`): once run_agent ends, a control plane
  // whose teardown outlasts 10 s is left behind with _Exit. Never for an agent embedded in a
  // program (a thread of it: the program goes on).
  bool own_process = false;
};

int run_agent(const AgentOptions& options);

// Reads a token file ("JOB_ID TOKEN"); throws std::invalid_argument naming the file.
std::pair<std::string, std::string> read_token_file(const std::string& path);

}  // namespace troupe::workers
