// The agent: joins the coordinator, then supervises one worker per device (DeviceSupervisor,
// each on its own thread) and follows the coordinator's messages through its actor into the
// GenerationBoard until it is told to shut down or loses the coordinator.
#include "workers/agent.h"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "actors/job_protocol.h"
#include "actors/signals.h"
#include "workers/agent_session.h"
#include "workers/device_supervisor.h"

namespace troupe::workers {
namespace {

// Why this program cannot train the job's kinds ("" when it can): a coordinator that did not
// check them at the join (an older one) hears it from the workers.
std::string missing_kind(const actors::JobSpec& spec, const AgentOptions& o) {
  actors::Join as;
  as.kinds = trained_kinds(o);
  return actors::kind_refusal(as, spec.model_kind, spec.data_kind);
}

// The worker threads that ended, waited for with a deadline.
class Stopped {
 public:
  void one() {
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    cv_.notify_all();
  }
  // False past `within`; `poll` is called every 100 ms meanwhile.
  bool all(uint32_t n, std::chrono::milliseconds within, const std::function<void()>& poll) {
    const auto until = std::chrono::steady_clock::now() + within;
    std::unique_lock<std::mutex> lock(mu_);
    while (count_ < n) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= until) return false;
      cv_.wait_for(lock, std::min<std::chrono::steady_clock::duration>(
                             until - now, std::chrono::milliseconds(100)));
      lock.unlock();
      poll();
      lock.lock();
    }
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint32_t count_ = 0;
};

// Arms the agent's teardown deadline when run_agent returns, in an agent that is its own process
// (`troupe agent`; an agent whose coordinator stalled and was then lost was seen waiting in CAF's
// teardown for good): past 10 s it exits with the code the agent ends with.
struct ArmedOnReturn {
  actors::TeardownDeadline& deadline;
  const GenerationBoard& board;
  bool armed;  // (AgentOptions::own_process)
  ~ArmedOnReturn() {
    if (armed)
      deadline.arm(std::chrono::seconds(10), board.shutting_down() ? board.exit_code() : 1,
                   "troupe agent");
  }
};

}  // namespace

std::pair<std::string, std::string> read_token_file(const std::string& path) {
  struct stat file {};
  if (::stat(path.c_str(), &file) == 0 && (!S_ISREG(file.st_mode) || file.st_size > 4096))
    throw std::invalid_argument(
        "the token file '" + path + "' is " +
        (S_ISREG(file.st_mode) ? "larger than a token file (4 KiB)" : "not a regular file") +
        ": troupe run writes RUN_DIR/job.token");
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the token file '" + path + "'");
  std::string job, token;
  in >> job >> token;
  if (job.empty() || token.empty())
    throw std::invalid_argument("the token file '" + path + "' is not 'JOB_ID TOKEN'");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && (st.st_mode & 077))
    std::fprintf(stderr,
                 "troupe: warning: the token file '%s' can be read by others (mode %03o): anyone "
                 "who reads it can control the job; chmod 600 it\n",
                 path.c_str(), unsigned(st.st_mode & 0777));
  return {job, token};
}

