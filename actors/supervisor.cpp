#include "actors/supervisor.h"

#include <spdlog/spdlog.h>

#include <unordered_map>

#include "actors/restart_intensity.h"

namespace troupe::actors {
namespace {

class SupervisorActor : public caf::event_based_actor {
 public:
  SupervisorActor(caf::actor_config& cfg, std::vector<ChildSpec> children,
                  SupervisorOptions options, caf::actor observer)
      : caf::event_based_actor(cfg),
        specs_(std::move(children)),
        observer_(std::move(observer)),
        intensity_(options.max_restarts, options.window) {}

  caf::behavior make_behavior() override {
    set_down_handler([this](caf::down_msg& dm) { on_child_down(dm); });
    for (size_t i = 0; i < specs_.size(); ++i) start(i);
    return {
        [this](child_atom, const std::string& name) -> caf::result<caf::actor> {
          for (auto& [addr, child] : running_)
            if (specs_[child.index].name == name) return child.handle;
          return caf::make_error(caf::sec::invalid_argument, "no child named " + name);
        },
    };
  }

  void on_exit() override {
    for (auto& [addr, child] : running_)
      caf::anon_send_exit(child.handle, caf::exit_reason::user_shutdown);
    running_.clear();
  }

 private:
  void start(size_t index) {
    auto child = specs_[index].start(system());
    monitor(child);
    running_.emplace(child.address(), Running{child, index});
  }

  void on_child_down(const caf::down_msg& dm) {
    auto it = running_.find(dm.source);
    if (it == running_.end()) return;
    size_t index = it->second.index;
    running_.erase(it);
    if (!dm.reason || dm.reason == caf::exit_reason::normal) return;  // finished
    const std::string& name = specs_[index].name;
    std::string why = system().render(dm.reason);
    if (!intensity_.allow_restart(std::chrono::steady_clock::now())) {
      spdlog::error("supervisor: child '{}' failed ({}); restart intensity exceeded, escalating",
                    name, why);
      quit(caf::error(1, caf::atom("troupe_sup"),
                      caf::make_message("child '" + name +
                                        "' failed more than the restart "
                                        "intensity allows; last failure: " +
                                        why)));
      return;
    }
    int count = ++restarts_[name];
    spdlog::warn("supervisor: child '{}' failed ({}); restart {}", name, why, count);
    start(index);
    if (observer_) send(observer_, ChildRestarted{name, count, why});
  }

  std::vector<ChildSpec> specs_;
  caf::actor observer_;
  RestartIntensity intensity_;
  struct Running {
    caf::actor handle;  // strong: a supervised child lives while its supervisor does
    size_t index;
  };
  std::unordered_map<caf::actor_addr, Running> running_;
  std::unordered_map<std::string, int> restarts_;
};

}  // namespace

caf::actor spawn_supervisor(caf::actor_system& system, std::vector<ChildSpec> children,
                            SupervisorOptions options, caf::actor observer) {
  return system.spawn<SupervisorActor>(std::move(children), options, std::move(observer));
}

}  // namespace troupe::actors
