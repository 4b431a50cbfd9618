// The coordinator's actor: a thin driver of named parts. It turns control messages into calls
// on the parts and their answers into messages:
//   JobLifecycle (elastic/)  the phase and its deadline
//   Roster                   admission: agents, their workers, who may take part
//   Generations              who published, who is expected, the members by rank
//   decide_membership, start_generation (elastic/)   what the next generation is and where it
//   starts StepDriver               commits, the ledger, metrics, checksums decide_scale /
//   decide_drain (elastic/)           admin requests
#include "coordinator/job.h"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "actors/bridge.h"
#include "actors/job_protocol.h"
#include "actors/services.h"
#include "actors/signals.h"
#include "comm/host_identity.h"
#include "coordinator/admin.h"
#include "coordinator/checkpoints.h"
#include "coordinator/events.h"
#include "coordinator/generations.h"
#include "coordinator/job_metrics.h"
#include "coordinator/job_spec.h"
#include "coordinator/roster.h"
#include "coordinator/run_record.h"
#include "coordinator/step_driver.h"
#include "coordinator/trace_file.h"
#include "elastic/generation.h"
#include "elastic/job_phase.h"
#include "elastic/membership.h"
#include "elastic/planner.h"
#include "elastic/scaling.h"
#include "elastic/stragglers.h"

namespace troupe::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using actors::ControlMessage;
using actors::WorkerId;
using comm::Errc;
using elastic::JobPhase;
using deadline_atom = caf::atom_constant<caf::atom("jdeadline")>;
using log_failed_atom = caf::atom_constant<caf::atom("jlogfail")>;
using metrics_atom = caf::atom_constant<caf::atom("jmetrics")>;
using hearing_atom = caf::atom_constant<caf::atom("jhearing")>;
using adopted_atom = caf::atom_constant<caf::atom("jadopted")>;
using adoption_poll_atom = caf::atom_constant<caf::atom("jadoptpol")>;
using hung_atom = caf::atom_constant<caf::atom("jhung")>;
using stop_paused_atom = caf::atom_constant<caf::atom("jstoppause")>;
using none_left_atom = caf::atom_constant<caf::atom("jnoneleft")>;

// A file's lines (none when it cannot be read).
std::vector<std::string> lines_of_file(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(std::move(line));
  return out;
}

elastic::JobDeadlines deadlines_of(const JobConfig& c) {
  return {std::chrono::milliseconds(c.start_timeout_ms),
          std::chrono::milliseconds(c.change_timeout()),
          std::chrono::milliseconds(c.rejoin_timeout_ms)};
}

// An embedding program's request as the CLI's message, and the answer as the program's reply.
ControlMessage control_of(const AdminRequest& r) {
  using K = AdminRequest::Kind;
  switch (r.kind) {
    case K::status:
      return actors::make_status_request();
    case K::stop:
      return actors::make_stop_request();
    case K::checkpoint:
      return actors::make_checkpoint_request(false);
    case K::checkpoint_and_stop:
      return actors::make_checkpoint_request(true);
    case K::drain:
      return actors::make_drain_request(uint32_t(r.value));
    case K::scale:
      return actors::make_scale_request(uint32_t(r.value));
    case K::learning_rate:
      return actors::make_learning_rate_request(r.value);
  }
  return actors::make_status_request();
}

AdminReply reply_of(const ControlMessage& m) {
  auto body = m.envelope().getBody();
  if (body.isError()) return {false, body.getError().getMessage()};
  return {true, ""};
}

class Coordinator : public caf::event_based_actor {
 public:
  Coordinator(caf::actor_config& cfg, caf::actor bridge, JobConfig config, std::string run_dir,
              caf::actor observer, std::shared_ptr<JobMetrics> metrics)
      : caf::event_based_actor(cfg),
        bridge_(std::move(bridge)),
        cfg_(std::move(config)),
        dir_(std::move(run_dir)),
        observer_(std::move(observer)),
        log_(dir_, cfg_.ledger),
        job_(deadlines_of(cfg_), Clock::now()),
        steps_(log_, cfg_, [this](const StepCommitted& c) { on_commit(c); }),
        metrics_(std::move(metrics)),
        lr_(cfg_.lr) {
    // A write to the run directory that fails (a full disk) fails the job, naming the file:
    // handled as a message of its own, after the handler that wrote.
    log_.on_error([this](const std::string& why) { send(this, log_failed_atom::value, why); });
    if (!cfg_.checkpoint_dir.empty() && !cfg_.external()) checkpoints_.emplace(cfg_);
    if (metrics_) log_.observe([m = metrics_](const nlohmann::ordered_json& j) { m->record(j); });
    log_.observe([this](const nlohmann::ordered_json& j) { publish_event(j); });
  }

  void on_exit() override {
    // The bridge, the observer and the launcher may refer back to this actor: release them.
    bridge_ = caf::actor();
    observer_ = caf::actor();
    launcher_ = caf::actor();
  }

  caf::behavior make_behavior() override {
    log_.event("job_started", Json()
                                  .str("job", cfg_.name)
                                  .integer("steps", cfg_.steps)
                                  .integer("workers", cfg_.workers()));
    if (cfg_.take_over) {
      take_over();
    } else if (!cfg_.resume_dir.empty()) {
      log_.event("resumed_from_checkpoint",
                 Json().integer("step", long(cfg_.resume_step)).str("checkpoint", cfg_.resume_dir));
      if (!steps_.resume_at(cfg_.resume_step)) fail("cannot rewrite ledger.jsonl for the resume");
      resume_lr_schedule();
    }
    // The checkpoint it goes on from, when it is one of this run's: a stop before the next one
    // resumes (and exports) from there, and says so.
    if (checkpoints_ && !cfg_.resume_dir.empty() &&
        std::filesystem::path(cfg_.resume_dir).parent_path() ==
            std::filesystem::path(cfg_.checkpoint_dir))
      checkpoints_->reloaded(cfg_.resume_step, cfg_.resume_dir);
    set_down_handler([this](caf::down_msg& d) { unsubscribe(d.source); });
    arm_deadline();
    if (metrics_) send(this, metrics_atom::value);
    send(this, hearing_atom::value);
    return live();
  }

 private:
  // ---- behaviours ------------------------------------------------------------------------------

  caf::behavior live() {
    return {
        [this](ControlMessage& m) -> ControlMessage { return on_message(m); },
        [this](const AdminRequest& r) -> AdminReply {
          ControlMessage m = control_of(r);
          return reply_of(on_message(m));
        },
        [this](subscribe_atom, caf::actor& who) { subscribe(who); },
        [this](actors::NodeDown& d) { on_node_down(d); },
        [this](actors::NodeUp&) {},
        [this](deadline_atom, uint64_t epoch) { on_deadline(epoch); },
        [this](LauncherEvent& e) { on_launcher_event(e); },
        [this](launcher_atom, caf::actor& launcher) { launcher_ = launcher; },
        [this](interrupt_atom, int32_t signal) { on_interrupt(signal); },
        [this](log_failed_atom, const std::string& why) { fail(why); },
        [this](metrics_atom) { update_metrics(); },
        [this](hearing_atom) { update_hearing(); },
        [this](adopted_atom) { launch_missing(); },
        [this](adoption_poll_atom) { poll_adoption(); },
        [this](none_left_atom) { fail_if_none_can_return(); },
        [this](stop_paused_atom, const std::string& reason) {
          const JobPhase p = job_.phase();
          if ((p == JobPhase::paused || (p == JobPhase::forming && ending_before_training_)) &&
              job_.stop_requested())
            stop_without_members(reason, /*members_lost=*/p == JobPhase::paused);
        },
        [this](hung_atom, uint64_t generation, const std::string& error) {
          cut_hung_members(generation, error);
        },
    };
  }

  // After the job's end: status answers, everything else is refused with the reason.
  caf::behavior finished() {
    return {
        [this](ControlMessage& m) -> ControlMessage {
          if (m.envelope().getBody().isStatusRequest()) return encode(status());
          return actors::make_error_reply(Errc::refused, "the job is finished");
        },
        [](const AdminRequest&) {
          return AdminReply{false, "the job is finished"};
        },
        [](subscribe_atom, caf::actor&) {},
        [](LauncherEvent&) {},  // (the events end with the job's: agents going is its end)
        [](actors::NodeDown&) {},
        [](actors::NodeUp&) {},
        [](deadline_atom, uint64_t) {},
        [](launcher_atom, caf::actor&) {},
        [](interrupt_atom, int32_t) {},
        [](log_failed_atom, const std::string&) {},
        [this](metrics_atom) { update_metrics(); },
        [](hearing_atom) {},
        [](adopted_atom) {},
        [](adoption_poll_atom) {},
        [](hung_atom, uint64_t, const std::string&) {},
        [](none_left_atom) {},
        [](stop_paused_atom, const std::string&) {},
    };
  }

  ControlMessage on_message(ControlMessage& m) {
    auto body = m.envelope().getBody();
    using B = proto::Envelope::Body;
    switch (body.which()) {
      case B::JOIN:
        return on_join(m.envelope().getSrcNode(), actors::decode(body.getJoin()));
      case B::WORKER_READY:
        on_ready(actors::decode(body.getWorkerReady()));
        break;
      case B::STEP_REPORT:
        on_step(actors::decode(body.getStepReport()));
        break;
      case B::WORKER_DONE:
        on_done(actors::decode(body.getWorkerDone()));
        break;
      case B::WORKER_FAILED:
        on_worker_failed(actors::decode(body.getWorkerFailed()));
        break;
      case B::STATE_RECEIVED:
        on_state_received(actors::decode(body.getStateReceived()));
        break;
      case B::CHECKPOINT_WRITTEN:
        on_checkpoint(actors::decode(body.getCheckpointWritten()));
        break;
      case B::SCALE_REQUEST:
        return scale(body.getScaleRequest());
      case B::STATUS_REQUEST:
        return encode(status());
      case B::STOP_REQUEST:
        return stop(/*with_checkpoint=*/cfg_.checkpoint_every_steps > 0);
      case B::CHECKPOINT_REQUEST:
        return checkpoint(body.getCheckpointRequest().getStop());
      case B::TRACE_CHUNK:
        on_trace(actors::decode(body.getTraceChunk()));
        break;
      case B::DRAIN_REQUEST:
        return drain(body.getDrainRequest());
      case B::LEARNING_RATE_REQUEST:
        return set_lr(body.getLearningRateRequest());
      default:
        return actors::make_error_reply(Errc::invalid_input,
                                        "the coordinator does not take this message");
    }
    return actors::make_ack();
  }

  // ---- actors of the embedding program ---------------------------------------------------------

  void subscribe(const caf::actor& who) {
    if (!who || std::count(subscribers_.begin(), subscribers_.end(), who)) return;
    monitor(who);
    subscribers_.push_back(who);
  }
  void unsubscribe(const caf::actor_addr& who) {
    subscribers_.erase(std::remove_if(subscribers_.begin(), subscribers_.end(),
                                      [&](const caf::actor& a) { return a.address() == who; }),
                       subscribers_.end());
  }
  // Every events.jsonl line, as it is written, to the subscribers.
  void publish_event(const nlohmann::ordered_json& j) {
    if (subscribers_.empty() || !j.contains("event")) return;
    JobEvent e{j["event"].get<std::string>(), j.value("step", int64_t(-1)), j.dump()};
    for (const auto& a : subscribers_) send(a, e);
  }

  // ---- taking over a run whose coordinator was lost -------------------------------------------

  // troupe run --resume RUN_DIR of a run that did not end: the run directory says how far it got
  // (coordinator/run_record.h); agents still alive join again and send the step reports the lost
  // coordinator may not have written; the first generation starts where its members are.
  void take_over() {
    const RunRecord rec = read_run_record(lines_of_file(dir_ + "/events.jsonl"));
    gens_.continue_after(rec.generation, rec.world_size);
    if (checkpoints_) checkpoints_->taken_over(rec.generation);
    if (!steps_.continue_at(rec.committed))
      return fail("cannot rewrite " + dir_ + "/ledger.jsonl after step " +
                  std::to_string(rec.committed) + " to take the run over");
    lr_from_ = rec.lr_from;
    if (!lr_from_.empty()) lr_ = lr_from_.rbegin()->second;
    taking_over_ = true;
    taken_over_at_ = rec.committed;
    log_.event("coordinator_restarted", Json()
                                            .integer("generation", long(rec.generation))
                                            .integer("step", long(rec.committed))
                                            .str("checkpoint", cfg_.resume_dir));
    // Agents that were lost with it come back within their failure timeout and a poll of the run
    // directory's coordinator.addr; after that the launcher starts the ones still missing. Or
    // sooner: once every agent the run had is back or visibly gone (e.g. all killed with it).
    delayed_send(this, std::chrono::milliseconds(cfg_.failure_timeout_ms + 2000),
                 adopted_atom::value);
    adoption_pending_ = true;
    run_agents_ = rec.agents;
    here_ = comm::host_identity();
    send(this, adoption_poll_atom::value);
  }

