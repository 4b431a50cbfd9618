// The subcommands of `troupe`. Each returns the process exit code; bad arguments throw
// std::invalid_argument (main prints it and exits 2).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/bridge.h"
#include "cli/args.h"
#include "workers/faults.h"

namespace troupe::cli {

// What a build wires into the command: the release `troupe` passes none; the test build
// (`troupe_test`) a fault injector for its agents' workers.
struct Hooks {
  std::function<std::shared_ptr<workers::FaultInjector>()> faults;
};

// The command: `troupe ARGS...`; returns the exit code.
int troupe_main(int argc, char** argv, const Hooks& hooks);

int run_node(const std::vector<std::string>& args);
int run_demo_control(const std::vector<std::string>& args);
int run_run(const std::vector<std::string>& args);
int run_coordinator(const std::vector<std::string>& args);
int run_agent_command(const std::vector<std::string>& args, const Hooks& hooks);
int run_status(const std::vector<std::string>& args);
int run_stop(const std::vector<std::string>& args);
int run_drain(const std::vector<std::string>& args);
int run_scale(const std::vector<std::string>& args);
actors::BridgeConfig bridge_config_from(const Args& args);

}  // namespace troupe::cli
