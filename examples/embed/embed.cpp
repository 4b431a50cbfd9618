// Troupe inside your own C++ program, with an actor of yours in the loop: the program starts a
// job's coordinator in its own CAF actor system and runs the job's agents (here as threads of
// this process; in production `troupe agent` processes on every host). Its actor receives every
// event of the job and steers it with the requests the CLI sends (troupe lr, checkpoint, drain,
// stop), each answered with a reply:
//   - it halves the learning rate when the loss plateaus (the mean of the last 20 steps no lower
//     than the 20 before it, by 2%);
//   - it asks for a checkpoint at step 120, drains the last agent to join at step 160 and stops
//     the job at step 260; and asks for a learning rate of -1, which is refused with the reason.
//
// Built against an installed Troupe (find_package(Troupe); see CMakeLists.txt here):
//   build-example/embed
//
// Expected output: a line per request and its reply, per learning-rate change and per
// membership change, then "embedded job stopped at step 260 ...: 1 or more learning-rate
// changes, a checkpoint, a drain; the actor saw every committed step once". Exits non-zero when
// any of that did not happen (or the job failed).
#include <troupe/coordinator/job.h>
#include <troupe/workers/agent.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <thread>

using namespace troupe;
using coordinator::AdminReply;
using coordinator::AdminRequest;
using Json = nlohmann::json;

// What the actor saw, for the program's check at the end.
struct Seen {
  std::vector<std::pair<uint64_t, double>> steps;  // (step, loss) of every step_committed
  int lr_changes = 0, checkpoints = 0, drains = 0, refusals = 0;
  std::string end;  // job_finished's state
};

struct Steering {
  caf::actor coordinator;
  double lr = 0.01;
  uint64_t last_change = 0;  // the step of the last learning-rate change asked for
  int64_t newest_agent = -1;
  bool checkpointed = false, drained = false, stopped = false;
  Seen seen;
};

// A request to the job, its reply printed (and counted when it is a refusal).
void ask(caf::stateful_actor<Steering>* self, AdminRequest r, const std::string& what) {
  self->request(self->state.coordinator, std::chrono::seconds(10), r)
      .then(
          [=](const AdminReply& reply) {
            std::printf("my actor asked for %s: %s%s\n", what.c_str(),
                        reply.ok ? "accepted" : "refused: ", reply.error.c_str());
            if (!reply.ok) ++self->state.seen.refusals;
          },
          [=](caf::error& e) {
            std::printf("my actor asked for %s: no answer (%s)\n", what.c_str(),
                        self->system().render(e).c_str());
          });
}

// The loss has not fallen by 2% over the last 20 steps: a plateau.
bool plateau(const Seen& s) {
  const size_t n = s.steps.size();
  if (n < 40) return false;
  double recent = 0, before = 0;
  for (size_t i = n - 20; i < n; ++i) recent += s.steps[i].second;
  for (size_t i = n - 40; i < n - 20; ++i) before += s.steps[i].second;
  return recent > 0.98 * before;
}

void on_step(caf::stateful_actor<Steering>* self, uint64_t step, double loss) {
  auto& st = self->state;
  st.seen.steps.emplace_back(step, loss);
  if (plateau(st.seen) && step >= st.last_change + 40) {
    st.lr /= 2;
    st.last_change = step;
    ask(self, AdminRequest::learning_rate(st.lr), "learning rate " + std::to_string(st.lr));
  }
  if (step >= 120 && !st.checkpointed) {
    st.checkpointed = true;
    ask(self, AdminRequest::checkpoint(), "a checkpoint");
    ask(self, AdminRequest::learning_rate(-1), "learning rate -1");
  }
  if (step >= 160 && !st.drained && st.newest_agent >= 0) {
    st.drained = true;
    ask(self, AdminRequest::drain(uint32_t(st.newest_agent)),
        "agent " + std::to_string(st.newest_agent) + " to leave");
  }
  if (step >= 260 && !st.stopped) {
    st.stopped = true;
    ask(self, AdminRequest::stop(), "the job to stop");
  }
}

caf::behavior steering(caf::stateful_actor<Steering>* self, caf::actor coordinator,
                       std::shared_ptr<std::promise<Seen>> done) {
  self->state.coordinator = coordinator;
  self->send(coordinator, coordinator::subscribe_atom::value, caf::actor(self));
  return {
      [=](const coordinator::JobEvent& e) {
        auto& st = self->state;
        const Json j = Json::parse(e.json);
        if (e.event == "step_committed") on_step(self, uint64_t(e.step), j["loss"].get<double>());
        if (e.event == "member_joined") st.newest_agent = j["member"].get<int64_t>();
        if (e.event == "lr_changed") ++st.seen.lr_changes;
        if (e.event == "checkpoint_written") ++st.seen.checkpoints;
        if (e.event == "member_left") ++st.seen.drains;
        if (e.event != "step_committed") std::printf("my actor saw: %s\n", e.json.c_str());
        if (e.event == "job_finished") {
          st.seen.end = j["state"].get<std::string>();
          done->set_value(st.seen);
          self->quit();
        }
      },
      [](coordinator::JobProgress&) {},
      [](coordinator::JobNotice&) {},
      [](coordinator::JobFinished&) {},
  };
}