  void poll_adoption() {
    if (!adoption_pending_) return;
    std::vector<AgentProcess> back;
    for (const auto& a : roster_.agents())
      if (a.alive) back.push_back({a.host_identity, a.pid});
    // (The launcher tells where it is after the coordinator has started: its agents wait for it.)
    if (!launcher_ || may_come_back(run_agents_, back, here_,
                                    [](uint32_t pid) { return comm::process_gone(int(pid)); }))
      return void(delayed_send(this, std::chrono::milliseconds(200), adoption_poll_atom::value));
    launch_missing("in place of an agent of the run that is gone");
  }

  // A resume in its own run directory goes on with the run's learning-rate changes (troupe lr)
  // after the checkpoint's step: each acts at its step again, as if nothing had happened. Not
  // when optimizer.lr was set for the resume (resume_lr 0): that rate from the checkpoint on,
  // recorded as a change there (a later take-over's run record forgets the old ones after it).
  void resume_lr_schedule() {
    const auto history = read_run_record(lines_of_file(dir_ + "/events.jsonl")).lr_from;
    const uint64_t at = cfg_.resume_step;
    if (cfg_.resume_lr <= 0) {
      if (!history.empty())
        log_.event("lr_changed",
                   Json().num("lr", cfg_.lr).integer("step", long(at)).integer("generation", 0));
      return;
    }
    lr_from_ = history;
    lr_from_.try_emplace(at, cfg_.lr);  // (a change at that very step stays: it ran with it)
    lr_ = scheduled_lr();
  }

  void launch_missing(
      const std::string& why = "in place of an agent not back after the take-over") {
    if (!adoption_pending_) return;  // (the wait ended early: poll_adoption)
    adoption_pending_ = false;
    if (!launcher_ || job_.finished()) return;
    int64_t live = 0;
    for (const auto& a : roster_.agents()) live += a.alive;
    if (live < cfg_.agents) launch_agents(cfg_.agents - live, why);
  }

  // The first generation after a take-over: the members' own state (adopted: nothing is
  // redone), or the checkpoint (the steps since are rolled back).
  // `from`: where the redone steps' state came from (a checkpoint, "" the seed; none: the state the
  // members hold).
  void note_take_over(const elastic::GenerationStart& g, const std::optional<std::string>& from) {
    taking_over_ = false;
    if (g.start_step >= steps_.committed()) {
      log_.event("members_adopted",
                 Json()
                     .integer("step", long(g.start_step))
                     .integer("recovered_steps", long(g.start_step - taken_over_at_)));
      tell("adopted the agents that came back: on from step " + std::to_string(g.start_step));
      return;
    }
    if (!cfg_.resume_dir.empty() && g.start_step == cfg_.resume_step)
      log_.event("resumed_from_checkpoint",
                 Json().integer("step", long(cfg_.resume_step)).str("checkpoint", cfg_.resume_dir));
    // (said: the console said only that the agents alive would go on from their own state)
    tell("steps " + std::to_string(g.start_step) + ".." + std::to_string(steps_.committed() - 1) +
         ", committed before the take-over, are trained again, from " +
         (!from           ? std::string("the state its members hold")
          : from->empty() ? std::string("the job's seed (no checkpoint)")
                          : "the checkpoint " + *from));
  }

  // ---- admission -------------------------------------------------------------------------------

  // A member joins a running job (or a paused one) too: once its worker is built and published
  // (on_ready), a new generation takes it in, or it waits as a standby above
  // elastic.max_workers. The members train on meanwhile.
  ControlMessage on_join(uint64_t node, const actors::Join& j) {
    if (std::string why = actors::protocol_refusal(j); !why.empty()) {
      spdlog::warn("{}", why);
      return actors::make_error_reply(Errc::invalid_input, why);
    }
    // (a program that cannot train the job: refused here, the job waits on for its own agents;
    // it joined, and its failure failed the job or was recorded as a lost member)
    if (std::string why = actors::kind_refusal(j, cfg_.model_kind, cfg_.data_kind); !why.empty()) {
      log_.event("agent_refused", Json()
                                      .str("name", j.agent_name)
                                      .str("host", j.host)
                                      .integer("pid", j.pid)
                                      .str("reason", why));
      spdlog::warn("refused agent '{}' (pid {} on {}): {}", j.agent_name, j.pid, j.host, why);
      tell("refused agent '" + j.agent_name + "': " + why);
      return actors::make_error_reply(Errc::invalid_input, why);
    }
    if (job_.phase() == JobPhase::forming && int64_t(roster_.alive()) >= cfg_.agents) {
      spdlog::info("{} asked to join while the first generation forms: answered to ask again",
                   j.agent_name);
      return actors::make_error_reply(
          Errc::refused, "the job forms its first generation with its " +
                             std::to_string(cfg_.agents) + " agents (cluster.agents); " +
                             actors::kJoinOnceStarted);
    }
    const Agent& a = roster_.admit(node, j);
    for (auto it = starting_.begin(); it != starting_.end();)
      it = it->second == int64_t(j.pid) && "agent-" + std::to_string(it->first) == j.agent_name
               ? starting_.erase(it)
               : std::next(it);
    send(bridge_, actors::monitor_atom::value, node);
    log_.event("member_joined", Json()
                                    .integer("member", a.id)
                                    .str("name", a.name)
                                    .str("host", a.host)
                                    .integer("pid", a.pid)
                                    .str("host_identity", a.host_identity)
                                    .integer("devices", long(a.devices.size()))
                                    .boolean("adopted", a.adopted));
    spdlog::info("agent {} joined: {} (pid {}, {} device(s))", a.id, a.name, a.pid,
                 a.devices.size());
    if (job_.started()) tell(a.name + " joined (id " + std::to_string(a.id) + ")");
    actors::JobSpec spec = job_spec_of(cfg_, a.id, gens_.current() + 1);
    // Only the first generation's workers start from the seed or the checkpoint; later ones
    // receive the members' state (and a coordinator that took over forms its first one again).
    spec.init_state = job_.phase() == JobPhase::forming;
    return encode(spec);
  }

  // Why a worker's holding cannot be true ("" when it can): state past the job's end, or past
  // the step the job starts from before its first generation (nothing ran; a coordinator that
  // took over running agents cannot tell, their steps may not have reached its ledger).
  std::string implausible(const elastic::Holding& h) const {
    const uint64_t newest = std::max(h.applied, h.backup_step);
    if (newest > uint64_t(cfg_.steps))
      return "of a job of " + std::to_string(cfg_.steps) + " steps";
    if (job_.phase() == JobPhase::forming && !taking_over_ && newest > steps_.committed())
      return "before the job ran any step (it starts at step " +
             std::to_string(steps_.committed()) + ")";
    return "";
  }

  // A worker's address for generation g+1 (g: the current one, 0 before the first).
  void on_ready(actors::WorkerReady r) {
    const WorkerId w = r.worker;
    if (const std::string why = implausible(r.holding); !why.empty()) {
      // (A worker's bug or another version's: a start there would commit steps never run.)
      spdlog::error(
          "worker {} says it holds state as of step {} {}: taken as holding nothing (it "
          "receives the state)",
          w.name(), std::max(r.holding.applied, r.holding.backup_step), why);
      r.holding = elastic::Holding{};
    }
    const std::string error = r.last_error;
    // A member that left the current generation with an error (a drained one too): its peers
    // may wait for it in a device collective.
    const bool broke = job_.started() && !error.empty() && gens_.is_member(w) &&
                       r.generation == gens_.current() + 1;
    if (broke) abandon_generation(w, "it left the generation: " + error);
    // (unknown, its agent lost or drained, or stale)
    if (!roster_.usable(w) || !gens_.publish(std::move(r))) return;
    if (broke) watch_for_hung(error);
    // A worker that is not a member (a joiner, a standby) being ready may change the membership.
    if (job_.started() && !gens_.is_member(w) && !gens_.is_expected(w)) decide_and_act();
    try_start();
  }

  // A member left the current generation because its data plane made no progress (a peer that
  // never came to a collective). A member still silent 2 x elastic.failure_timeout_ms + 10 s
  // later (its own collectives and connections would have failed by then), and not being
  // restarted by its agent, is hung: in its data set's fill, a block, a device. Its agent is cut
  // as one silent that long would be (the launcher starts it again).
  void watch_for_hung(const std::string& error) {
    if (hung_watch_ == gens_.current()) return;
    hung_watch_ = gens_.current();
    delayed_send(this, hung_after(), hung_atom::value, gens_.current(), error);
  }
  // (Its own collectives time out within failure_timeout_ms, a connection within 10 s.)
  std::chrono::milliseconds hung_after() const {
    return std::chrono::milliseconds(cfg_.hung_after_ms());
  }

  void cut_hung_members(uint64_t generation, const std::string& error) {
    if (job_.finished() || gens_.current() != generation) return;
    std::set<uint32_t> cut;
    for (const auto& m : gens_.members()) {
      const WorkerId w = m.worker;
      if (gens_.published(w) || gens_.is_restarting(w) || !roster_.usable(w) ||
          !cut.insert(w.agent).second)
        continue;
      const std::string why = "hung: its worker " + w.name() + " did not leave generation " +
                              std::to_string(generation) + " within " +
                              std::to_string(hung_after().count()) +
                              " ms of a member that lost it (" + error + ")";
      spdlog::error("agent {} ({}) {}", w.agent, roster_.at(w.agent).name, why);
      send(bridge_, actors::disconnect_atom::value, roster_.at(w.agent).node, why);
    }
  }

  void on_node_down(const actors::NodeDown& d) {
    ++losses_;
    Agent* a = roster_.live_at(d.node);
    if (!a) return lost_while_draining(d.node);
    a->alive = false;
    const std::string code = comm::errc_name(d.code);
    log_.event(
        "member_failed",
        Json().integer("member", a->id).str("name", a->name).str("reason", code + ": " + d.reason));
    std::string why =
        "agent " + std::to_string(a->id) + " (" + a->name + ") was lost: " + code + ": " + d.reason;
    if (!job_.started()) return lost_before_start(*a, why, d.code);
    spdlog::warn("{}", why);
    tell(a->name + " was lost (" + code + ")");
    last_failure_ = why;
    end_lost(*a, code);
    // (an adopted agent is no child of this launcher, which would restart it: one in its place;
    // before the adoption's wait ends, launch_missing counts it then)
    if (a->adopted && launcher_ && !adoption_pending_ && int64_t(roster_.alive()) < cfg_.agents)
      launch_agents(1, "in place of a lost adopted agent");
    decide_and_act();
  }

  // A drained agent lost before the step boundary it leaves at: its members' peers wait for it.
  void lost_while_draining(uint64_t node) {
    for (uint32_t id : draining_)
      if (roster_.at(id).node == node)
        for (const auto& m : gens_.members())
          if (m.worker.agent == id) return abandon_generation(m.worker, "it was lost draining");
  }

  // Before the first generation: agents started by hand (cluster.launcher = "external") come and
  // go as their operators start them; one lost leaves, and the job goes on waiting for enough
  // workers until elastic.start_timeout_ms. The local launcher's agent lost then is a failure
  // that would repeat (it fails the job, naming it), unless it went silent (timed_out: stopped,
  // starved on a busy host), which passes: the launcher ends it and starts it again, as after the
  // start (the job failed, its restarts unused).
  void lost_before_start(const Agent& a, const std::string& why, comm::Errc code) {
    // (one of this launcher's own: an agent started by hand, or adopted, is no slot of it)
    const bool launched = launcher_ && launched_slot(a) && !a.adopted;
    if (launched && code != comm::Errc::timed_out) return fail(why + " before training started");
    gens_.forget_agent(a.id);
    if (launched) end_lost(a, comm::errc_name(code));
    spdlog::warn("{} before training started; waiting for {} workers", why, cfg_.workers());
    tell(a.name + " was lost before training started" +
         (launched ? "; its launcher starts it again" : "") + "; waiting for " +
         std::to_string(cfg_.workers()) + " workers (" + std::to_string(gens_.published_count()) +
         " ready)");
  }

