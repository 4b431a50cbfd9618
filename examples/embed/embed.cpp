// Embedding Troupe in your own C++ program: start a job's coordinator inside your own CAF actor
// system, run its agents (here as threads of this process, each with its own actor system; in
// production, `troupe agent` processes on every host), and receive the job's step events in an
// actor of your own.
//
//   build/bin/troupe_embed_example
//
// Expected output: one line per committed step ("my actor saw step 3: loss 2.1...") and, at the
// end, "embedded job finished: 20 steps, loss fell from X to Y". Exits non-zero if the job failed
// or the loss did not fall.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <future>
#include <thread>

#include "actors/bridge.h"
#include "coordinator/config.h"
#include "coordinator/job.h"
#include "workers/agent.h"

using namespace troupe;

// The user's actor: it just collects the losses and reports when the job ends.
caf::behavior watcher(caf::event_based_actor* self,
                      std::shared_ptr<std::promise<std::pair<int, std::vector<double>>>> done) {
  auto losses = std::make_shared<std::vector<double>>();
  return {
      [=](coordinator::JobProgress& p) {
        losses->push_back(p.loss);
        std::printf("my actor saw step %llu: loss %.4f (world size %llu)\n",
                    (unsigned long long)p.step, p.loss, (unsigned long long)p.world_size);
      },
      [=](coordinator::JobFinished& f) {
        done->set_value({f.exit_code, *losses});
        self->quit();
      },
  };
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
  auto done = std::make_shared<std::promise<std::pair<int, std::vector<double>>>>();
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
  auto [code, losses] = result.get();
  for (auto& t : agents) t.join();
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
  std::filesystem::remove_all(run_dir);
  if (code != 0 || losses.size() != 20 || !(losses.back() < losses.front())) {
    std::printf("embedded job FAILED (exit %d, %zu steps)\n", code, losses.size());
    return 1;
  }
  std::printf("embedded job finished: %zu steps, loss fell from %.4f to %.4f\n", losses.size(),
              losses.front(), losses.back());
  return 0;
}
