// The agent session (workers/agent_session.h): the join, the agent's actor and the watch.
#include "workers/agent_session.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "actors/bridge.h"
#include "actors/services.h"
#include "comm/host_identity.h"
#include "comm/transport.h"
#include "comm/ucx.h"

namespace troupe::workers {
namespace {

// Whether nothing listens at HOST:PORT (a TCP connect is refused): a coordinator not started yet,
// worth waiting for; something that listens there and failed the connect is another matter.
bool nothing_listens(const std::string& address) {
  try {
    const auto [host, port] = comm::split_host_port(address);
    const comm::SockAddr a = comm::resolve(host, port);
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    int err =
        ::connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) == 0 ? 0 : errno;
    if (err == EINPROGRESS) {  // (a second at most: a host that drops the connect is no answer)
      pollfd p{fd, POLLOUT, 0};
      socklen_t len = sizeof err;
      err = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0
                ? err
                : ETIMEDOUT;
    }
    ::close(fd);
    return err == ECONNREFUSED;
  } catch (const std::exception&) {
    return false;
  }
}

using actors::ControlMessage;

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// Every log line names the job, the agent, the generation and this agent's ranks.
void log_as(const std::string& job, const std::string& agent, const actors::GenerationStart& g,
            uint32_t agent_id) {
  std::string ranks;
  for (const auto& m : g.members)
    if (m.worker.agent == agent_id) ranks += (ranks.empty() ? "" : ",") + std::to_string(m.rank);
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + job + "] [" + agent + "] [gen " +
                      std::to_string(g.generation) + " rank " + (ranks.empty() ? "-" : ranks) +
                      "] [%l] %v");
}

// The agent's actor: the coordinator's pushes, onto the board.
// (It shares the board: it may run after run_agent has returned.)
caf::actor spawn_agent_actor(caf::actor_system& system, std::shared_ptr<GenerationBoard> board,
                             const std::string& job, const std::string& name,
                             std::shared_ptr<std::atomic<uint32_t>> agent_id, caf::actor bridge,
                             caf::actor watcher) {
  return system.spawn([=](caf::event_based_actor*) -> caf::behavior {
    return {[=](ControlMessage& m) -> ControlMessage {
      auto body = m.envelope().getBody();
      if (body.isGenerationStart()) {
        auto g = actors::decode(body.getGenerationStart());
        if (const std::string why = actors::invalid_members(g); !why.empty()) {
          spdlog::error("[job {}] [{}] a generation start dropped: {}", job, name, why);
          return actors::make_ack();
        }
        log_as(job, name, g, agent_id->load());
        board->start(std::move(g));
      } else if (body.isCheckpointAtStep()) {
        board->checkpoint_at_step(body.getCheckpointAtStep());
      } else if (body.isStopAtNextStep() || body.isStopWithCheckpoint()) {
        board->stop_at_next_step(body.isStopWithCheckpoint());
      } else if (body.isLeaveGeneration()) {
        board->leave(body.getLeaveGeneration());
      } else if (body.isAbandonGeneration()) {
        board->abandon(body.getAbandonGeneration());
      } else if (body.isShutdown()) {
        // The job ended: the coordinator's process goes next, and that is no loss.
        caf::send_as(watcher, bridge, actors::demonitor_atom::value, m.envelope().getSrcNode());
        auto s = actors::decode(body.getShutdown());
        board->shut_down(s.exit_code, s.reason);
      }
      return actors::make_ack();
    }};
  });
}

// Connects to the coordinator and joins: its node and the job spec, or the reason it cannot.
struct Joined {
  uint64_t coordinator = 0;
  actors::JobSpec spec;
  std::string error;
  bool fenced = false;   // the coordinator there refused this node: it dropped it (still alive)
  bool invalid = false;  // it refused this program for the job (protocol, kinds): never joins
};