  // A worker thread that threw: its agent restarts it (it publishes for the next generation,
  // fresh, and takes the state there) or gave up on it.
  void on_worker_failed(const actors::WorkerFailed& f) {
    std::string why = "worker " + f.worker.name() + " failed: " + f.reason;
    if (!job_.started() || f.fatal) return fail(why);
    if (!roster_.known(f.worker)) return;
    ++losses_;
    log_.event("worker_failed", Json()
                                    .integer("member", f.worker.agent)
                                    .integer("device", f.worker.device)
                                    .integer("generation", long(f.generation))
                                    .str("reason", f.reason)
                                    .boolean("restarting", f.restarting));
    last_failure_ = why;
    if (f.restarting)
      gens_.restarting(f.worker);
    else
      roster_.give_up(f.worker);
    spdlog::warn("{}{}", why, f.restarting ? "; its agent restarts it" : "");
    tell(roster_.name(f.worker) + " failed" + (f.restarting ? ", restarting" : ", given up") +
         ": " + f.reason);
    decide_and_act();
  }

  // ---- generations -----------------------------------------------------------------------------

  // A member of the current generation that takes no part in its steps any more (its agent lost,
  // its worker failed: restarting or given up; a drained agent's members finish their step).
  void abandon_if_a_member_is_gone() {
    for (const auto& m : gens_.members()) {
      if (gens_.is_restarting(m.worker))
        return abandon_generation(m.worker, "it failed and is being restarted");
      if (!roster_.usable(m.worker) && !(draining(m.worker.agent) && !roster_.given_up(m.worker)))
        return abandon_generation(m.worker, "it was lost");
    }
  }

  // The other members give up the device collectives of the current generation they wait in
  // (actors::AbandonGeneration): with `w` gone they may never complete. Once a generation.
  void abandon_generation(WorkerId w, const std::string& why) {
    if (gens_.current() == 0 || abandoned_ == gens_.current()) return;
    abandoned_ = gens_.current();
    log_.event("generation_abandoned", Json()
                                           .integer("generation", long(gens_.current()))
                                           .str("member", roster_.name(w))
                                           .str("reason", why));
    to_generations_agents(encode(actors::AbandonGeneration{gens_.current()}));
  }

  bool draining(uint32_t agent) const {
    return std::count(draining_.begin(), draining_.end(), agent) > 0;
  }
  // To every agent still in the current generation: alive, or drained (it leaves at its end).
  void to_generations_agents(const ControlMessage& m) {
    for (const auto& a : roster_.agents())
      if (a.alive || draining(a.id)) to_agent(a.id, m);
  }

  uint32_t min_workers() const {
    // A fixed number of pipeline stages needs at least that many workers too. A job stopping
    // needs no more (the survivors of a pause take the stop's checkpoint; waiting for more would
    // only end in the pause's failure, the state lost with them).
    // Nor a job whose every step is committed (a member lost while the last checkpoint was
    // written: the survivors write it again, and pausing for more would fail a finished job).
    const bool ending = job_.stop_requested() || steps_.committed() >= uint64_t(cfg_.steps);
    // So does "auto" under parallel.max_params_per_worker: the fewest stages within it (a
    // scale or a loss below them formed a generation that could not plan, and rolled back to
    // the seed).
    const int64_t least = ending ? 1 : cfg_.min_workers;
    const int64_t stages =
        cfg_.pipeline_stages > 0
            ? cfg_.pipeline_stages
            : elastic::fewest_stages(cfg_.block_params, uint64_t(cfg_.max_params_per_worker));
    return uint32_t(std::max<int64_t>({1, least, stages}));
  }

  // What the membership should be now (elastic::decide_membership), and acting on it: a new
  // generation (the members end the current one at the next step boundary, or have already
  // left it when one was lost), a pause below elastic.min_workers, or the job's failure when a
  // pause outlasts elastic.rejoin_timeout_ms. Called after every failure, join, drain, scale
  // and rejoin timeout.
  void decide_and_act() {
    if (!job_.started()) return;
    abandon_if_a_member_is_gone();
    elastic::MembershipState st = gens_.membership_state(roster_);
    st.paused = job_.resuming();
    st.paused_since = job_.paused_since();
    elastic::MembershipOptions opt{min_workers(), uint32_t(cfg_.max_workers),
                                   std::chrono::milliseconds(cfg_.rejoin_timeout_ms)};
    opt.min_is_stages =
        int64_t(opt.min_workers) == cfg_.pipeline_stages && cfg_.pipeline_stages > cfg_.min_workers;
    opt.min_is_budget_stages = cfg_.pipeline_stages == 0 && opt.min_workers > cfg_.min_workers;
    auto d = elastic::decide_membership(Clock::now(), st, opt);
    log_standbys(d.standbys);
    using Kind = elastic::MembershipDecision::Kind;
    switch (d.kind) {
      case Kind::keep:
        return;
      case Kind::fail:
        return fail(d.reason + (last_failure_.empty() ? "" : "; last lost: " + last_failure_));
      case Kind::pause:
        return pause(d.reason);
      case Kind::new_generation:
        break;
    }
    std::vector<WorkerId> next;
    for (uint64_t k : d.members) next.push_back(WorkerId::from_key(k));
    std::sort(next.begin(), next.end());
    if (next == gens_.expected()) return;  // already under way
    gens_.expect(next);
    for (WorkerId w : next) roster_.at(w.agent).standby = false;
    spdlog::info("{}", d.reason);
    // The members still in the current generation end it at the next step boundary and publish
    // for the next one (those whose communicator broke have already). Drained agents too.
    to_generations_agents(encode(actors::LeaveGeneration{gens_.current()}));
    if (job_.change_decided(Clock::now())) arm_deadline();
    try_start();
  }

  void log_standbys(const std::vector<uint64_t>& standbys) {
    for (uint64_t k : standbys) {
      Agent& a = roster_.at(WorkerId::from_key(k).agent);
      if (a.standby) continue;
      a.standby = true;
      log_.event("member_standby", Json()
                                       .integer("member", a.id)
                                       .str("name", a.name)
                                       .str("reason", "above elastic.max_workers = " +
                                                          std::to_string(cfg_.max_workers)));
    }
  }

  void pause(const std::string& reason) {
    gens_.forget_expected();
    const bool fresh = job_.pause(Clock::now());
    arm_deadline();
    // (A second on: the launcher's word of a restart may come after the link's loss.)
    delayed_send(this, std::chrono::seconds(1), none_left_atom::value);
    // (Stopping: after the stop's answer has gone out, which the job's end would cut off.)
    if (job_.stop_requested())
      delayed_send(this, std::chrono::milliseconds(500), stop_paused_atom::value, reason);
    if (!fresh) return;
    log_.event("job_paused", Json()
                                 .str("reason", reason)
                                 .integer("step", long(steps_.committed()))
                                 .integer("rejoin_timeout_ms", cfg_.rejoin_timeout_ms));
    spdlog::warn("job paused at step {}: {}; waiting up to {} ms for workers", steps_.committed(),
                 reason, cfg_.rejoin_timeout_ms);
    tell("paused at step " + std::to_string(steps_.committed()) + ": " + reason);
  }

  // The workers of generation g+1 once every one of them has published: all workers before the
  // first generation, then the members decide_and_act chose (or, when the data plane broke with
  // nobody lost, the same members again).
  std::optional<std::vector<actors::WorkerReady>> next_members() {
    if (job_.phase() == JobPhase::forming) {
      const size_t ready = gens_.published_count();
      if (int64_t(ready) < cfg_.workers() && !(start_short_ && ready >= min_workers()))
        return std::nullopt;
      return gens_.all_published();
    }
    if (gens_.expected().empty() && !reform()) return std::nullopt;
    return gens_.ready(gens_.expected());
  }

  // Every member left the current generation without a membership event: its data plane broke
  // (an error every member saw, not a lost member). The same members form the next generation;
  // a generation that breaks elastic.max_reforms times in a row without committing a step fails
  // the job with the error, instead of going round for ever.
  bool reform() {
    auto error = gens_.broken_by(roster_);
    if (!error) return false;
    log_.event("generation_failed", Json()
                                        .integer("generation", long(gens_.current()))
                                        .integer("step", long(steps_.committed()))
                                        .str("error", *error));
    if (++reforms_ > cfg_.max_reforms) {
      const std::string times =
          reforms_ == 1 ? "" : " " + std::to_string(reforms_) + " times in a row";
      fail("generation " + std::to_string(gens_.current()) + " broke" + times +
           " without committing a step: " + *error);
      return false;
    }
    spdlog::warn("generation {} broke ({}); the same members form the next one", gens_.current(),
                 *error);
    std::vector<WorkerId> same;
    for (const auto& m : gens_.members()) same.push_back(m.worker);
    gens_.expect(same);
    return true;
  }

  // Why the workers of a generation cannot train together ("" when they can): they built
  // different models (a worker's bug, another program version, a model sized by local data).
  static std::string differing_models(const std::vector<actors::WorkerReady>& next) {
    for (const auto& r : next) {
      const auto& first = next.front();
      if (r.num_blocks != first.num_blocks)
        return "workers " + first.worker.name() + " and " + r.worker.name() +
               " say the model has " + std::to_string(first.num_blocks) + " and " +
               std::to_string(r.num_blocks) + " blocks";
      if (first.block_params.empty() || r.block_params.empty()) continue;  // (an older agent's)
      const std::string diff = elastic::model_difference(
          first.block_params, "worker " + first.worker.name() + "'s model", r.block_params,
          "worker " + r.worker.name() + "'s");
      if (!diff.empty())
        return "the workers built different models: " + diff + " (" +
               elastic::kSameModelEverywhere + ")";
    }
    return "";
  }

  // Starts generation g+1 when every worker it needs has published: where it starts
  // (elastic::start_generation), the ledger's recovery or rollback, and the member list to
  // every live agent.
  void try_start() {
    if (job_.finished() || ending_before_training_) return;
    auto next = next_members();
    if (!next) return;
    if (const std::string why = differing_models(*next); !why.empty()) return fail(why);
    std::vector<elastic::Holding> holdings;
    const uint32_t blocks = next->empty() ? 0 : next->front().num_blocks;
    for (const auto& r : *next) holdings.push_back(r.holding);
    // (A joiner is told the model's blocks, and refuses to start with others.)
    if (cfg_.block_params.empty() && !next->empty()) cfg_.block_params = next->front().block_params;
    if (cfg_.resume_blocks != 0 && blocks != cfg_.resume_blocks)  // (the model's never changes)
      return fail("the checkpoint " + cfg_.resume_dir + " holds " +
                  std::to_string(cfg_.resume_blocks) + " blocks of the model, which has " +
                  std::to_string(blocks));
    auto g = elastic::start_generation(holdings, blocks, steps_.committed());
    std::optional<std::string> reload;  // (the state lost: a checkpoint, or "" the seed)
    if (!g.ok) {  // (the failure that took the state first, where one did: what to fix)
      const std::string gen = "generation " + std::to_string(gens_.current() + 1);
      const std::string why =
          last_failure_.empty()
              ? g.reason + " (" + gen + ")"
              : "the model's state was lost with the last failure: " + last_failure_ + " (" + gen +
                    ": " + g.reason + ")";
      const std::string no_rollback = roll_back(*next, blocks, g, reload);
      if (!no_rollback.empty()) return fail(why + "; " + no_rollback);
      const std::string from =
          reload->empty()
              ? "the job's start (its seed)"
              : "the checkpoint of step " + std::to_string(g.start_step) + " (" + *reload + ")";
      spdlog::warn("{}; every member reloads the state from {}", why, from);
      tell("the model's state was lost; rolling back to " + from);
    }
    if (g.recover_to > g.recover_from) reforms_ = 0;
    const uint64_t reached = steps_.committed();  // (before a rollback sets it back)
    // (where the redone steps' state came from: a rollback's reload, or the checkpoint a take-over
    // whose agents did not come back resumed from, before steps the lost coordinator committed)
    std::optional<std::string> from = reload;
    if (taking_over_ && !from && g.rolled_back && !cfg_.resume_dir.empty() &&
        g.start_step == cfg_.resume_step)
      from = cfg_.resume_dir;
    if (taking_over_ && !from && g.rolled_back && cfg_.resume_dir.empty() && g.start_step == 0)
      from = std::string();  // (no checkpoint: from the seed)
    if (taking_over_) note_take_over(g, from);
    if (!steps_.start_generation(g, gens_.current(), gens_.world(), from))
      return fail("cannot rewrite " + dir_ + "/ledger.jsonl for the rollback to step " +
                  std::to_string(g.start_step));
    if (checkpoints_ && g.start_step < reached) undo_checkpoints(g.start_step);
    if (checkpoints_ && reload && !reload->empty()) checkpoints_->reloaded(g.start_step, *reload);
    const bool resumed = job_.resuming();
    gens_.start(std::move(*next));
    plan_.clear();  // rank 0 reports the new layout and data plane
    data_plane_.clear();
    job_.generation_started();
    if (gens_.current() == 1) t_start_ = Clock::now();
    if (resumed) log_resumed(g.start_step);
    announce(g, reload, reached);
  }

