// The subcommands of `troupe`. Each returns the process exit code; bad arguments throw
// std::invalid_argument (main prints it and exits 2).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/bridge.h"
#include "cli/parse.h"
#include "coordinator/config.h"
#include "models/extension.h"
#include "workers/faults.h"

namespace troupe::cli {

// What a build wires into the command: the release `troupe` passes none; the test build
// (`troupe_test`) a fault injector for its agents' workers; a program of its own (troupe::main,
// cli/main.h) its model and data set kinds.
struct Hooks {
  std::function<std::shared_ptr<workers::FaultInjector>()> faults;
  std::shared_ptr<const models::Extensions> extensions;
  // The program's kinds as the config checks their keys.
  coordinator::ExtensionKinds kinds() const;
};

// The command: `troupe ARGS...`; returns the exit code.
int troupe_main(int argc, char** argv, const Hooks& hooks);

int run_node(const std::vector<std::string>& args);
int run_demo_control(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args, const Hooks& hooks);
int run_coordinator(const std::vector<std::string>& args, const Hooks& hooks);
int run_agent_command(const std::vector<std::string>& args, const Hooks& hooks);
int run_status(const std::vector<std::string>& args);
int run_top(const std::vector<std::string>& args);  // troupe status --watch
int run_stop(const std::vector<std::string>& args);
int run_checkpoint(const std::vector<std::string>& args);
int run_drain(const std::vector<std::string>& args);
int run_scale(const std::vector<std::string>& args);
int run_lr(const std::vector<std::string>& args);
int run_export(const std::vector<std::string>& args, const Hooks& hooks);
int run_report(const std::vector<std::string>& args);
// Why `out` (an export's or a report's file) may not be written: a directory, one of the run's
// own files (its config, logs, token, lock, address, trace), in its checkpoints, or its data (a
// file, or in a data set's directory); "" when it may.
std::string overwrites_run(const std::string& run_dir, const std::string& checkpoints,
                           const std::string& out, const std::vector<std::string>& data = {});
int run_data(const std::vector<std::string>& args);  // prepare | encode | decode
// The control-plane flags of `troupe node` (and the benchmarks that start nodes).
struct BridgeFlags {
  std::string listen, job_id = "troupe-demo", token = "demo-token", token_file;
  int64_t heartbeat_ms = 200, failure_ms = 2000, spin_us = -1, max_frame_bytes = 0;
  void add_to(CLI::App& app);
  actors::BridgeConfig config() const;  // throws std::invalid_argument
};

}  // namespace troupe::cli