// The steps the job committed, from its run directory's metrics.jsonl.
std::vector<std::pair<uint64_t, double>> committed_steps(const std::string& run_dir) {
  std::vector<std::pair<uint64_t, double>> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    auto j = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("loss")) out.emplace_back(j["step"], j["loss"]);
  }
  return out;
}

int main() {
  // The job: an MLP on synthetic data, 3 agents, 400 steps (stopped at 260 by the actor).
  coordinator::JobConfig cfg = coordinator::parse_config(
      "[job]\nname = \"embedded\"\nsteps = 400\n[model]\ninputs = 64\nhidden = [64]\n"
      "[data]\nsamples = 4000\n[batch]\nglobal = 48\nmicro = 16\n[optimizer]\nlr = 0.01\n"
      "[cluster]\nagents = 3\nlauncher = \"external\"\n[logging]\nprogress = false\n",
      "embedded config");
  const std::string run_dir =
      (std::filesystem::temp_directory_path() / ("troupe-embed-" + std::to_string(getpid())))
          .string();
  std::filesystem::create_directories(run_dir);

  caf::actor_system_config sys_cfg;
  coordinator::configure_job_system(sys_cfg);
  caf::actor_system system{sys_cfg};

  // A config changed in code is checked as a file is: refused here, nothing started.
  try {
    coordinator::JobConfig bigger = cfg;
    bigger.micro_batch = 64;
    coordinator::start_embedded_job(system, bigger, run_dir, {});
    std::printf("embedded job FAILED: batch.micro 64 of 48 was taken\n");
    return 1;
  } catch (const coordinator::ConfigError& e) {
    if (std::string(e.what()).find("batch.micro (64) exceeds batch.global (48)") ==
        std::string::npos) {
      std::printf("embedded job FAILED: the refusal does not say why: %s\n", e.what());
      return 1;
    }
  }

  auto done = std::make_shared<std::promise<Seen>>();
  auto result = done->get_future();
  coordinator::EmbeddedJob job = coordinator::start_embedded_job(system, cfg, run_dir, {});
  system.spawn(steering, job.coordinator, done);

  std::vector<std::thread> agents;
  for (int i = 0; i < 3; ++i)
    agents.emplace_back([&, i] {
      workers::AgentOptions o;
      o.join = job.address;
      o.job_id = job.job_id;
      o.token = job.token;
      o.name = "embedded-agent-" + std::to_string(i);
      workers::run_agent(o);
    });
  const bool ended = result.wait_for(std::chrono::minutes(3)) == std::future_status::ready;
  for (auto& t : agents) t.join();
  coordinator::stop_embedded_job(job);
  if (!ended) {
    std::printf("embedded job FAILED: it did not end in 3 minutes\n");
    return 1;
  }
  const Seen seen = result.get();
  const auto committed = committed_steps(run_dir);
  // (its checkpoints in RUN_DIR/checkpoints, by default, and its config where troupe export
  // reads it)
  const bool files = std::filesystem::exists(run_dir + "/config.toml") &&
                     !std::filesystem::is_empty(run_dir + "/checkpoints");
  const bool ok = seen.end == "stopped" && seen.lr_changes >= 1 && seen.checkpoints >= 1 &&
                  seen.drains == 1 && seen.refusals == 1 && seen.steps == committed &&
                  seen.steps.size() >= 260 && seen.steps.size() < 400 && files;
  std::printf(
      "embedded job %s at step %zu (%s): %d learning-rate change(s), %d checkpoint(s), %d "
      "drain(s), %d refusal(s); the actor saw %zu steps, the job committed %zu%s%s\n",
      ok ? "stopped" : "FAILED", seen.steps.size(), seen.end.c_str(), seen.lr_changes,
      seen.checkpoints, seen.drains, seen.refusals, seen.steps.size(), committed.size(),
      seen.steps == committed ? " (the same, each once)" : " (they differ)",
      files ? "" : "; no config.toml or checkpoints/ in its run directory");
  if (ok)
    std::filesystem::remove_all(run_dir);
  else
    std::printf("the job's run directory is kept: %s\n", run_dir.c_str());
  return ok ? 0 : 1;
}