  // A rollback to `step`: the checkpoints of the steps after it are set aside (Checkpoints::
  // roll_back).
  void undo_checkpoints(uint64_t step) {
    requested_checkpoint_ = 0;  // (served, or undone: the redo's own requests take over)
    for (const auto& dir : checkpoints_->roll_back(step, gens_.current() + 1)) {
      spdlog::warn("set aside as {}: its step was rolled back to {}", dir, step);
      log_.event("checkpoint_undone",
                 Json().str("path", dir).integer("rolled_back_to", long(step)));
    }
  }

  // The model's state held by no member (checkpoint.on_state_lost = "rollback"): the generation
  // starts at the newest checkpoint (this job's, else the one it resumed from), or without one at
  // the job's start (its seed); every member reloads its state from there (each member's holding
  // then says it holds every block as of that step: nothing moves between them), and the steps
  // after it are redone. "" when so (g and `reload` say where), else why not.
  std::string roll_back(std::vector<actors::WorkerReady>& next, uint32_t blocks,
                        elastic::GenerationStart& g, std::optional<std::string>& reload) {
    if (cfg_.external()) return "a loop of its own keeps its own state (model.kind = \"external\")";
    if (cfg_.checkpoint_on_state_lost != "rollback") return "checkpoint.on_state_lost = \"fail\"";
    if (next.empty()) return "no member to roll back";
    // (A failure that recurs at the same step, a bug and not a lost machine, would roll back for
    // ever: elastic.max_reforms rollbacks in a row that commit no step past the last one fail.)
    rollbacks_ = steps_.committed() > rollback_mark_ ? 1 : rollbacks_ + 1;
    rollback_mark_ = steps_.committed();
    if (rollbacks_ > cfg_.max_reforms)
      return "rolled back " + std::to_string(rollbacks_ - 1) +
             " times in a row without committing a step past " + std::to_string(rollback_mark_) +
             " (elastic.max_reforms)";
    uint64_t step = 0;
    std::string directory;
    if (const std::string why = rollback_checkpoint(step, directory); !why.empty()) return why;
    g = elastic::reload_start(step, steps_.committed(), uint32_t(next.size()));
    for (auto& r : next) r.holding = elastic::reloaded(step, blocks);
    reload = directory;
    return "";
  }

  // The checkpoint a rollback goes to: the newest valid one in checkpoint.dir not past the
  // committed step (one of the steps after it, undone by an earlier rollback, is not in the
  // ledger; a damaged one is passed over) nor before the step it resumed from (an older one in a
  // shared directory may be of the history the resume left), else the one it resumed from, else
  // none (step 0, directory "": the seed). "" when so, else why not (the resumed-from one is not
  // valid).
  std::string rollback_checkpoint(uint64_t& step, std::string& directory) const {
    const CheckpointIdentity identity = checkpoint_identity(cfg_);
    std::vector<std::string> refused;
    auto c = newest_valid_checkpoint(cfg_.checkpoint_dir, identity, &refused, steps_.committed());
    if (c && c->step >= cfg_.resume_step) {
      step = c->step;
      directory = c->directory;
      for (const auto& r : refused) spdlog::warn("not rolling back to {}", r);
      return "";
    }
    if (cfg_.resume_dir.empty()) return "";  // (from the seed)
    std::string why;
    c = valid_checkpoint(cfg_.resume_dir, identity, &why);
    if (!c) return "the checkpoint it resumed from cannot be rolled back to: " + why;
    if (c->step > steps_.committed())
      return "the checkpoint it resumed from, " + cfg_.resume_dir + ", is of step " +
             std::to_string(c->step) + ", past the " + std::to_string(steps_.committed()) +
             " committed";
    step = c->step;
    directory = c->directory;
    return "";
  }

  void log_resumed(uint64_t step) {
    log_.event("job_resumed",
               Json()
                   .integer("step", long(step))
                   .integer("world_size", long(gens_.members().size()))
                   .num("paused_seconds",
                        std::chrono::duration<double>(Clock::now() - job_.paused_since()).count()));
  }