// Each request is made by a scoped actor of its own, gone with its answer: a reply that comes
// after the request's deadline, and CAF's timeout message of a request answered in time (CAF 0.17
// never cancels it), would otherwise wait for good in the long-lived watcher's mailbox cache
// (its receive skips replies). A late reply holds the bridge's detached actor, whose destructor
// then never runs: ~actor_system waited for it for ever (an agent that gave up rejoining a
// stalled coordinator hung in its teardown). The rejoin's connect also waits longer than the
// bridge's own connect deadline (actors::BridgeConfig::connect_timeout): its answer comes in time.
Joined join(caf::scoped_actor& watcher, const caf::actor& bridge, const std::string& address,
            const AgentOptions& o, const std::string& name, bool rejoin) {
  Joined j;
  bool unreachable = false;  // (no coordinator listens there: nothing answered the connect)
  auto render = [&](const caf::error& e) {
    const auto ce = actors::control_error(e);
    unreachable = ce && ce->code == comm::Errc::peer_lost;
    j.fenced = ce && ce->code == comm::Errc::refused;
    // (another job's token can never join: exit 2, as an admin command's)
    j.invalid =
        ce && (ce->code == comm::Errc::invalid_input ||
               (ce->code == comm::Errc::refused && ce->message == actors::kWrongJobOrToken));
    j.error = watcher->system().render(e);
  };
  // An agent started before its coordinator (hosts started in any order) waits for it for up to
  // join_timeout, trying every half second; said once.
  const auto connect_until = std::chrono::steady_clock::now() + o.join_timeout;
  for (bool said = false;; said = true) {
    j.error.clear();
    caf::scoped_actor(watcher->system())
        ->request(bridge, std::chrono::seconds(rejoin ? 8 : 30), actors::connect_atom::value,
                  address)
        .receive([&](uint64_t n) { j.coordinator = n; }, render);
    if (j.error.empty() || !unreachable || rejoin || !nothing_listens(address) ||
        std::chrono::steady_clock::now() + std::chrono::milliseconds(500) > connect_until)
      break;
    if (o.interrupted && o.interrupted()) {
      j.error = "interrupted while it waited for the coordinator at " + address;
      return j;
    }
    if (!said)
      std::fprintf(stderr,
                   "troupe agent: no coordinator at %s yet: trying again for up to %.3g s "
                   "(--join-timeout-ms)\n",
                   address.c_str(), std::chrono::duration<double>(o.join_timeout).count());
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (!j.error.empty()) {
    j.error = "cannot reach the coordinator at " + address + ": " + j.error;
    return j;
  }
  watcher->send(bridge, actors::monitor_atom::value, j.coordinator);  // (its NodeDown: watch())
  actors::Join request{name,   host_name(),       uint32_t(getpid()),    o.devices,
                       rejoin, actors::kProtocol, comm::host_identity(), trained_kinds(o)};
  if (o.faults) o.faults->before_join(name);
  ControlMessage reply;
  // A job forming its first generation with all its agents asks this one to come again once it
  // has started: every half second, for up to two minutes (a rejoin: try_rejoin's own tries,
  // within elastic.rejoin_timeout_ms). That is no refusal of this node.
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  for (bool said = false;; said = true) {
    j.error.clear();
    caf::scoped_actor(watcher->system())
        ->request(bridge, std::chrono::seconds(35), actors::request_atom::value,
                  actors::RemoteAddress{j.coordinator, actors::kCoordinatorActorId},
                  actors::encode(request), uint32_t(30000))
        .receive([&](ControlMessage& r) { reply = r; }, render);
    const bool later = j.error.find(actors::kJoinOnceStarted) != std::string::npos;
    if (later) j.fenced = false;
    if (!later || rejoin || std::chrono::steady_clock::now() > until) break;
    if (!said)
      std::fprintf(stderr,
                   "troupe agent: the job forms its first generation without it: "
                   "joining once it has started\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (j.error.empty() && !reply.envelope().getBody().isJobSpec())
    j.error = "the coordinator answered without a job spec";
  if (!j.error.empty())
    j.error = "join refused: " + j.error;
  else
    j.spec = actors::decode(reply.envelope().getBody().getJobSpec());
  return j;
}

// The local launcher's coordinator process (TROUPE_LAUNCHED_BY; 0: started by hand). Its agents
// get SIGHUP when it ends (their parent-death signal).
pid_t launcher_pid() {
  const char* by = std::getenv("TROUPE_LAUNCHED_BY");
  return by ? pid_t(std::atoi(by)) : 0;
}

}  // namespace

std::vector<std::string> trained_kinds(const AgentOptions& o) {
  if (!o.kinds.empty()) return o.kinds;
  std::vector<std::string> k = actors::builtin_kinds();
  if (o.extensions) {
    for (const auto& m : o.extensions->models()) k.push_back("model:" + m.name);
    for (const auto& d : o.extensions->datasets()) k.push_back("data:" + d.name);
  }
  return k;
}

AgentSession::AgentSession(const AgentOptions& o)
    : options_(o),
      board_(std::make_shared<GenerationBoard>()),
      agent_id_(std::make_shared<std::atomic<uint32_t>>(UINT32_MAX)) {
  actors::configure_system(config_);
  system_ = std::make_unique<caf::actor_system>(config_);
  actors::BridgeConfig bc = actors::job_bridge_config(o.job_id, o.token);
  bc.heartbeat_interval = o.heartbeat_interval;
  bc.failure_timeout = o.failure_timeout;
  // (the coordinator's Shutdown, delivered just before its exit, unwatches it first: a clean end
  // warned of a lost coordinator now and then; a loss is acted on 100 ms later than it was)
  bc.loss_grace = std::chrono::milliseconds(100);
  bridge_ = actors::spawn_bridge(*system_, bc);
  self_ = std::make_unique<caf::scoped_actor>(*system_);
  name_ = o.name.empty() ? host_name() + ":" + std::to_string(getpid()) : o.name;
  agent_ = spawn_agent_actor(*system_, board_, o.job_id, name_, agent_id_, bridge_,
                             caf::actor_cast<caf::actor>(*self_));
  (*self_)->send(bridge_, actors::register_atom::value, actors::kAgentActorId, agent_);
  Joined joined = join(*self_, bridge_, o.join, o, name_, false);
  error_ = joined.error;
  refused_join_ = joined.invalid;
  coordinator_ = joined.coordinator;
  spec_ = joined.spec;
  if (error_.empty()) agent_id_->store(spec_.agent_id);
  address_ = o.join;
  // (the job's heartbeats and failure timeout, as the coordinator's and the launcher's agents';
  // an agent started by hand kept its command line's defaults)
  if (error_.empty() && spec_.heartbeat_interval_ms > 0 &&
      !(o.own_heartbeat && o.own_failure_timeout))
    caf::anon_send(
        bridge_, actors::timing_atom::value,
        uint32_t(o.own_heartbeat ? o.heartbeat_interval.count() : spec_.heartbeat_interval_ms),
        uint32_t(o.own_failure_timeout ? o.failure_timeout.count() : spec_.failure_timeout_ms));
}

AgentSession::~AgentSession() {
  caf::anon_send_exit(agent_, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(bridge_, caf::exit_reason::user_shutdown);
  self_.reset();
}

void AgentSession::send(ControlMessage m) {
  const auto body = m.envelope().getBody();
  // (a report is kept and sent under the lock try_rejoin sends the kept ones again under, with
  // the new coordinator's address: each reaches it once)
  std::unique_lock<std::mutex> lock(reports_mu_, std::defer_lock);
  if (body.isStepReport() || body.isCheckpointWritten()) {
    lock.lock();
    keep_report(m);
  }
  caf::anon_send(bridge_, actors::send_atom::value,
                 actors::RemoteAddress{coordinator_.load(), actors::kCoordinatorActorId},
                 std::move(m));
}

// The newest step reports and checkpoint shard reports, for a coordinator that takes over: the
// lost one may not have heard them. (reports_mu_ held)
void AgentSession::keep_report(const ControlMessage& m) {
  const bool shards = m.envelope().getBody().isCheckpointWritten();
  auto& kept = shards ? shard_reports_ : reports_;
  kept.push_back(m);
  if (kept.size() > (shards ? kKeptShardReports : kKeptReports)) kept.pop_front();
}

// The coordinator was lost: the workers end the generation at the next step boundary (it cannot
// commit anything more) and keep their state while this agent waits for a coordinator to take
// the run over, up to elastic.rejoin_timeout_ms; without one (or a timeout of 0) it leaves.
void AgentSession::lost(const std::string& why) {
  if (board_->shutting_down()) return;  // (the job ended: its coordinator goes with it)
  if (spec_.rejoin_timeout_ms <= 0) return board_->shut_down(1, why);
  if (lost_since_) return;
  lost_since_ = Clock::now();
  lost_reason_ = why;
  rejoin_error_.clear();
  board_->leave(board_->generation());
  spdlog::warn("{}: waiting up to {} ms for a coordinator to take the run over", why,
               spec_.rejoin_timeout_ms);
}

// Where a coordinator that took the run over listens: the run directory's coordinator.addr
// (next to the token file), else the address this agent joined.
std::string AgentSession::address_now() const {
  std::string a;
  if (!options_.address_file.empty()) std::ifstream(options_.address_file) >> a;
  return a.empty() ? address_ : a;
}

// While lost: tries to join a coordinator that took over (every half second), and gives up past
// the rejoin timeout.
void AgentSession::try_rejoin() {
  const auto now = Clock::now();
  if (now - *lost_since_ > std::chrono::milliseconds(spec_.rejoin_timeout_ms))
    return board_->shut_down(
        1, lost_reason_ + "; no coordinator took the run over within " +
               std::to_string(spec_.rejoin_timeout_ms) + " ms (elastic.rejoin_timeout_ms)" +
               (rejoin_error_.empty() ? "" : "; the last try: " + rejoin_error_));
  if (now < next_try_) return;
  next_try_ = now + std::chrono::milliseconds(500);
  const std::string address = address_now();
  Joined j = join(*self_, bridge_, address, options_, name_, true);
  if (j.invalid)  // (one that took over refuses this program for the job, or another job's
                  // coordinator answers there: no try will do)
    return board_->shut_down(
        2, lost_reason_ + "; the coordinator at " + address + " refuses this agent: " + j.error);
  if (j.fenced)  // (its coordinator is there and dropped it, e.g. after it stalled: no take-over)
    return board_->shut_down(1, lost_reason_ + "; the coordinator at " + address +
                                    " is still there and refuses this agent (" + j.error + ")");
  if (!j.error.empty()) return void(rejoin_error_ = j.error);
  std::lock_guard<std::mutex> lock(reports_mu_);
  coordinator_ = j.coordinator;
  agent_id_->store(j.spec.agent_id);
  address_ = address;
  lost_since_.reset();
  for (const auto* kept : {&reports_, &shard_reports_})
    for (const auto& m : *kept)
      caf::anon_send(bridge_, actors::send_atom::value,
                     actors::RemoteAddress{j.coordinator, actors::kCoordinatorActorId}, m);
  spdlog::info(
      "joined the coordinator at {} (agent {}): it took the run over; {} step report(s) and {} "
      "checkpoint shard report(s) sent again",
      address, j.spec.agent_id, reports_.size(), shard_reports_.size());
  board_->rejoined(j.spec.first_generation);
  leave_again_ = signalled_ != 0;
  if (leave_again_) refused_.reset();  // (the lost coordinator's answer: the new one is asked)
}

// A signal taken before the coordinator was lost still asks this agent to leave: the lost
// coordinator's drain, or the stop it followed, went with it (the run taken over trains on).
// Asked again of the new coordinator once its first generation has started (a job that has not
// started refuses every drain).
void AgentSession::ask_leave_again() {
  if (!leave_again_ || board_->generation() < board_->next_generation()) return;
  leave_again_ = false;
  spdlog::warn(
      "{} before the coordinator was lost: asking the one that took the run over to drain "
      "this agent",
      actors::signal_name(signalled_));
  ask_leave(signalled_);
}

// SIGTERM or SIGINT to an agent is a leave: it asks the coordinator to drain it (it then leaves
// at the next step boundary and exits 0). If the coordinator cannot be asked, or refuses (too few
// workers would be left) and no stop of the job comes (await_stop), it exits at once with 128 +
// the signal; so does a second signal.
// A SIGHUP to a launched agent: the coordinator's process that launched it ended, and nobody is
// left to ask; it leaves at once with 1, saying so (the coordinator's loss would say it too,
// within elastic.failure_timeout_ms).
void AgentSession::on_signal(int sig, bool again) {
  const std::string name = actors::signal_name(sig);
  if (sig == SIGHUP && launcher_pid() > 0) {
    lost("the coordinator's process (pid " + std::to_string(launcher_pid()) +
         "), which launched this agent, ended");
    return;
  }
  if (again) {
    std::fprintf(stderr, "troupe agent: %s again: exiting at once\n", name.c_str());
    std::_Exit(128 + sig);
  }
  spdlog::warn("{}: asking the coordinator to drain this agent", name);
  ask_leave(sig);
}

void AgentSession::ask_leave(int sig) {
  signalled_ = sig;
  bool refused = false;
  const std::string error = ask_drain(&refused);
  if (error.empty()) return;
  const auto now = Clock::now();
  refused_ = Refused{sig, error, now + kStopGrace, now + std::chrono::seconds(60)};
  if (refused)
    await_stop();
  else  // (not answered: nothing to wait for)
    leave_at_once();
}

std::string AgentSession::ask_drain(bool* refused) {
  std::string error;
  caf::scoped_actor(*system_)  // (of its own: see join())
      ->request(bridge_, std::chrono::seconds(10), actors::request_atom::value,
                actors::RemoteAddress{coordinator_.load(), actors::kCoordinatorActorId},
                actors::make_drain_request(agent_id_->load()), uint32_t(5000))
      .receive([](ControlMessage&) {},
               [&](caf::error& e) {
                 auto ce = actors::control_error(e);
                 error = ce ? ce->message : system_->render(e);
                 if (refused) *refused = ce && ce->code == comm::Errc::refused;
               });
  return error;
}

// A preemption signals every process of the job at once: the coordinator, stopping too, may have
// refused the drain before it heard its own signal, and it holds its stop back while a membership
// change is under way (another agent's drain) until the next generation starts. Its stop, heard
// within kStopGrace of the refusal or of the change's end (a minute at most), is followed: the
// checkpoint it asks for is taken with this agent's shards. Else this agent leaves at once.
// Polled by watch(), which meanwhile hears a second signal and the coordinator's loss.
void AgentSession::await_stop() {
  const auto now = Clock::now();
  if (board_->stop_requested() && !board_->shutting_down())
    spdlog::warn("{}: the job stops at the next step boundary; this agent stops with it",
                 actors::signal_name(refused_->signal));
  if (board_->stop_requested() || board_->shutting_down()) return refused_.reset();
  if (board_->generation() > 0 && board_->leaving(board_->generation()))
    refused_->until = now + kStopGrace;  // (a change under way)
  if (now >= std::min(refused_->until, refused_->at_most)) leave_at_once();
}

void AgentSession::leave_at_once() {
  board_->shut_down(128 + refused_->signal, std::string(actors::signal_name(refused_->signal)) +
                                                " and the coordinator did not drain this agent (" +
                                                refused_->error + "): leaving at once");
  refused_.reset();
}

// Why the coordinator's link went: its loss, or (this agent itself stopped, SIGSTOP, or starved
// for longer than elastic.failure_timeout_ms within the last 10 s) the coordinator cutting this
// silent agent off: said at once (it said the coordinator was lost, and only a rejoin's refusal
// told otherwise).
std::string AgentSession::link_lost(const std::string& what, Clock::duration stalled,
                                    Clock::time_point stalled_at) const {
  const auto timeout = std::chrono::milliseconds(spec_.failure_timeout_ms);
  if (stalled <= timeout || Clock::now() - stalled_at > std::chrono::seconds(10))
    return "the coordinator was lost " + what;
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", std::chrono::duration<double>(stalled).count());
  return "the coordinator's link was cut " + what + " after this agent was itself stopped or " +
         "starved for " + seconds + " s, longer than elastic.failure_timeout_ms = " +
         std::to_string(spec_.failure_timeout_ms) + ": the coordinator has likely dropped it";
}

int AgentSession::watch(actors::SignalWatcher* signals) {
  int seen = 0;
  // (the longest of its own waits below, and when: 100 ms at most unless the process was
  // stopped or starved; not the joins and drains it asks for, which may take seconds)
  Clock::time_point stalled_at{};
  Clock::duration stalled{};
  while (!board_->shutting_down()) {
    const Clock::time_point turn = Clock::now();
    (*self_)->receive(
        [&](actors::NodeDown& d) {
          if (d.node != coordinator_.load()) return;
          const auto now = Clock::now();  // (a stall of this very wait counts too)
          const std::string what =
              "(" + std::string(comm::errc_name(d.code)) + ": " + d.reason + ")";
          lost(now - turn > stalled ? link_lost(what, now - turn, now)
                                    : link_lost(what, stalled, stalled_at));
        },
        caf::after(std::chrono::milliseconds(100)) >> [] {});
    const auto now = Clock::now();
    if (now - turn > stalled || now - stalled_at > std::chrono::seconds(10)) {
      stalled = now - turn;
      stalled_at = now;
    }
    if (lost_since_ && !board_->shutting_down()) try_rejoin();
    if (!lost_since_ && !board_->shutting_down()) ask_leave_again();
    if (refused_) await_stop();
    for (int sig; signals && (sig = signals->next()) != 0; ++seen) on_signal(sig, seen > 0);
  }
  return seen;
}

}  // namespace troupe::workers
