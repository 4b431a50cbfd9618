// Embedding Troupe in your own C++ program: start a job's coordinator inside your own CAF actor
// system, run its agents (here as threads of this process, each with its own actor system; in
// production, `troupe agent` processes on every host), and receive the job's step events in an
// actor of your own.
//
//   build/bin/troupe_embed_example
//
// Expected output: one line per committed step ("my actor saw step 3: loss 2.1...") and, at the
// end, "embedded job finished: 20 steps, loss fell from X to Y". Exits non-zero if the job failed,
// the loss did not fall, or the steps the actor saw are not exactly the ones the job committed
// (each once, in order, with the loss its metrics.jsonl holds, bit for bit).
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

#include "actors/bridge.h"
#include "coordinator/config.h"
#include "coordinator/job.h"
#include "workers/agent.h"

using namespace troupe;

using Steps = std::vector<std::pair<uint64_t, double>>;  // (step, loss)

// The user's actor: it just collects the steps and reports when the job ends.
caf::behavior watcher(caf::event_based_actor* self,
                      std::shared_ptr<std::promise<std::pair<int, Steps>>> done) {
  auto steps = std::make_shared<Steps>();
  return {
      [=](coordinator::JobProgress& p) {
        steps->emplace_back(p.step, p.loss);
        std::printf("my actor saw step %llu: loss %.4f (world size %llu)\n",
                    (unsigned long long)p.step, p.loss, (unsigned long long)p.world_size);
      },
      [=](coordinator::JobFinished& f) {
        done->set_value({f.exit_code, *steps});
        self->quit();
      },
  };
}

// The steps the job committed, from its run directory's metrics.jsonl, numbered as JobProgress
// counts them (step 0 committed: 1 step so far).
Steps committed_steps(const std::string& run_dir) {
  Steps out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("loss"))
      out.emplace_back(uint64_t(j["step"]) + 1, double(j["loss"]));
  }
  return out;
}

int main() {
  // The job: a small MLP, 2 workers, 20 steps. Any config key can be set here.
  coordinator::JobConfig cfg = coordinator::parse_config(
      "[job]\nname = \"embedded\"\nsteps = 20\n[model]\ninputs = 64\nhidden = "
      "[64]\n[batch]\nglobal = 32\nmicro = 16\n"
      "[optimizer]\nlr = 0.003\n[cluster]\nagents = 2\nlauncher = \"external\"\n",
      "embedded config");
  std::string run_dir =
      (std::filesystem::temp_directory_path() / ("troupe-embed-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(run_dir);

  caf::actor_system_config sys_cfg;
  coordinator::configure_job_system(sys_cfg);
  caf::actor_system system{sys_cfg};

  actors::BridgeConfig bc = actors::job_bridge_config(cfg.name, coordinator::new_token());
  auto bridge = actors::spawn_bridge(system, bc);
  auto done = std::make_shared<std::promise<std::pair<int, Steps>>>();
  auto result = done->get_future();
  auto me = system.spawn(watcher, done);
  auto coord = coordinator::spawn_coordinator(system, bridge, cfg, run_dir, me);

  std::string address;
  caf::scoped_actor self{system};
  self->request(bridge, std::chrono::seconds(5), actors::info_atom::value)
      .receive([&](uint64_t, std::string& a) { address = a; }, [](caf::error&) {});

  std::vector<std::thread> agents;
  for (int i = 0; i < 2; ++i) {
    agents.emplace_back([&, i] {
      workers::AgentOptions o;
      o.join = address;
      o.job_id = cfg.name;
      o.token = bc.token;
      o.name = "embedded-agent-" + std::to_string(i);
      workers::run_agent(o);
    });
  }
  if (result.wait_for(std::chrono::minutes(2)) != std::future_status::ready) {
    std::printf("embedded job did not finish in 2 minutes\n");
    return 1;
  }
  auto [code, seen] = result.get();
  for (auto& t : agents) t.join();
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  const Steps committed = committed_steps(run_dir);
  std::filesystem::remove_all(run_dir);
  if (code != 0 || seen.size() != 20 || !(seen.back().second < seen.front().second)) {
    std::printf("embedded job FAILED (exit %d, %zu steps)\n", code, seen.size());
    return 1;
  }
  if (seen != committed) {
    std::printf(
        "embedded job FAILED: the actor saw %zu steps, the job committed %zu (or they "
        "differ)\n",
        seen.size(), committed.size());
    return 1;
  }
  std::printf("embedded job finished: %zu steps, loss fell from %.4f to %.4f\n", seen.size(),
              seen.front().second, seen.back().second);
  return 0;
}