  // The member list to every live agent (standbys included: they publish again for the next
  // one), the event, and the drained agents' shutdown now that the others moved on without them.
  void announce(const elastic::GenerationStart& g, const std::optional<std::string>& reload,
                uint64_t reached) {
    const uint64_t gen = gens_.current();
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + cfg_.name + "] [coordinator] [gen " +
                        std::to_string(gen) + "] [%l] %v");
    actors::GenerationStart msg{gen,
                                g.start_step,
                                g.state_source,
                                {},
                                schedule_lr(gen, g.start_step, reached),
                                bool(reload),
                                reload.value_or(""),
                                {lr_from_.upper_bound(g.start_step), lr_from_.end()}};
    const auto& members = gens_.members();
    for (uint32_t i = 0; i < members.size(); ++i)
      msg.members.push_back({i, members[i].worker, members[i].address, members[i].holding});
    // Written before any agent hears of it: a coordinator lost in between is taken over by one
    // that numbers its generations after this one (one an agent may have heard of, and be
    // leaving, is never started again).
    log_.event("generation_started", Json()
                                         .integer("generation", long(gen))
                                         .integer("world_size", long(members.size()))
                                         .integer("step", long(g.start_step))
                                         .integer("state_source", g.state_source)
                                         .integer("lacking_state", g.lacking));
    auto encoded = encode(msg);
    for (const auto& a : roster_.agents())
      if (a.alive) to_agent(a.id, encoded);
    if (job_.stop_requested()) {          // (asked for while the change formed, or before it)
      stop_requested_at_ = g.start_step;  // (it stops after one step: watch_steps)
      tell_agents_to_stop();
    } else if (requested_checkpoint_ > 0 && checkpoints_ && may_miss_request() &&
               (!checkpoints_->newest() || checkpoints_->newest()->step < requested_checkpoint_)) {
      // A requested checkpoint not complete: the members voted for it, but one whose write was
      // under way may have ended with its worker (the result never reported), or the members
      // now are others (a drain, a standby taken in) who never heard of it. Asked again (not
      // after a change of the same members that lost nobody, troupe lr's: they go on and report).
      const uint64_t step = std::max(requested_checkpoint_, g.start_step + 1);
      log_.event("checkpoint_requested",
                 Json().integer("step", long(step)).boolean("stop", false).boolean("again", true));
      auto at = actors::make_checkpoint_at_step(step);
      for (const auto& a : roster_.agents())
        if (a.alive) to_agent(a.id, at);
    }
    spdlog::info("generation {} started: {} worker(s) from step {}", gen, members.size(),
                 g.start_step);
    if (gen > 1)
      tell("generation " + std::to_string(gen) + ": " + std::to_string(members.size()) +
           " worker(s) from step " + std::to_string(g.start_step));
    for (uint32_t id : draining_) shut_down_drained(id, g.start_step);
    draining_.clear();
  }

  void shut_down_drained(uint32_t id, uint64_t step) {
    send(bridge_, actors::demonitor_atom::value, roster_.at(id).node);  // (its exit is no loss)
    to_agent(id, encode(actors::Shutdown{"drained", 0}));
    tell(roster_.at(id).name + " left (drained)");
    log_.event("member_left", Json()
                                  .integer("member", id)
                                  .str("name", roster_.at(id).name)
                                  .str("reason", "drained")
                                  .integer("step", long(step)));
  }

  // ---- steps -----------------------------------------------------------------------------------

  void on_step(const actors::StepReport& r) {
    if (r.generation != gens_.current()) return;  // a late report of an older generation
    steps_.report(r, gens_.current(), gens_.world());
  }

  void on_commit(const StepCommitted& c) {
    reforms_ = 0;
    watch_stragglers(c);
    if (c.epoch_samples > 0 && !epoch_told_) tell_epoch(c.epoch_samples);
    if (c.eval_tokens > 0) tell_eval(c.committed - 1, c.eval_loss, c.eval_tokens);
    if (observer_)
      send(observer_, JobProgress{c.committed, uint64_t(cfg_.steps), c.loss, c.samples_per_s,
                                  c.tokens_per_s, c.generation, c.world_size, c.epoch});
  }

  // Once, as the members first report it: the data set's size, and a batch that draws every
  // sample more than once a step (a set smaller than batch.global trained without a word).
  void tell_epoch(uint64_t samples) {
    epoch_told_ = true;
    const uint64_t batch = uint64_t(cfg_.global_batch);
    tell("the data set has " + std::to_string(samples) + " sample(s) an epoch (" +
         fmt::format("{:.4g}", double(samples) / double(batch)) +
         " steps of batch.global = " + std::to_string(batch) + ")" +
         (samples < batch ? ": fewer than a step's batch, so every step draws each sample more "
                            "than once"
                          : ""));
  }

  // A worker's spans of observability.trace_steps: into trace.json (a failed write is logged;
  // the trace is a diagnostic, not the job's state).
  void on_trace(const actors::TraceChunk& c) {
    if (cfg_.trace_first < 0 || !roster_.known(actors::WorkerId{c.agent, c.device})) return;
    if (!trace_) trace_.emplace(dir_ + "/trace.json");
    const std::string why = trace_->add(c, roster_.at(c.agent).name);
    if (!why.empty()) spdlog::warn("trace.json: {}", why);
  }

  // ---- stragglers -------------------------------------------------------------------------------

  // Data-parallel members only: pipeline stages compute different blocks (elastic/stragglers.h).
  void watch_stragglers(const StepCommitted& c) {
    if (c.generation != straggler_generation_) {
      stragglers_.reset();
      straggler_generation_ = c.generation;
    }
    if (!plan_.empty()) return;
    for (const auto& s : stragglers_.observe(c.compute_seconds)) on_straggler(s);
  }

  // A `straggler` event (and a line for people); with elastic.drain_stragglers the agent is
  // drained like `troupe drain` (refused, it stays: `straggler_kept` says why).
  void on_straggler(const elastic::Straggler& s) {
    const auto& members = gens_.members();
    if (s.rank >= members.size()) return;
    const actors::WorkerId w = members[s.rank].worker;
    const Agent& a = roster_.at(w.agent);
    log_.event("straggler", Json()
                                .integer("rank", s.rank)
                                .integer("member", a.id)
                                .str("name", a.name)
                                .str("device", roster_.device(w))
                                .num("compute_seconds", s.seconds)
                                .num("median_seconds", s.median)
                                .integer("steps", s.steps)
                                .boolean("drain", cfg_.drain_stragglers));
    tell(a.name + " is a straggler: " + fmt::format("{:.1f}", s.seconds * 1e3) +
         " ms of compute a step, the others " + fmt::format("{:.1f}", s.median * 1e3) +
         " ms, for " + std::to_string(s.steps) + " steps" +
         (cfg_.drain_stragglers ? ": draining it" : ""));
    if (!cfg_.drain_stragglers) return;
    ControlMessage r = drain(a.id);
    auto body = r.envelope().getBody();
    if (body.isError())
      log_.event("straggler_kept",
                 Json().integer("member", a.id).str("reason", body.getError().getMessage().cStr()));
  }

  // A worker's checkpoint shards are durable: the manifest once every block is.
  void on_checkpoint(const actors::CheckpointWritten& w) {
    if (!checkpoints_ || checkpoints_->heard_before(w)) return;
    auto failed = [&](const std::string& why) {
      if (!checkpoints_->fail(w.step, w.generation)) return;  // (each writer may say: once)
      if (w.step >= requested_checkpoint_) requested_checkpoint_ = 0;  // (said: not asked again)
      checkpoint_failed(w.step, why);
    };
    if (!w.error.empty()) return failed("rank " + std::to_string(w.rank) + ": " + w.error);
    std::optional<CompletedCheckpoint> done;
    try {
      done = checkpoints_->add(w, uint32_t(gens_.world()), plan_, lr_at(w.step));
    } catch (const std::exception& e) {
      return failed(e.what());
    }
    for (const auto& [step, why] : checkpoints_->take_abandoned()) checkpoint_failed(step, why);
    if (!done) return;
    log_.event("checkpoint_written", Json()
                                         .integer("step", long(done->step))
                                         .str("path", done->manifest)
                                         .num("blocking_seconds", done->blocking_seconds)
                                         .num("write_seconds", done->write_seconds));
    log_.metric(Json()
                    .integer("checkpoint_step", long(done->step))
                    .num("checkpoint_blocking_seconds", done->blocking_seconds)
                    .num("checkpoint_write_seconds", done->write_seconds));
    spdlog::info("checkpoint at step {} written: {}", done->step, done->manifest);
  }

  // Why a job trained to its last step ends without its final checkpoint.
  std::string final_unsaved() const {
    const auto& newest = checkpoints_->newest();
    return "all " + std::to_string(steps_.committed()) +
           " steps trained, but the final checkpoint was not written" +
           (last_checkpoint_failure_.empty() ? "" : " (" + last_checkpoint_failure_ + ")") +
           ": the final parameters are not saved; " +
           (newest ? "the newest checkpoint is " + newest->manifest : "no checkpoint was written");
  }

  void checkpoint_failed(uint64_t step, const std::string& why) {
    last_checkpoint_failure_ = why;
    spdlog::error("checkpoint at step {} failed: {}", step, why);
    log_.event("checkpoint_failed", Json().integer("step", long(step)).str("reason", why));
    tell("checkpoint at step " + std::to_string(step) + " failed: " + why);
  }

  void on_state_received(const actors::StateReceived& t) {
    if (t.generation != gens_.current()) return;
    if (!t.plan.empty() && t.rank == 0) {
      plan_ = t.plan;
      log_.event("pipeline_plan", Json()
                                      .integer("generation", long(t.generation))
                                      .integer("world_size", long(gens_.members().size()))
                                      .str("plan", t.plan));
    }
    if (!t.data_plane.empty() && t.rank == 0) {
      data_plane_ = t.data_plane;
      log_.event("data_plane", Json()
                                   .integer("generation", long(t.generation))
                                   .integer("world_size", long(gens_.members().size()))
                                   .str("plane", t.data_plane));
    }
    if (t.needed)
      log_.event("state_received", Json()
                                       .integer("generation", long(t.generation))
                                       .integer("rank", t.rank)
                                       .integer("source", t.source_rank)
                                       .integer("blocks", t.blocks)
                                       .integer("bytes", long(t.bytes))
                                       .num("seconds", t.seconds));
  }

  void on_done(const actors::WorkerDone& d) {
    if (d.generation != gens_.current()) return;  // e.g. a drained member's
    if (first_end_.first != d.generation) first_end_ = {d.generation, Clock::now()};
    auto outcome = steps_.done(d, gens_.members().size());
    if (!outcome) return;
    // Members that end before job.steps unasked (a lost coordinator's stop they kept) leave the
    // run stopped, resumable; not "completed" short of its steps.
    const bool short_of_steps =
        !job_.stop_requested() && !cfg_.external() && steps_.committed() < uint64_t(cfg_.steps);
    if (short_of_steps)
      tell("the members ended at step " + std::to_string(steps_.committed()) + " of " +
           std::to_string(cfg_.steps) + " without a stop asked of this coordinator: stopped there");
    const bool stopped = job_.stop_requested() || short_of_steps;
    // Its checkpoint where it ended (the last step's, or a stop's): what troupe export reads, and
    // where a stopped job resumes (troupe run --resume).
    std::string last;
    if (checkpoints_ && checkpoints_->newest() &&
        checkpoints_->newest()->step == steps_.committed())
      last = checkpoints_->newest()->manifest;
    if (stopped) resumable_ = last;
    // Where a resume goes on from: the stop's checkpoint, or the newest before it (the steps after
    // it done again); none for a job that completed (nothing is left to run).
    const auto newest = newest_to_resume_from();
    const std::string resume_from = !stopped        ? ""
                                    : !last.empty() ? last
                                    : newest        ? newest->manifest
                                                    : "";
    if (outcome->eval_tokens > 0) {  // (the final parameters': after the last committed step)
      steps_.evaluated(steps_.committed(), outcome->eval_loss, outcome->eval_tokens,
                       gens_.members().size());
      tell_eval(steps_.committed(), outcome->eval_loss, outcome->eval_tokens);
    }
    // (A failure too: a job trained to its end whose final parameters were not saved, the disk
    // full or gone, has lost what it was for.)
    // (A program's own loop keeps its own checkpoints.)
    const std::string unsaved =
        !stopped && checkpoints_ && !cfg_.external() && last.empty() ? final_unsaved() : "";
    if (!outcome->identical || !unsaved.empty()) {
      const std::string why = !outcome->identical
                                  ? "members ended with different parameters: " + outcome->differing
                                  : unsaved;
      log_.event("job_failed", Json()
                                   .str("reason", why)
                                   .integer("step", long(steps_.committed()))
                                   .value("checksums", outcome->checksums));
      return finish(1, why, elastic::JobOutcome::failed);
    }
    log_.event("job_finished",
               Json()
                   .integer("steps", long(steps_.committed()))
                   .num("loss", steps_.last_loss())
                   .str("state", stopped ? "stopped" : "completed")
                   .value("checksums", outcome->checksums)
                   .boolean("identical_parameters", true)
                   .num("seconds", std::chrono::duration<double>(Clock::now() - t_start_).count())
                   .boolean("resumable", !resumable_.empty())
                   .str("checkpoint", last)
                   .str("resume_from", resume_from));
    finish(0, "", stopped ? elastic::JobOutcome::stopped : elastic::JobOutcome::completed);
  }

  // ---- metrics endpoint ------------------------------------------------------------------------

  // Once a second (while the endpoint is on): what only this actor knows, into the metrics —
  // members by state, and the control plane's frame counters (asked of the bridge).
  void update_metrics() {
    const auto st = status();
    // (Live ones: a lost, restarting or given-up member of the generation is no live worker; a
    // paused job's survivors are.)
    const auto live = std::count_if(st.members.begin(), st.members.end(), [](const auto& m) {
      return m.state != "lost" && m.state != "restarting" && m.state != "given up";
    });
    const auto waiting = std::count_if(st.standbys.begin(), st.standbys.end(),
                                       [](const auto& m) { return m.state != "given up"; });
    metrics_->set_members(uint32_t(live), uint32_t(waiting));
    request(bridge_, std::chrono::seconds(2), actors::stats_atom::value)
        .then(
            [m = metrics_](ControlMessage& reply) {
              auto body = reply.envelope().getBody();
              if (!body.isStats()) return;
              auto s = body.getStats();
              m->set_frames(s.getFramesReceived(), {{"malformed", s.getRejectedMalformed()},
                                                    {"oversized", s.getRejectedOversized()},
                                                    {"wrong_job", s.getRejectedWrongJob()},
                                                    {"stale", s.getRejectedStale()},
                                                    {"fenced", s.getRejectedFenced()},
                                                    {"no_actor", s.getRejectedNoActor()},
                                                    {"transport", s.getRejectedTransport()}});
            },
            [](caf::error&) {});
    delayed_send(this, std::chrono::seconds(1), metrics_atom::value);
  }

  // Every heartbeat interval: when the bridge last heard from each node (heartbeats or any frame),
  // for the status rows (troupe top's "heard" column).
  void update_hearing() {
    request(bridge_, std::chrono::seconds(2), actors::silence_atom::value)
        .then(
            [this](const std::vector<uint64_t>& silences) {
              const auto now = Clock::now();
              heard_at_.clear();
              for (size_t i = 0; i + 1 < silences.size(); i += 2)
                heard_at_[silences[i]] = now - std::chrono::milliseconds(silences[i + 1]);
            },
            [](caf::error&) {});
    delayed_send(this, std::chrono::milliseconds(cfg_.heartbeat_interval_ms), hearing_atom::value);
    watch_steps();
  }

  // ---- a step that never ends ------------------------------------------------------------------

  // elastic.step_timeout_ms without a committed step while the generation runs (or stops; no
  // change forming, no pause: those have their own deadlines): the members that reported nothing
  // since the last commit are hung in their step (a data set's fill on a hung mount, a model's
  // block or a device that never returns) where no peer's collective can notice it (one worker,
  // or every worker stuck). Their agents are cut as silent ones are: the launcher starts them
  // again, and the job goes on (from a checkpoint if the state went with them). Once a window.
  // After the last step, or the one a stop ends at, no step is to commit: the members write
  // their checkpoint, evaluate and end (WorkerDone), each within a window of another's end
  // (cut_unfinished_members), and one of them within three windows (never a wait without end).
  void watch_steps() {
    const auto now = Clock::now();
    const JobPhase p = job_.phase();
    const bool live = cfg_.step_timeout() > 0 && gens_.expected().empty() &&
                      (p == JobPhase::running || p == JobPhase::stopping);
    const bool more = steps_.committed() < uint64_t(cfg_.steps) &&
                      (p == JobPhase::running || steps_.committed() <= stop_requested_at_);
    const bool waiting = live && steps_.committed() == progress_step_ &&
                         gens_.current() == progress_generation_ && more == progress_more_;
    if (!waiting) {
      progress_step_ = steps_.committed();
      progress_generation_ = gens_.current();
      progress_more_ = more;
      progress_at_ = now;
      progress_windows_ = 0;
      return;
    }
    if (now - progress_at_ < std::chrono::milliseconds(cfg_.step_timeout())) return;
    progress_at_ = now;
    ++progress_windows_;
    more ? cut_silent_members() : cut_unfinished_members();
  }

  // After the last step: a member whose end has not come a window after another member's is hung
  // there (a write to a dead mount): its agent is cut, and the others write the checkpoint again.
  // None ended: the storage is slow for all of them, or hung for all: the job fails after three
  // windows, its earlier checkpoints intact (the members wrote a final checkpoint, if any, with
  // the same shards: one far behind the others is not slow but stuck).
  void cut_unfinished_members() {
    const auto& members = gens_.members();
    std::set<uint32_t> agents, cut;  // (an agent's workers are cut together)
    std::string ranks;
    size_t ended = 0;
    for (uint32_t r = 0; r < members.size(); ++r) {
      const WorkerId w = members[r].worker;
      agents.insert(w.agent);
      if (steps_.ended(r)) {
        ++ended;
      } else if (!gens_.published(w) && !gens_.is_restarting(w) && roster_.usable(w)) {
        cut.insert(w.agent);
        ranks += (ranks.empty() ? "rank " : ", rank ") + std::to_string(r) + " (" +
                 roster_.at(w.agent).name + ")";
      }
    }
    const auto since_first = Clock::now() - first_end_.second;  // (of this generation: ended > 0)
    if (cut.empty() || (ended == 0 && progress_windows_ < 3) ||
        (ended > 0 && since_first < std::chrono::milliseconds(cfg_.step_timeout())))
      return;
    const int64_t window = cfg_.step_timeout() * (ended == 0 ? 3 : 1);
    const std::string within = "within " + std::to_string(window) + " ms of the job's last step " +
                               std::to_string(steps_.committed()) +
                               " (the final checkpoint write and evaluation; " +
                               (ended == 0 ? "3 x " : "") + "elastic.step_timeout_ms)";
    if (ended == 0) return fail("no member ended " + within + ": " + ranks);
    if (cut.size() == agents.size())
      return fail(ranks + " did not end " + within + ", while " + std::to_string(ended) + " of " +
                  std::to_string(members.size()) + " ranks did");
    for (uint32_t agent : cut) {
      const std::string why = "hung: it did not end " + within + ", while " +
                              std::to_string(ended) + " of " + std::to_string(members.size()) +
                              " ranks did";
      spdlog::error("agent {} ({}) {}", agent, roster_.at(agent).name, why);
      send(bridge_, actors::disconnect_atom::value, roster_.at(agent).node, why);
    }
  }

  // The members that did not report the step to commit (all of them if each did: the step still
  // never came).
  void cut_silent_members() {
    const uint64_t gen = gens_.current();
    const auto& reports = steps_.last_reports();
    auto silent = [&](uint32_t rank) {
      const auto it = reports.find(rank);
      return it == reports.end() || it->second.generation != gen ||
             it->second.step < steps_.committed();
    };
    const auto& members = gens_.members();
    bool any = false;
    for (uint32_t r = 0; r < members.size(); ++r) any = any || silent(r);
    std::set<uint32_t> cut;
    for (uint32_t r = 0; r < members.size(); ++r) {
      const WorkerId w = members[r].worker;
      if ((any && !silent(r)) || gens_.published(w) || gens_.is_restarting(w) ||
          !roster_.usable(w) || !cut.insert(w.agent).second)
        continue;
      const std::string why = "hung: its worker " + w.name() + " committed no step within " +
                              std::to_string(cfg_.step_timeout()) + " ms (step " +
                              std::to_string(steps_.committed()) + " of generation " +
                              std::to_string(gen) + "; elastic.step_timeout_ms)";
      spdlog::error("agent {} ({}) {}", w.agent, roster_.at(w.agent).name, why);
      send(bridge_, actors::disconnect_atom::value, roster_.at(w.agent).node, why);
    }
  }

  void fill_heard(std::vector<actors::MemberStatus>& rows) const {
    const auto now = Clock::now();
    for (auto& r : rows) {
      auto it = heard_at_.find(roster_.at(r.agent).node);
      if (it != heard_at_.end())
        r.last_heard_ms =
            std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second).count();
    }
  }

  // ---- admin -----------------------------------------------------------------------------------

  actors::JobStatus status() const {
    auto s = job_status(cfg_, job_, roster_, gens_, steps_, plan_, draining_);
    s.data_plane = data_plane_;
    fill_heard(s.members);
    fill_heard(s.standbys);
    if (checkpoints_ && checkpoints_->newest()) {
      s.checkpoint_step = checkpoints_->newest()->step;
      s.checkpoint_path = checkpoints_->newest()->manifest;
    }
    return s;
  }

  // A checkpoint at the next step boundary (troupe checkpoint; with a stop: troupe stop
  // --checkpoint, SIGTERM). Every agent hears the step at or after which it is wanted (the next
  // one to commit); the members vote on it at their next step boundary, so all of them take it
  // at the same step. With a stop, the stop's own message asks for it (tell_agents_to_stop).
  //
  // Before training starts, a stop with a checkpoint is a stop after the first step, with one
  // there (it was refused as "not running", and the job then trained to its end). While a stop
  // is under way, a checkpoint alone is refused as lr and scale are (it was accepted, then said
  // to have failed when the job ended).
  ControlMessage checkpoint(bool and_stop) {
    if (cfg_.external())  // (it was accepted, and never came: `troupe checkpoint` waited)
      return actors::make_error_reply(
          Errc::invalid_input, std::string("the job's members run their own loop (model.kind = "
                                           "\"external\"): it keeps its own checkpoints") +
                                   (and_stop ? "; troupe stop without --checkpoint stops it" : ""));
    if (!checkpoints_)
      return actors::make_error_reply(Errc::refused, "this job has no checkpoint directory");
    if (ending_before_training_)  // (its answer said the job stops now, with nothing to save)
      return actors::make_error_reply(
          Errc::refused, "the job is stopping now, before it trained: no step to checkpoint");
    if (!and_stop && job_.stop_requested())
      return actors::make_error_reply(
          Errc::refused, std::string("the job is stopping") +
                             (stop_checkpoint_ ? ", with a checkpoint where it stops"
                                               : " (troupe stop --checkpoint takes one there)"));
    if (!job_.started() && !and_stop)
      return actors::make_error_reply(Errc::refused,
                                      "the job has not started training: no step to checkpoint");
    const uint64_t at = steps_.committed() + 1;
    if (!and_stop || !stop_checkpoint_)  // (a stop asked for it already: one request, logged once)
      log_.event("checkpoint_requested",
                 Json().integer("step", long(at)).boolean("stop", and_stop));
    if (!and_stop) {
      requested_checkpoint_ = at;
      losses_at_request_ = losses_;
      members_at_request_.clear();
      for (const auto& m : gens_.members()) members_at_request_.insert(m.worker.agent);
      auto msg = actors::make_checkpoint_at_step(at);
      for (const auto& a : roster_.agents()) to_agent(a.id, msg);
      return actors::make_ack();
    }
    return stop_at_next_step(true);
  }

  ControlMessage stop(bool with_checkpoint) {
    // (before checkpoint.every_steps's checkpoint: forming, there is nothing new to save; but a
    // take-over's adopted agents may hold steps past the newest checkpoint: they train one step
    // and save it, as before)
    if (job_.phase() == JobPhase::forming && !job_.stop_requested() && !taking_over_)
      return stop_before_training();
    if (with_checkpoint && checkpoints_ && !stop_checkpoint_) return checkpoint(true);
    return stop_at_next_step(false);
  }

  // A stop (troupe stop, without --checkpoint) before this coordinator formed a generation: no
  // step is under way to stop after (its agents may never come), so the job ends, stopped, once
  // the answer (its status) has gone out. (It was acknowledged as a stop "after the current
  // step", and the job trained one when agents came.) A generation that forms meanwhile starts
  // stopping, as any stop asked while it formed.
  ControlMessage stop_before_training() {
    job_.request_stop();
    ending_before_training_ = true;  // (no generation starts meanwhile: try_start)
    log_.event("stop_requested", Json().integer("step", long(steps_.committed())));
    delayed_send(this, std::chrono::milliseconds(500), stop_paused_atom::value,
                 std::string("troupe stop before the job formed a generation"));
    return encode(status());
  }

  // The job stops at the next step boundary. The agents hear it when it is new, and again when
  // it now wants a checkpoint (a plain stop asked for before: its message again, with one).
  ControlMessage stop_at_next_step(bool with_checkpoint) {
    const bool wants_more = with_checkpoint && !stop_checkpoint_;
    stop_checkpoint_ |= with_checkpoint;
    const bool first = job_.request_stop();
    if (first) {
      stop_requested_at_ = steps_.committed();
      log_.event("stop_requested", Json().integer("step", long(steps_.committed())));
    }
    // While a change is under way (its LeaveGeneration sent), the next generation carries the
    // stop (announce): a member that heard only one of the two would leave, another stop.
    if ((first || wants_more) && gens_.expected().empty()) tell_agents_to_stop();
    // Paused below elastic.min_workers: the survivors form a generation that stops; with too few
    // for any (every worker lost), the pause stops the job now.
    if (first && job_.phase() == JobPhase::paused) decide_and_act();
    return actors::make_ack();
  }

  // A stop (asked for, or a signal) with too few workers left to form a generation that stops
  // (every worker lost): waiting for more would only end in the pause's failure; or before the
  // first generation formed (members_lost false). The state went with the members: unless one was
  // written at the step it stops at before they were lost, a resume goes on from the newest
  // checkpoint (the steps after it redone).
  void stop_without_members(const std::string& reason, bool members_lost) {
    const auto newest = newest_to_resume_from();
    const std::string from = newest ? newest->manifest : "";
    // (One at the step it stops at, written before the loss: resumable from there, as a stop's.)
    if (newest && newest->step == steps_.committed()) resumable_ = from;
    const std::string there =
        !resumable_.empty()
            ? "its checkpoint there is " + from
            : std::string("no checkpoint there") +
                  (members_lost ? ", the state went with the workers; " : "; ") +
                  (from.empty() ? "no checkpoint to resume from" : "resume from " + from);
    const std::string why =
        "stopped at step " + std::to_string(steps_.committed()) + " (" + reason + "): " + there;
    spdlog::warn("{}", why);
    tell(why);
    log_.event("job_finished",
               Json()
                   .integer("steps", long(steps_.committed()))
                   .num("loss", steps_.last_loss())
                   .str("state", "stopped")
                   .num("seconds", std::chrono::duration<double>(Clock::now() - t_start_).count())
                   .boolean("resumable", !resumable_.empty())
                   .str("checkpoint", resumable_)
                   .str("resume_from", from));
    finish(0, "", elastic::JobOutcome::stopped);
  }

  // The checkpoint a resume of this job goes on from when it stops without one where it stops:
  // the newest of its own, else the one it resumed from (another run's: none of its own yet),
  // else none (the seed).
  std::optional<CompletedCheckpoint> newest_to_resume_from() const {
    if (checkpoints_ && checkpoints_->newest()) return checkpoints_->newest();
    if (cfg_.resume_dir.empty()) return std::nullopt;
    return CompletedCheckpoint{cfg_.resume_step, cfg_.resume_dir + "/manifest.json", 0, 0};
  }

  // Whether the members of the generation just started may miss a requested checkpoint: one was
  // lost since (its write with it), or one was not a member when it was asked for.
  bool may_miss_request() const {
    if (losses_ > losses_at_request_) return true;
    for (const auto& m : gens_.members())
      if (!members_at_request_.count(m.worker.agent)) return true;
    return false;
  }

  void tell_agents_to_stop() {
    auto msg = actors::make_stop_at_next_step(stop_checkpoint_);
    for (const auto& a : roster_.agents())
      if (a.alive) to_agent(a.id, msg);
  }

  // A scale or drain decision as the admin's answer (and its action).
  ControlMessage act_on(const elastic::ScaleDecision& d) {
    using Kind = elastic::ScaleDecision::Kind;
    switch (d.kind) {
      case Kind::invalid:
        return actors::make_error_reply(Errc::invalid_input, d.reason);
      case Kind::refuse:
        return actors::make_error_reply(Errc::refused, d.reason);
      case Kind::launch:
        if (launcher_) launch_agents(int64_t(d.agents_to_launch));
        return actors::make_accepted("starting " + std::to_string(d.agents_to_launch) +
                                     " agent(s); they join at a step boundary");
      case Kind::drain: {
        std::string names;
        for (uint32_t id : d.drain)
          names +=
              (names.empty() ? "" : ", ") + std::to_string(id) + " (" + roster_.at(id).name + ")";
        start_drain(d.drain);
        return actors::make_accepted("draining agent(s) " + names +
                                     ": they leave at the next step boundary");
      }
      case Kind::nothing:
        break;
    }
    return actors::make_accepted("nothing to do: " + d.reason);
  }

  ControlMessage drain(uint32_t id) {
    if (!job_.started()) return actors::make_error_reply(Errc::refused, "the job is not running");
    // (Stopping, every member leaves at the next step boundary: this one with the others, its
    // shards of the stop's checkpoint with theirs; a preemption signals agents and coordinator
    // at once, and a refusal would have made the agent leave at once, without them.)
    if (id < roster_.size() && !job_.stop_requested())
      if (const auto slot = launched_slot(roster_.at(id)); slot && restarting(*slot)) {
        retire_restarting(*slot);
        return actors::make_accepted("agent " + std::to_string(id) + " (" + roster_.at(id).name +
                                     ") was being restarted: it is not started again");
      }
    auto d = elastic::decide_drain(id, agents_to_count(), scale_limits(cfg_, min_workers(), dir_));
    if (job_.stop_requested() && d.kind != elastic::ScaleDecision::Kind::invalid)
      return actors::make_ack();  // (an agent it does not have is refused still)
    if (d.kind == elastic::ScaleDecision::Kind::refuse)  // (by id and name: agent-1 may be 0)
      d.reason = "agent " + std::to_string(id) + " (" + roster_.at(id).name + "): " + d.reason;
    return act_on(d);
  }

  // `troupe scale --workers N`: above the current size the local launcher starts agents (an
  // external launcher's operator starts them with `troupe agent --join`); below it, agents are
  // drained, standbys first, then the newest members.
  ControlMessage scale(uint32_t n) {
    if (!job_.started()) return actors::make_error_reply(Errc::refused, "the job is not running");
    if (job_.stop_requested())
      return actors::make_error_reply(Errc::refused, "the job is stopping");
    auto agents = agents_to_count();
    const auto limits = scale_limits(cfg_, min_workers(), dir_);
    // Below the job's size, agents whose restart waits (a crash loop's backoff) go first: retired
    // when the scale without them is accepted (a refused one changes nothing).
    const uint32_t per = limits.workers_per_agent;
    std::vector<int64_t> retiring;
    uint32_t starting = starting_agents() * per;
    for (const auto& [slot, pid] : starting_)
      if (restarting(slot) && elastic::usable_workers(agents) + starting >= n + per) {
        retiring.push_back(slot);
        starting -= per;
      }
    using Kind = elastic::ScaleDecision::Kind;
    auto d = elastic::decide_scale(n, agents, limits, starting);
    if (d.kind == Kind::invalid || d.kind == Kind::refuse)
      d = elastic::decide_scale(n, agents, limits, starting_agents() * per);  // (as it is)
    else
      for (int64_t slot : retiring) retire_restarting(slot);
    if (d.kind == Kind::launch || d.kind == Kind::drain)  // (no change, no event)
      log_.event("scale_requested", Json()
                                        .integer("workers", n)
                                        .integer("from", long(elastic::usable_workers(agents)))
                                        .integer("step", long(steps_.committed())));
    if (d.kind != Kind::invalid && d.kind != Kind::refuse) retire_lost_agents();
    return act_on(d);
  }

  // Whether the launcher's slot waits to start its agent again (its process ended; the backoff).
  bool restarting(int64_t slot) const {
    const auto it = starting_.find(slot);
    return it != starting_.end() && it->second == 0;
  }
  void retire_restarting(int64_t slot) {
    send(launcher_, RetireAgent{slot, 0});
    starting_.erase(slot);
  }

  // A size asked for is the job's: a lost agent's process that still lives (stopped, hung) is not
  // started again when it ends (the job would grow past the size). (A restarting one is counted.)
  void retire_lost_agents() {
    for (const Agent& a : roster_.agents()) {
      const auto slot = launched_slot(a);
      if (!a.alive && slot && !starting_.count(*slot)) retire(a);
    }
  }

  // optimizer.lr from the next step boundary: the members end the generation there and the same
  // members start the next one with it (every member, joiners too, from the same step); a change
  // already under way carries it.
  ControlMessage set_lr(double lr) {
    if (!(lr >= 1e-12 && lr <= 1e3))
      return actors::make_error_reply(
          Errc::invalid_input,
          "a learning rate must lie in [1e-12, 1000], not " + fmt::format("{}", lr));
    if (!job_.started()) return actors::make_error_reply(Errc::refused, "the job is not running");
    if (job_.stop_requested())
      return actors::make_error_reply(Errc::refused, "the job is stopping");
    lr_ = lr;
    lr_asked_ = true;
    log_.event("lr_change_requested",
               Json().num("lr", lr).integer("step", long(steps_.committed())));
    if (!gens_.expected().empty() || job_.phase() != JobPhase::running) return actors::make_ack();
    std::vector<WorkerId> same;
    for (const auto& m : gens_.members()) same.push_back(m.worker);
    gens_.expect(same);
    auto leave = encode(actors::LeaveGeneration{gens_.current()});
    for (const auto& a : roster_.agents())
      if (a.alive) to_agent(a.id, leave);
    if (job_.change_decided(Clock::now())) arm_deadline();
    try_start();
    return actors::make_ack();
  }

  // The learning rate of a generation starting at `start`, the job having reached `reached`. A
  // rate asked for since the last (troupe lr) acts from the later of the two: a rollback redoes
  // the steps before it at the rates they had, and the changes after `start` go with the start
  // (GenerationStart::lr_changes: each acts at its step again).
  double schedule_lr(uint64_t gen, uint64_t start, uint64_t reached) {
    const uint64_t from = std::max(start, reached);
    if (lr_asked_) {
      lr_asked_ = false;
      lr_from_.erase(lr_from_.upper_bound(from), lr_from_.end());
      lr_from_[from] = lr_;
      log_.event(
          "lr_changed",
          Json().num("lr", lr_).integer("step", long(from)).integer("generation", long(gen)));
      tell("learning rate " + fmt::format("{}", lr_) + " from step " + std::to_string(from));
    }
    return lr_at(start);
  }
  double scheduled_lr() const { return lr_from_.empty() ? cfg_.lr : lr_from_.rbegin()->second; }
  double lr_at(uint64_t step) const {
    auto it = lr_from_.upper_bound(step);
    return it == lr_from_.begin() ? cfg_.lr : std::prev(it)->second;
  }

  // Agents leave at the next step boundary: everyone ends the generation there, the next one is
  // built without them, then they are told to shut down. Nothing is redone. An agent that is not
  // a member (a standby) leaves at once.
  void start_drain(const std::vector<uint32_t>& ids) {
    for (uint32_t id : ids) {
      roster_.at(id).alive = false;
      retire(roster_.at(id));  // (from now: killed before it leaves, it is not started again)
      log_.event("drain_requested",
                 Json().integer("member", id).integer("step", long(steps_.committed())));
      if (gens_.has_member_on(id))
        draining_.push_back(id);
      else
        shut_down_drained(id, steps_.committed());
    }
    decide_and_act();
  }

  // ---- deadlines and the end -------------------------------------------------------------------

  // A timer for the current phase's deadline (elastic.start_timeout_ms, change_timeout_ms,
  // rejoin_timeout_ms); one that fires in a later phase is stale.
  void arm_deadline() {
    auto at = job_.deadline();
    if (!at) return;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*at - Clock::now());
    delayed_send(this, std::max(left, std::chrono::milliseconds(0)) + std::chrono::milliseconds(1),
                 deadline_atom::value, job_.epoch());
  }

  void on_deadline(uint64_t epoch) {
    if (!job_.expired(epoch, Clock::now())) return;
    switch (job_.phase()) {
      case JobPhase::forming:
        return start_short_or_fail();
      case JobPhase::changing:
        return fail("generation " + std::to_string(gens_.current() + 1) + " did not form within " +
                    std::to_string(cfg_.change_timeout()) +
                    " ms (elastic.change_timeout_ms); no address from: " +
                    gens_.missing(gens_.expected(), roster_));
      case JobPhase::paused:
        return decide_and_act();  // still too few workers: decide_membership fails the job
      default:
        return;
    }
  }

  // elastic.start_timeout_ms passed before every worker of cluster.agents was ready: with at
  // least elastic.min_workers ready the job starts with them (as torchrun's min:max nodes; the
  // others join when they come), else it fails naming how many were. (It failed either way.)
  void start_short_or_fail() {
    if (ending_before_training_) return;
    const size_t ready = gens_.published_count();
    // (the model's blocks, for the fewest stages a parameter budget allows: try_start sets them)
    if (cfg_.block_params.empty() && ready > 0)
      cfg_.block_params = gens_.all_published().front().block_params;
    const std::string within =
        " within " + std::to_string(cfg_.start_timeout_ms) + " ms (elastic.start_timeout_ms)";
    if (taking_over_ || ready == 0 || ready < min_workers())
      return fail("only " + std::to_string(ready) + " of " + std::to_string(cfg_.workers()) +
                  " workers became ready" + within +
                  (taking_over_ ? std::string()
                                : "; it starts with at least " + std::to_string(min_workers()) +
                                      " (elastic.min_workers)"));
    const std::string said = "starting with " + std::to_string(ready) + " of " +
                             std::to_string(cfg_.workers()) + " workers, those ready" + within +
                             " (elastic.min_workers = " + std::to_string(min_workers()) +
                             "); the others join when they come";
    spdlog::warn("{}", said);
    tell(said);
    start_short_ = true;
    try_start();
  }

  void on_interrupt(int32_t signal) {
    const std::string name = actors::signal_name(signal);
    ++interrupts_;
    log_.event("interrupted", Json()
                                  .str("signal", name)
                                  .integer("count", interrupts_)
                                  .integer("step", long(steps_.committed())));
    if (interrupts_ == 1 && job_.started()) {
      spdlog::warn("{}: stopping after the current step, with a checkpoint there", name);
      stop(/*with_checkpoint=*/true);
      return;
    }
    fail(interrupts_ == 1
             ? "interrupted by " + name + " before training started"
             : "interrupted by " + name + " again: stopped without waiting for the step");
  }

  void on_launcher_event(const LauncherEvent& e) {
    track_starting(e);
    slot_news_[e.slot] = e.event;
    if (e.event == "agent_exited" || e.event == "agent_restarting") return;  // (no news yet)
    Json j;
    j.integer("slot", e.slot).integer("attempt", e.attempt);
    if (e.pid) j.integer("pid", e.pid);
    if (e.event == "agent_restarted") j.integer("backoff_ms", e.backoff_ms);
    log_.event(e.event, j.str("detail", e.detail));
    // How a lost agent's process ended (a crash's signal), in the failure it is named by.
    const std::string name = "(agent-" + std::to_string(e.slot) + ")";
    if (!e.detail.empty() && last_failure_.find(name) != std::string::npos &&
        last_failure_.find(e.detail) == std::string::npos)
      last_failure_ += "; " + e.detail;
    tell("agent-" + std::to_string(e.slot) + ": " + e.event.substr(e.event.find('_') + 1) +
         (e.detail.empty() ? "" : " (" + e.detail + ")"));
    if (e.event == "agent_gave_up") {
      gave_up_ = e.detail;
      fail_if_none_can_return();
    }
  }

  // Paused with no agent alive, none starting, and the local launcher given up on one (its
  // restarts spent: a crash that recurs): nothing holds the state and nothing of this job's own
  // comes back, so the job fails now rather than at elastic.rejoin_timeout_ms. (An agent joined
  // by hand, or troupe scale, could still come: the pause does not wait for them.)
  // So does one whose live agents gave every worker up (worker_max_restarts spent: a fault that
  // recurs, e.g. the program's model throwing): they never train again (it waited
  // rejoin_timeout_ms).
  void fail_if_none_can_return() {
    if (!launcher_ || job_.phase() != JobPhase::paused) return;
    if (job_.stop_requested()) return;  // (the stop ends it, stopped)
    // (a lost agent whose process may live: ended and restarted once its grace is over)
    const bool ending = std::any_of(slot_news_.begin(), slot_news_.end(),
                                    [](const auto& n) { return n.second == "lost"; });
    if (starting_agents() > 0 || ending) return;
    const bool workers_given_up = roster_.alive() > 0 && roster_.usable_workers().empty();
    if (workers_given_up)
      return fail(std::string("no worker is left: every agent alive gave its workers up ") +
                  "(elastic.worker_max_restarts spent)" +
                  (last_failure_.empty() ? "" : "; last lost: " + last_failure_));
    if (gave_up_.empty() || roster_.alive() > 0) return;
    std::string lost = last_failure_;  // (without the give-up's detail again: said first)
    if (const size_t at = lost.find("; " + gave_up_); at != std::string::npos)
      lost.erase(at, gave_up_.size() + 2);
    fail("no agent is left: the launcher gave up on its agents (" + gave_up_ +
         ") and none is alive or starting" + (lost.empty() ? "" : "; last lost: " + lost));
  }

  // The agents the launcher was asked for or (re)started and that have not joined: they count as
  // the job's in a scale (launch_agents() counts them from the request on; a join by their name and
  // pid, an exit or a give-up ends them).
  void launch_agents(int64_t agents, const std::string& why = "scale") {
    send(launcher_, ScaleAgents{agents, why});
    launching_ += agents;
  }
  void track_starting(const LauncherEvent& e) {
    const std::string name = "agent-" + std::to_string(e.slot);
    const auto& agents = roster_.agents();
    const bool joined = std::any_of(agents.begin(), agents.end(), [&](const Agent& a) {
      return a.alive && a.pid == e.pid && a.name == name;
    });
    // (A scale's start that failed is attempt 0; a restart's is one of its restarts.)
    if (e.event == "agent_started" || (e.event == "agent_start_failed" && e.attempt == 0))
      launching_ = std::max<int64_t>(0, launching_ - 1);
    if ((e.event == "agent_started" || e.event == "agent_restarted" ||
         e.event == "agent_restarting") &&
        !joined)
      starting_[e.slot] = e.pid;  // (restarting: its restart's backoff; 0 until it is started)
    else if (e.event == "agent_gave_up" || e.event == "agent_exited" ||
             e.event == "agent_start_failed")
      starting_.erase(e.slot);
  }
  // A drained agent the launcher started ("agent-N", slot N, its pid) is not restarted when it
  // exits, even killed (the job would grow back past the size asked).
  void retire(const Agent& a) {
    if (const auto slot = launched_slot(a); slot && launcher_)
      send(launcher_, RetireAgent{*slot, int64_t(a.pid)});
  }
  // A lost agent the launcher started: its process, if it still lives when it has had the time to
  // end by itself (one whose worker hung exits failure_timeout_ms + 10 s after its cut, saying so),
  // is ended and restarted in its place (stopped, it would only end when woken, fenced, and its
  // slot would stay empty until then).
  void end_lost(const Agent& a, const std::string& code) {
    const auto slot = launched_slot(a);
    if (!slot || !launcher_) return;
    const auto grace = std::chrono::milliseconds(2 * cfg_.failure_timeout_ms + 10000);
    const auto said = slot_news_.find(*slot);  // (its end may come before the link's loss)
    const std::set<std::string> ended{"agent_restarting", "agent_gave_up", "agent_exited"};
    if (said != slot_news_.end() && ended.count(said->second)) return;
    delayed_send(launcher_, grace, EndLostAgent{*slot, int64_t(a.pid), "lost (" + code + ")"});
    slot_news_[*slot] = "lost";  // (until the launcher says how it ended)
  }
  // The launcher's slot N of an agent named "agent-N" (none for another name).
  static std::optional<int64_t> launched_slot(const Agent& a) {
    const std::string prefix = "agent-";
    if (a.name.rfind(prefix, 0) != 0 || a.name.size() == prefix.size() ||
        a.name.size() > prefix.size() + 9 ||
        a.name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
      return std::nullopt;
    return std::stoll(a.name.substr(prefix.size()));
  }
  uint32_t starting_agents() const { return uint32_t(starting_.size() + size_t(launching_)); }
  // The live agents a scale or a drain counts: one whose launcher slot is restarting (its process
  // ended; the launcher's news came before the link's) is that slot's starting agent, not a live
  // one (it counted twice, and a drain of it was lost on the new process).
  std::vector<elastic::LiveAgent> agents_to_count() const {
    auto agents = live_agents(roster_, gens_);
    agents.erase(std::remove_if(agents.begin(), agents.end(),
                                [&](const elastic::LiveAgent& l) {
                                  const Agent& a = roster_.at(l.id);
                                  const auto slot = launched_slot(a);
                                  const auto it = slot ? starting_.find(*slot) : starting_.end();
                                  return it != starting_.end() && it->second != int64_t(a.pid);
                                }),
                 agents.end());
    return agents;
  }

  void fail(const std::string& reason) {
    if (job_.finished()) return;
    log_.event("job_failed",
               Json().str("reason", reason).integer("step", long(steps_.committed())));
    finish(1, reason, elastic::JobOutcome::failed);
  }

  void finish(int code, const std::string& reason, elastic::JobOutcome outcome) {
    job_.finish(outcome);
    // The agents leave now: their disconnects are the job's end, not losses.
    for (const auto& a : roster_.agents()) send(bridge_, actors::demonitor_atom::value, a.node);
    auto msg = encode(actors::Shutdown{reason.empty() ? "the job is finished" : reason, code});
    for (const auto& a : roster_.agents()) to_agent(a.id, msg);
    // (failed, or stopped without a checkpoint where it stopped: the newest, the steps after it
    // to be redone by a resume)
    const bool without = outcome == elastic::JobOutcome::failed ||
                         (outcome == elastic::JobOutcome::stopped && resumable_.empty());
    const std::string checkpoint = without && checkpoints_ && checkpoints_->newest()
                                       ? checkpoints_->newest()->manifest
                                       : resumable_;
    if (observer_)
      send(observer_, JobFinished{code, reason, elastic::outcome_name(outcome), steps_.committed(),
                                  steps_.last_loss(), checkpoint});
    become(finished());
  }

  // An evaluation, for the people watching: the parameters before step `step` (the final ones
  // when it is the job's steps).
  void tell_eval(uint64_t step, double loss, uint64_t tokens) {
    char line[160];
    std::snprintf(line, sizeof line, "held-out loss %.4f at step %llu (%llu tokens)%s", loss,
                  (unsigned long long)step, (unsigned long long)tokens,
                  step == uint64_t(cfg_.steps) ? ": the final parameters" : "");
    tell(line);
  }

  // A membership change, for the people watching `troupe run`.
  void tell(const std::string& line) {
    if (observer_) send(observer_, JobNotice{line});
  }

  void to_agent(uint32_t id, const ControlMessage& m) {
    send(bridge_, actors::send_atom::value,
         actors::RemoteAddress{roster_.at(id).node, actors::kAgentActorId}, m);
  }

  caf::actor bridge_;
  JobConfig cfg_;
  std::string dir_;
  caf::actor observer_;
  caf::actor launcher_;  // the local launcher, if any (`troupe scale` above the current size)
  RunLog log_;
  elastic::JobLifecycle job_;
  Roster roster_;
  Generations gens_;
  StepDriver steps_;
  std::vector<uint32_t> draining_;  // agents that leave when the next generation starts
  // The launcher's slot -> the pid of the agent it (re)started there that has not joined yet.
  std::map<int64_t, int64_t> starting_;
  int64_t launching_ = 0;       // asked of the launcher, not yet reported started
  uint64_t abandoned_ = 0;      // the generation a member of which is gone (told to agents)
  int64_t reforms_ = 0;         // generations broken in a row without a committed step
  uint64_t hung_watch_ = 0;     // the generation whose silent members are being watched
  int64_t rollbacks_ = 0;       // rollbacks in a row that committed no step past ...
  uint64_t rollback_mark_ = 0;  // ... the steps committed when the last one was decided
  int64_t interrupts_ = 0;      // SIGINT/SIGTERM to the process
  std::string plan_;            // the generation's pipeline layout, as its rank 0 reported it
  std::string data_plane_;      // the generation's data plane, as its rank 0 reported it
  std::optional<Checkpoints> checkpoints_;  // with a checkpoint directory (troupe run resolves one)
  std::shared_ptr<JobMetrics> metrics_;     // with observability.metrics_listen
  std::unordered_map<uint64_t, Clock::time_point> heard_at_;  // by node, from the bridge
  elastic::StragglerDetector stragglers_{
      {cfg_.straggler_factor, uint32_t(std::max<int64_t>(1, cfg_.straggler_steps))}};
  uint64_t straggler_generation_ = 0;
  std::optional<TraceFile> trace_;       // with observability.trace_steps, from the first chunk
  std::string last_checkpoint_failure_;  // why the last checkpoint that failed did
  // Each launcher slot's last event, or "lost": its agent lost, how its process ends not heard of.
  std::map<int64_t, std::string> slot_news_;
  std::string gave_up_;            // the launcher's last give-up on an agent (its detail), if any
  std::string resumable_;          // the manifest a stopped job can resume from, once it finished
  bool adoption_pending_ = false;  // a take-over waits for its agents to come back (launch_missing)
  std::vector<AgentProcess> run_agents_;  // ... those the run had (poll_adoption)
  std::string here_;                      // ... and where this coordinator is
  std::string last_failure_;              // the last failure, for the message if the job fails
  double lr_;              // optimizer.lr now (the config's, or the last one asked for)
  bool lr_asked_ = false;  // lr_ asked for and not yet scheduled (schedule_lr)
  uint64_t progress_step_ = 0, progress_generation_ = 0;  // (watch_steps: the last seen)
  bool progress_more_ = true;
  uint32_t progress_windows_ = 0;  // (step_timeout windows passed without progress)
  std::pair<uint64_t, Clock::time_point> first_end_{0, {}};  // a generation's first WorkerDone
  bool epoch_told_ = false;                                  // (tell_epoch)
  uint64_t requested_checkpoint_ = 0;      // the step troupe checkpoint last asked for (0: none)
  uint64_t losses_ = 0;                    // agents lost and workers failed, so far
  uint64_t losses_at_request_ = 0;         // ... when requested_checkpoint_ was asked for
  std::set<uint32_t> members_at_request_;  // the agents of the generation it was asked in
  uint64_t stop_requested_at_ = 0;         // the steps committed at a stop
  bool stop_checkpoint_ = false;           // the stop asked for a checkpoint
  bool start_short_ = false;               // forming past start_timeout_ms: with the workers ready
  bool ending_before_training_ = false;    // a stop while forming: it ends, no generation starts
  Clock::time_point progress_at_ = Clock::now();  // (and when it was first seen)
  std::map<uint64_t, double> lr_from_;   // step -> optimizer.lr from it on (before: the config's)
  std::vector<caf::actor> subscribers_;  // actors that get every event (subscribe_atom)
  bool taking_over_ = false;             // until the first generation after a take-over
  uint64_t taken_over_at_ = 0;           // the steps the run had logged when taken over
  Clock::time_point t_start_ = Clock::now();
};

}  // namespace

