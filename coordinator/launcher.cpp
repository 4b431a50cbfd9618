#include "coordinator/launcher.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "coordinator/exit_watcher.h"
#include "coordinator/job.h"
#include "coordinator/process.h"

namespace troupe::coordinator {
namespace {

using exited_atom = caf::atom_constant<caf::atom("lexited")>;
using restart_atom = caf::atom_constant<caf::atom("lrestart")>;
using grace_atom = caf::atom_constant<caf::atom("lgrace")>;

std::string how_it_ended(int status) {
  if (!WIFSIGNALED(status)) return "exited " + std::to_string(WEXITSTATUS(status));
  const int sig = WTERMSIG(status);
  return "killed by signal " + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
}

class Launcher : public caf::event_based_actor {
 public:
  Launcher(caf::actor_config& cfg, LauncherOptions options, caf::actor coordinator)
      : caf::event_based_actor(cfg),
        opt_(std::move(options)),
        coordinator_(std::move(coordinator)) {}

  void on_exit() override {
    watcher_.reset();  // joins its thread here, never from the last reference's thread
    coordinator_ = caf::actor();
  }

  caf::behavior make_behavior() override {
    // (A weak handle: the watcher's thread must not keep this actor alive.)
    watcher_ = std::make_unique<ExitWatcher>([self = address()](uint64_t id) {
      if (auto me = caf::actor_cast<caf::actor>(self)) caf::anon_send(me, exited_atom::value, id);
    });
    for (int64_t i = 0; i < opt_.agents; ++i) add_slot();
    send(coordinator_, launcher_atom::value, caf::actor_cast<caf::actor>(this));
    return {
        [this](exited_atom, uint64_t id) { on_exited(id); },
        [this](restart_atom, uint64_t slot) { restart(slot); },
        [this](RetireAgent& r) {
          // (Its process, by pid; pid 0: the slot while its restart waits, none running.)
          const int64_t i = r.slot - opt_.first_slot;
          if (i < 0 || size_t(i) >= slots_.size() || !slots_[size_t(i)].proc) return;
          const ChildProcess& p = *slots_[size_t(i)].proc;
          if (r.pid == 0 ? !p.running() : p.pid() == r.pid) slots_[size_t(i)].retired = true;
        },
        [this](EndLostAgent& e) { end_lost(e); },
        [this](ScaleAgents& s) {
          for (int64_t k = 0; k < s.count && !stopping_; ++k)
            if (add_slot()) report("agent_started", slots_.size() - 1, 0, s.why);
        },
        [this](stop_atom, int64_t grace_ms) -> caf::result<bool> {
          stopping_ = true;
          if (running() == 0) return true;
          stopped_ = make_response_promise<bool>();
          delayed_send(this, std::chrono::milliseconds(grace_ms), grace_atom::value);
          return stopped_;
        },
        [this](grace_atom) {
          for (auto& s : slots_)
            if (s.proc && s.proc->running()) s.proc->kill_and_reap();
          finish(false);
        },
    };
  }

 private:
  struct Slot {
    std::unique_ptr<ChildProcess> proc;
    int64_t restarts = 0;
    uint64_t incarnation = 0;
    std::chrono::milliseconds backoff{0};  // the wait before the last restart
    std::string ended;                     // how the last incarnation ended ("killed by ...")
    std::string lost;                      // why this incarnation was ended (EndLostAgent)
    bool retired = false;                  // drained: not started again
  };

  // agent-N: its name and its log's (after a take-over, past the names of the run's agents).
  std::string name_of(size_t i) const {
    return "agent-" + std::to_string(opt_.first_slot + int64_t(i));
  }

  bool add_slot() {
    slots_.emplace_back();
    return start(slots_.size() - 1);
  }

  // False when the process could not be made (fork failed: the machine's process or memory
  // limit): reported as agent_start_failed, and the slot stays empty (never restarted).
  bool start(size_t i) {
    try {
      start_process(i);
      return true;
    } catch (const std::exception& e) {
      slots_[i].proc.reset();
      spdlog::error("{} could not be started: {}", name_of(i), e.what());
      report("agent_start_failed", i, slots_[i].restarts, name_of(i) + ": " + e.what());
      return false;
    }
  }