int run_agent(const AgentOptions& options) {
  actors::SignalWatcher signals;      // (before any thread starts)
  actors::TeardownDeadline deadline;  // (destroyed after the session: disarmed with it)
  AgentOptions o = options;           // (a signal ends its wait for a coordinator: it went unheard)
  o.interrupted = [&signals] { return signals.count() > 0; };
  AgentSession session(o);
  ArmedOnReturn arm{deadline, session.board(), o.own_process};
  if (!session.error().empty()) {
    std::fprintf(stderr, "troupe agent: %s\n", session.error().c_str());
    if (signals.count() > 0) return 128 + signals.first();
    return session.refused() ? 2 : 1;
  }
  const actors::JobSpec& spec = session.spec();
  // logging.level, in an agent process of its own (a program embedding one keeps its own level).
  if (o.own_process && !spec.log_level.empty())
    spdlog::set_level(spdlog::level::from_str(spec.log_level));
  if (std::string why = missing_kind(spec, o); !why.empty()) {
    std::fprintf(stderr, "troupe agent: %s\n", why.c_str());
    // The coordinator hears why, not only that the agent went (a peer lost): a joiner of a
    // running job is given up, and one of the first generation's fails the job with it.
    for (uint32_t d = 0; d < o.devices.size(); ++d)
      session.send(actors::encode(actors::WorkerFailed{{spec.agent_id, d}, d, 0, why}));
    return 2;
  }
  spdlog::info("agent {} joined job '{}' as agent {} with {} device(s)", session.name(),
               spec.job_name, spec.agent_id, o.devices.size());
  DeviceContext ctx;
  ctx.spec = worker_spec_of(spec);
  ctx.spec.agent_name = session.name();
  ctx.spec.faults = o.faults;
  ctx.spec.extensions = o.extensions;
  ctx.agent_id = [&session] { return session.agent_id(); };
  ctx.first_generation = spec.first_generation;
  ctx.board = &session.board();
  ctx.send = [&session](actors::ControlMessage m) { session.send(std::move(m)); };
  ctx.max_restarts = int(spec.worker_max_restarts);
  ctx.restart_window = std::chrono::milliseconds(spec.worker_restart_window_ms);
  std::vector<std::thread> threads;
  Stopped stopped;
  for (uint32_t d = 0; d < o.devices.size(); ++d)
    threads.emplace_back([&ctx, &stopped, d, device = o.devices[d]] {
      DeviceSupervisor(ctx, d, device).run();
      stopped.one();
    });
  const int seen = session.watch(&signals);
  // (A worker hung in its step cannot be stopped: the process exits without it.)
  // (A clean end, a drain, may first finish a checkpoint write: it waits longer.)
  const auto grace =
      session.board().exit_code() == 0
          ? std::chrono::milliseconds(600000)
          : std::chrono::milliseconds(spec.failure_timeout_ms) + std::chrono::seconds(10);
  // While it waits (up to 10 minutes for a checkpoint write) troupe agent is not deaf: Ctrl-C,
  // or a second SIGTERM, leaves at once; a first SIGTERM (a scheduler's, after its stop) lets
  // the write finish; SIGHUP (the launching coordinator's end) changes nothing. An agent
  // embedded in a program leaves the program's signals to it.
  int terms = seen;  // (a SIGTERM that asked for a drain was the first)
  auto interrupted = [&signals, &terms, own = o.own_process] {
    const int sig = own ? signals.next() : 0;
    if (sig == 0 || sig == SIGHUP) return;
    if (sig == SIGTERM && terms++ == 0) {
      std::fprintf(stderr,
                   "troupe agent: SIGTERM while its workers stop: it waits for them (again: it "
                   "exits at once)\n");
      return;
    }
    std::fprintf(stderr, "troupe agent: %s while its workers stop: exiting at once\n",
                 actors::signal_name(sig));
    std::fflush(nullptr);
    std::_Exit(128 + sig);
  };
  if (!stopped.all(uint32_t(threads.size()), grace, interrupted)) {
    std::fprintf(stderr,
                 "troupe agent: %s; a worker did not stop within %lld ms (hung in its step: a data "
                 "set's fill, a model's block or a device that never returns): exiting without "
                 "it\n",
                 session.board().reason().c_str(), static_cast<long long>(grace.count()));
    std::fflush(nullptr);
    std::_Exit(session.board().exit_code() != 0 ? session.board().exit_code() : 1);
  }
  for (auto& t : threads) t.join();
  const int code = session.board().exit_code();
  if (code != 0)
    std::fprintf(stderr, "troupe agent: %s\n", session.board().reason().c_str());
  else
    spdlog::info("shut down by the coordinator: {}", session.board().reason());
  return code;
}

}  // namespace troupe::workers