void configure_job_system(caf::actor_system_config& cfg) {
  actors::configure_system(cfg);
  cfg.add_message_type<JobProgress>("troupe_job_progress");
  cfg.add_message_type<JobFinished>("troupe_job_finished");
  cfg.add_message_type<JobNotice>("troupe_job_notice");
  cfg.add_message_type<LauncherEvent>("troupe_launcher_event");
  cfg.add_message_type<ScaleAgents>("troupe_scale_agents");
  cfg.add_message_type<RetireAgent>("troupe_retire_agent");
  cfg.add_message_type<EndLostAgent>("troupe_end_lost_agent");
  cfg.add_message_type<JobEvent>("troupe_job_event");
  cfg.add_message_type<AdminRequest>("troupe_admin_request");
  cfg.add_message_type<AdminReply>("troupe_admin_reply");
}

namespace {

// An embedding program's config, as `troupe run` takes a file's: checked (it may have been
// changed after parse_config), its checkpoints in the run directory's checkpoints/ unless
// checkpoint.dir says otherwise, and its effective config in RUN_DIR/config.toml (what troupe
// export and troupe status read), unless a job ran there (events.jsonl).
JobConfig embedded_config(JobConfig c, const std::string& run_dir) {
  namespace fs = std::filesystem;
  check_config(c, "start_embedded_job's config (as TOML)");
  std::error_code ec;
  const std::string own = fs::absolute(run_dir + "/checkpoints", ec).lexically_normal().string();
  if (!c.external() && c.checkpoint_dir.empty()) c.checkpoint_dir = own;
  if (fs::exists(run_dir + "/events.jsonl", ec)) return c;  // (a job ran there: its own)
  JobConfig effective = with_absolute_paths(c);
  if (effective.checkpoint_dir == own) effective.checkpoint_dir.clear();  // (moves with the run)
  std::ofstream(run_dir + "/config.toml") << to_toml(effective);
  return c;
}

}  // namespace