  void start_process(size_t i) {
    Slot& s = slots_[i];
    const std::string log = opt_.run_dir + "/" + name_of(i) + ".log";
    std::vector<std::string> argv{opt_.program, "agent"};
    argv.insert(argv.end(), opt_.agent_args.begin(), opt_.agent_args.end());
    argv.insert(argv.end(), {"--name", name_of(i)});
    // SIGHUP when the coordinator's process ends: the agent, launched (TROUPE_LAUNCHED_BY), knows
    // what it means and leaves at once, saying why (workers/agent.cpp).
    s.proc = std::make_unique<ChildProcess>(ChildProcess::Options{
        argv, log, log, {"TROUPE_LAUNCHED_BY=" + std::to_string(::getpid())}, SIGHUP});
    ++s.incarnation;
    s.lost.clear();
    watcher_->watch(uint64_t(i) << 20 | (s.incarnation & 0xFFFFF), s.proc->pid());
  }

  // (Its process, by pid: a later incarnation is not the one that was lost.)
  void end_lost(const EndLostAgent& e) {
    const int64_t i = e.slot - opt_.first_slot;
    if (i < 0 || size_t(i) >= slots_.size() || !slots_[size_t(i)].proc) return;
    Slot& s = slots_[size_t(i)];
    if (!s.proc->running() || s.proc->pid() != e.pid || stopping_) return;
    spdlog::warn("{} (pid {}) was {}: ending it", name_of(size_t(i)), e.pid, e.why);
    s.lost = e.why;
    s.proc->signal(SIGKILL);  // (its exit is seen, and handled, as any other)
  }

  void on_exited(uint64_t id) {
    const size_t i = size_t(id >> 20);
    if (i >= slots_.size() || (slots_[i].incarnation & 0xFFFFF) != (id & 0xFFFFF)) return;
    Slot& s = slots_[i];
    if (!s.proc) return;
    auto status = s.proc->wait(std::chrono::milliseconds(1000));
    if (!status) return;  // (cannot happen: it exited)
    if (stopping_) {
      if (running() == 0) finish(true);
      return;
    }
    const bool clean = (WIFEXITED(*status) && WEXITSTATUS(*status) == 0) || s.retired;
    auto d = elastic::decide_restart(opt_.restarts, s.restarts, clean);
    using Kind = elastic::RestartDecision::Kind;
    if (d.kind == Kind::done) return report("agent_exited", i, s.restarts, "");
    const std::string how =
        how_it_ended(*status) + (s.lost.empty() ? "" : " after it was " + s.lost);
    if (d.kind == Kind::give_up) {
      report("agent_gave_up", i, s.restarts, name_of(i) + " " + how + "; " + d.reason);
      return;
    }
    ++s.restarts;
    s.ended = how;
    spdlog::warn("{} {}; restarting it in {} ms ({} of {})", name_of(i), how, d.backoff.count(),
                 s.restarts, opt_.restarts.max_restarts);
    s.backoff = d.backoff;
    report("agent_restarting", i, s.restarts, "");  // (a scale meanwhile counts it)
    delayed_send(this, d.backoff, restart_atom::value, uint64_t(i));
  }

  void restart(uint64_t i) {
    if (stopping_) return;
    if (slots_[i].retired) return report("agent_exited", size_t(i), slots_[i].restarts, "");
    if (start(size_t(i)))
      report("agent_restarted", size_t(i), slots_[i].restarts, name_of(i) + " " + slots_[i].ended);
  }

  void report(const std::string& event, size_t slot, int64_t attempt, const std::string& detail) {
    const Slot& s = slots_[slot];
    const bool gone = event == "agent_gave_up" || event == "agent_restarting" ||
                      event == "agent_start_failed";  // (its pid was, or none)
    const int64_t pid = gone || !s.proc ? 0 : s.proc->pid();
    send(coordinator_, LauncherEvent{event, opt_.first_slot + int64_t(slot), attempt, pid, detail,
                                     int64_t(s.backoff.count())});
  }

  size_t running() const {
    size_t n = 0;
    for (const auto& s : slots_) n += s.proc && s.proc->running();
    return n;
  }

  void finish(bool all_exited) {
    if (stopped_.pending()) stopped_.deliver(all_exited);
  }

  LauncherOptions opt_;
  caf::actor coordinator_;
  std::vector<Slot> slots_;
  std::unique_ptr<ExitWatcher> watcher_;  // (after the slots: stops before their processes go)
  bool stopping_ = false;
  caf::typed_response_promise<bool> stopped_;
};

}  // namespace

caf::actor spawn_local_launcher(caf::actor_system& system, LauncherOptions options,
                                caf::actor coordinator) {
  return system.spawn<Launcher, caf::detached>(std::move(options), std::move(coordinator));
}

}  // namespace troupe::coordinator