EmbeddedJob start_embedded_job(caf::actor_system& system, const JobConfig& given,
                               const std::string& run_dir, caf::actor observer) {
  const JobConfig config = embedded_config(given, run_dir);
  EmbeddedJob job;
  job.job_id = config.name;
  job.token = new_token();
  actors::BridgeConfig bc = actors::job_bridge_config(config.name, job.token);
  auto [host, port] = comm::split_host_port(config.listen);
  bc.transport.listen_host = host;
  bc.transport.listen_port = port;
  bc.heartbeat_interval = std::chrono::milliseconds(config.heartbeat_interval_ms);
  bc.failure_timeout = std::chrono::milliseconds(config.failure_timeout_ms);
  job.bridge = actors::spawn_bridge(system, bc);
  job.coordinator = spawn_coordinator(system, job.bridge, config, run_dir, std::move(observer));
  caf::scoped_actor self{system};
  self->request(job.bridge, std::chrono::seconds(5), actors::info_atom::value)
      .receive([&](uint64_t, std::string& a) { job.address = a; }, [](caf::error&) {});
  return job;
}

void stop_embedded_job(EmbeddedJob& job) {
  caf::anon_send_exit(job.coordinator, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(job.bridge, caf::exit_reason::user_shutdown);
}

caf::actor spawn_coordinator(caf::actor_system& system, caf::actor bridge, const JobConfig& config,
                             const std::string& run_dir, caf::actor observer,
                             std::shared_ptr<JobMetrics> metrics) {
  caf::actor c;
  try {
    c = system.spawn<Coordinator, caf::detached>(bridge, config, run_dir, observer,
                                                 std::move(metrics));
  } catch (...) {  // (its run log cannot be opened): the system would wait for the bridge forever
    caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
    throw;
  }
  caf::anon_send(bridge, actors::register_atom::value, actors::kCoordinatorActorId, c);
  return c;
}

std::string new_token() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 4; ++i) t += fmt::format("{:016x}", (uint64_t(rd()) << 32) ^ rd());
  return t;
}

void write_token_file(const std::string& path, const std::string& job_id,
                      const std::string& token) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write the token file " + path);
  std::string line = job_id + " " + token + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == ssize_t(line.size());
  ::fchmod(fd, 0600);
  ::close(fd);
  if (!ok) throw std::runtime_error("cannot write the token file " + path);
}

}  // namespace troupe::coordinator
