#include "coordinator/job.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "actors/bridge.h"
#include "actors/services.h"
#include "coordinator/events.h"
#include "elastic/generation.h"
#include "elastic/membership.h"

namespace troupe::coordinator {
namespace {

using Clock = std::chrono::steady_clock;
using actors::ControlMessage;
using timeout_atom = caf::atom_constant<caf::atom("jtimeout")>;
using change_atom = caf::atom_constant<caf::atom("jchange")>;
using rejoin_atom = caf::atom_constant<caf::atom("jrejoin")>;

ControlMessage ack() {
  return ControlMessage::build([](proto::Envelope::Builder e) { e.initBody().setAck(); });
}

class Coordinator : public caf::event_based_actor {
 public:
  Coordinator(caf::actor_config& cfg, caf::actor bridge, JobConfig config, std::string run_dir,
              caf::actor observer)
      : caf::event_based_actor(cfg),
        bridge_(std::move(bridge)),
        cfg_(std::move(config)),
        dir_(std::move(run_dir)),
        observer_(std::move(observer)),
        log_(dir_, cfg_.ledger) {}

  void on_exit() override {
    // The bridge and the observer may refer back to this actor: release them.
    bridge_ = caf::actor();
    observer_ = caf::actor();
  }

  caf::behavior make_behavior() override {
    log_.event("job_started", Json()
                                  .str("job", cfg_.name)
                                  .integer("steps", cfg_.steps)
                                  .integer("workers", cfg_.workers()));
    delayed_send(this, std::chrono::seconds(120), timeout_atom::value);
    return {
        [this](ControlMessage& m) -> ControlMessage { return on_message(m); },
        [this](actors::NodeDown& d) { on_node_down(d); },
        [this](actors::NodeUp&) {},
        [this](change_atom, uint64_t from_generation) {
          // A membership change must complete: never wait forever for a worker's address.
          if (finished_ || generation_ != from_generation) return;
          if (paused_) return;  // a pause has its own deadline (elastic.rejoin_timeout_ms)
          std::string missing;
          for (uint64_t k : expected_)
            if (!pending_.count(k))
              missing += (missing.empty() ? "" : ", ") + agents_.at(agent_of(k)).name + "/" +
                         std::to_string(device_of(k));
          fail("generation " + std::to_string(generation_ + 1) + " did not form within " +
               std::to_string(change_deadline().count()) + " ms; no address from: " + missing);
        },
        [this](rejoin_atom, uint64_t epoch) {
          // The rejoin timeout of a pause: still too few workers means the job fails.
          if (!finished_ && paused_ && epoch == pause_epoch_) decide_and_act();
        },
        [this](LauncherEvent& e) {
          Json j;
          j.integer("slot", e.slot).integer("attempt", e.attempt);
          if (e.pid) j.integer("pid", e.pid);
          log_.event(e.event, j.str("detail", e.detail));
        },
        [this](timeout_atom) {
          if (generation_ == 0 && !finished_) {
            fail("only " + std::to_string(pending_.size()) + " of " +
                 std::to_string(cfg_.workers()) + " workers became ready within 120 s");
          }
        },
    };
  }

 private:
  struct Agent {
    uint32_t id;
    uint64_t node;
    std::string name, host;
    uint32_t pid;
    std::vector<std::string> devices;
    bool alive = true;     // false once lost or drained
    bool standby = false;  // logged as a standby (above elastic.max_workers)
  };
  struct Ready {
    uint32_t agent, device;
    std::string address;
    uint64_t applied = 0;            // steps this worker had applied when it published
    std::vector<uint32_t> held;      // blocks it held as of then
    std::string error;               // why its previous generation ended, if it broke
    std::vector<uint32_t> snapshot;  // blocks it held as of the step before
    uint32_t num_blocks = 0;
    std::vector<uint32_t> backup;  // stage backups it holds, as of backup_step
    uint64_t backup_step = 0;
  };
  struct StepAcc {
    uint32_t reports = 0;
    std::vector<uint32_t> reported;                     // ranks
    std::vector<std::pair<uint64_t, uint64_t>> ranges;  // their sample positions, [begin, end)
    double loss = 0, seconds = 0;
    double busy = 0;  // summed over the reporting ranks
    uint64_t samples = 0, tokens = 0;
  };

  ControlMessage on_message(ControlMessage& m) {
    auto env = m.envelope();
    auto body = env.getBody();
    switch (body.which()) {
      case proto::Envelope::Body::JOIN:
        return on_join(env.getSrcNode(), body.getJoin());
      case proto::Envelope::Body::WORKER_READY:
        on_ready(body.getWorkerReady());
        break;
      case proto::Envelope::Body::STEP_REPORT:
        on_step(body.getStepReport());
        break;
      case proto::Envelope::Body::WORKER_DONE:
        on_done(body.getWorkerDone());
        break;
      case proto::Envelope::Body::WORKER_FAILED:
        on_worker_failed(body.getWorkerFailed());
        break;
      case proto::Envelope::Body::STATE_RECEIVED: {
        auto t = body.getStateReceived();
        if (t.getGeneration() != generation_) break;
        if (t.getPlan().size() > 0 && t.getRank() == 0) plan_ = t.getPlan().cStr();
        if (t.getPlan().size() > 0 && t.getRank() == 0)
          log_.event("pipeline_plan", Json()
                                          .integer("generation", long(t.getGeneration()))
                                          .integer("world_size", long(members_.size()))
                                          .str("plan", t.getPlan().cStr()));
        if (t.getNeeded())
          log_.event("state_received", Json()
                                           .integer("generation", long(t.getGeneration()))
                                           .integer("rank", t.getRank())
                                           .integer("source", t.getSourceRank())
                                           .integer("blocks", t.getBlocks())
                                           .integer("bytes", long(t.getBytes()))
                                           .num("seconds", t.getSeconds()));
        break;
      }
      case proto::Envelope::Body::SCALE_REQUEST:
        return scale(body.getScaleRequest());
      case proto::Envelope::Body::STATUS_REQUEST:
        return status();
      case proto::Envelope::Body::STOP_REQUEST:
        return stop();
      case proto::Envelope::Body::DRAIN_REQUEST:
        return drain(body.getDrainRequest());
      default:
        return actors::make_error_reply("invalid_input",
                                        "the coordinator does not take this message");
    }
    return ack();
  }

  ControlMessage on_join(uint64_t node, proto::Join::Reader j) {
    if (finished_) return actors::make_error_reply("refused", "the job is finished");
    if (generation_ == 0 && int64_t(agents_.size()) >= cfg_.agents) {
      return actors::make_error_reply(
          "refused", "the job already has its " + std::to_string(cfg_.agents) + " agents");
    }
    Agent a{uint32_t(agents_.size()), node, j.getAgentName(), j.getHost(), j.getPid(), {}, true};
    for (auto d : j.getDevices()) a.devices.push_back(d);
    agents_.push_back(a);
    send(bridge_, actors::monitor_atom::value, node);
    log_.event("member_joined", Json()
                                    .integer("member", a.id)
                                    .str("name", a.name)
                                    .str("host", a.host)
                                    .integer("pid", a.pid)
                                    .integer("devices", long(a.devices.size())));
    spdlog::info("agent {} joined: {} (pid {}, {} device(s))", a.id, a.name, a.pid,
                 a.devices.size());
    // A member joins a running job (or a paused one): once its worker is built and published
    // (on_ready), a new generation takes it in, or it waits as a standby above
    // elastic.max_workers. The members train on meanwhile.
    return ControlMessage::build([&](proto::Envelope::Builder e) {
      auto s = e.initBody().initJobSpec();
      s.setAgentId(a.id);
      s.setJobName(cfg_.name);
      s.setSeed(uint64_t(cfg_.seed));
      s.setSteps(uint64_t(cfg_.steps));
      s.setModelKind(cfg_.model_kind);
      auto h = s.initHidden(unsigned(cfg_.hidden.size()));
      for (unsigned i = 0; i < cfg_.hidden.size(); ++i) h.set(i, cfg_.hidden[i]);
      s.setInputs(cfg_.inputs);
      s.setClasses(cfg_.classes);
      s.setLayers(cfg_.layers);
      s.setDModel(cfg_.d_model);
      s.setHeads(cfg_.heads);
      s.setContext(cfg_.context);
      s.setTiedHead(cfg_.tied_head);
      s.setDataKind(cfg_.data_kind);
      s.setDataPath(cfg_.data_path);
      s.setSamples(cfg_.samples);
      s.setGlobalBatch(cfg_.global_batch);
      s.setMicroBatch(cfg_.micro_batch);
      s.setOptimizer(cfg_.optimizer);
      s.setLr(cfg_.lr);
      s.setMomentum(cfg_.momentum);
      s.setWeightDecay(cfg_.weight_decay);
      s.setClipNorm(cfg_.clip_norm);
      s.setWarmupSteps(cfg_.warmup_steps);
      s.setDecaySteps(cfg_.decay_steps);
      s.setThreadsPerWorker(cfg_.threads_per_worker);
      s.setFailureTimeoutMs(cfg_.failure_timeout_ms);
      s.setOverlapReduce(cfg_.overlap_reduce);
      s.setFirstGeneration(generation_ + 1);
      s.setPipelineStages(cfg_.pipeline_stages);
      s.setMaxParamsPerWorker(cfg_.max_params_per_worker);
      s.setStageBackupSteps(cfg_.stage_backup_steps);
      s.setRecomputeActivations(cfg_.recompute_activations);
    });
  }

  static uint64_t key_of(uint32_t agent, uint32_t device) { return uint64_t(agent) << 32 | device; }
  static uint32_t agent_of(uint64_t key) { return uint32_t(key >> 32); }
  static uint32_t device_of(uint64_t key) { return uint32_t(key); }

  // A worker's address for generation g+1 (g: the current one, 0 before the first).
  void on_ready(proto::WorkerReady::Reader r) {
    if (finished_ || r.getGeneration() != generation_ + 1) return;  // stale
    if (r.getAgentId() >= agents_.size()) return;
    Ready ready;
    ready.agent = r.getAgentId();
    ready.device = r.getDevice();
    ready.address = r.getAddress();
    ready.applied = r.getAppliedStep();
    for (uint32_t b : r.getHeldBlocks()) ready.held.push_back(b);
    for (uint32_t b : r.getSnapshotBlocks()) ready.snapshot.push_back(b);
    ready.error = r.getLastError();
    ready.num_blocks = r.getNumBlocks();
    for (uint32_t b : r.getBackupBlocks()) ready.backup.push_back(b);
    ready.backup_step = r.getBackupStep();
    const uint64_t k = key_of(r.getAgentId(), r.getDevice());
    pending_[k] = std::move(ready);
    // A worker that is not a member (a joiner, a standby) being ready may change the membership.
    bool member = false;
    for (auto& m : members_) member |= key_of(m.agent, m.device) == k;
    if (generation_ > 0 && !member &&
        std::find(expected_.begin(), expected_.end(), k) == expected_.end())
      decide_and_act();
    check_start();
  }

  // Workers of live agents that may take part: not lost, not drained, not given up.
  bool usable(uint64_t key) const {
    const Agent& a = agents_.at(agent_of(key));
    return a.alive && !dead_workers_.count(key);
  }

  // What the membership should be now (elastic::decide_membership), and acting on it: a new
  // generation (the members end the current one at the next step boundary, or have already
  // left it when one was lost), a pause below elastic.min_workers, or the job's failure when a
  // pause outlasts elastic.rejoin_timeout_ms. Called after every failure, join, drain, scale
  // and rejoin timeout.
  void decide_and_act() {
    if (finished_ || generation_ == 0) return;
    elastic::MembershipState st;
    st.generation = generation_;
    st.paused = paused_;
    st.paused_since = paused_since_;
    std::set<uint64_t> current;
    for (auto& m : members_) {
      uint64_t k = key_of(m.agent, m.device);
      current.insert(k);
      st.members.push_back({k, usable(k) && !failed_workers_.count(k), m.applied});
    }
    for (auto& a : agents_)
      for (uint32_t d = 0; d < a.devices.size(); ++d) {
        uint64_t k = key_of(a.id, d);
        // A joiner or standby counts once it has published for the next generation (the
        // members train on while it builds its worker); a restarting one is expected anyway.
        if (usable(k) && ((!current.count(k) && pending_.count(k)) || failed_workers_.count(k)))
          st.waiting.push_back(k);
      }
    elastic::MembershipOptions opt;
    opt.min_workers = min_workers();
    opt.max_workers = uint32_t(cfg_.max_workers);
    opt.rejoin_timeout = std::chrono::milliseconds(cfg_.rejoin_timeout_ms);
    auto d = elastic::decide_membership(Clock::now(), st, opt);
    for (uint64_t k : d.standbys) {
      Agent& a = agents_.at(agent_of(k));
      if (a.standby) continue;
      a.standby = true;
      log_.event("member_standby", Json()
                                       .integer("member", a.id)
                                       .str("name", a.name)
                                       .str("reason", "above elastic.max_workers = " +
                                                          std::to_string(cfg_.max_workers)));
    }
    switch (d.kind) {
      case elastic::MembershipDecision::Kind::keep:
        return;
      case elastic::MembershipDecision::Kind::fail:
        fail(d.reason + (last_failure_.empty() ? "" : "; last lost: " + last_failure_));
        return;
      case elastic::MembershipDecision::Kind::pause:
        expected_.clear();
        if (!paused_) {
          paused_ = true;
          paused_since_ = Clock::now();
          ++pause_epoch_;
          log_.event("job_paused", Json()
                                       .str("reason", d.reason)
                                       .integer("step", long(committed_))
                                       .integer("rejoin_timeout_ms", cfg_.rejoin_timeout_ms));
          spdlog::warn("job paused at step {}: {}; waiting up to {} ms for workers", committed_,
                       d.reason, cfg_.rejoin_timeout_ms);
          delayed_send(this, std::chrono::milliseconds(cfg_.rejoin_timeout_ms + 1),
                       rejoin_atom::value, pause_epoch_);
        }
        return;
      case elastic::MembershipDecision::Kind::new_generation:
        break;
    }
    std::vector<uint64_t> next = d.members;
    std::sort(next.begin(), next.end());
    if (next == expected_) return;  // already under way
    const bool first = expected_.empty();
    expected_ = next;
    for (uint64_t k : next) agents_.at(agent_of(k)).standby = false;
    spdlog::info("{}", d.reason);
    // The members still in the current generation end it at the next step boundary and publish
    // for the next one (those whose communicator broke have already).
    auto leave = ControlMessage::build(
        [&](proto::Envelope::Builder e) { e.initBody().setLeaveGeneration(generation_); });
    for (auto& a : agents_)
      if (a.alive || std::count(draining_.begin(), draining_.end(), a.id))
        send(bridge_, actors::send_atom::value,
             actors::RemoteAddress{a.node, actors::kAgentActorId}, leave);
    if (first) change_started();
    check_start();
  }

  // Starts generation g+1 once every worker it needs has published its address: all workers
  // before the first generation, then the members decide_and_act chose.
  void check_start() {
    if (finished_) return;
    std::vector<Ready> next;
    if (generation_ == 0) {
      if (int64_t(pending_.size()) < cfg_.workers()) return;
      for (auto& [key, r] : pending_) next.push_back(r);
    } else {
      if (expected_.empty() && !reform()) return;
      for (uint64_t k : expected_) {
        auto it = pending_.find(k);
        if (it == pending_.end()) return;
        next.push_back(it->second);
      }
    }
    std::sort(next.begin(), next.end(), [](const Ready& a, const Ready& b) {
      return std::tie(a.agent, a.device) < std::tie(b.agent, b.device);
    });
    // The start: the newest step at which every block of the model is held by a member (live,
    // or in a pipeline stage's snapshot of the step before its last update). With pure data
    // parallelism that is the newest applied step. The state source: the lowest rank that
    // applied exactly that step. The step that was in flight is redone unless the start is past
    // it, in which case it was fully reduced with the old members and is committed now.
    std::vector<elastic::Holding> holdings;
    uint32_t blocks = 0;
    for (auto& r : next) {
      holdings.push_back({r.applied, r.held, r.snapshot, r.backup_step, r.backup});
      blocks = std::max(blocks, r.num_blocks);
    }
    auto start_at = elastic::choose_start_step(holdings, blocks);
    if (!start_at) {
      fail("no step at which every model block is held by a member of generation " +
           std::to_string(generation_ + 1) +
           ": every member that held some of the model's state was lost (with pipelines: a stage "
           "with no replica and no backup)");
      return;
    }
    const uint64_t start = *start_at;
    uint32_t source = 0;
    for (uint32_t i = 0; i < next.size(); ++i)
      if (next[i].applied == start) {
        source = i;
        break;
      }
    for (uint64_t step = committed_; step < start; ++step) commit(step, /*recovered=*/true);
    if (start < committed_) {
      // A pipeline stage without a replica was lost: everyone resumes from the stage backups.
      // The steps since are redone; their ledger lines go (they are written again when the
      // steps commit again), so every sample is still used once in the committed steps.
      log_.event("steps_rolled_back", Json()
                                          .integer("from", long(start))
                                          .integer("to", long(committed_))
                                          .integer("generation", long(generation_ + 1)));
      spdlog::warn("rolling back steps {}..{} to the stage backups", start, committed_ - 1);
      if (!log_.drop_ledger_from(start)) {
        fail("cannot rewrite " + dir_ + "/ledger.jsonl for the rollback to step " +
             std::to_string(start));
        return;
      }
      committed_ = start;
    }
    // Reports of the old generation for steps from `start` on are void: those steps are redone
    // (a pipeline stage may have applied and reported a step that others never finished).
    steps_.clear();
    members_ = next;
    plan_.clear();  // rank 0 reports the new layout
    pending_.clear();
    expected_.clear();
    failed_workers_.clear();
    ++generation_;
    if (generation_ == 1) t_start_ = Clock::now();
    if (paused_) {
      paused_ = false;
      log_.event("job_resumed",
                 Json()
                     .integer("step", long(start))
                     .integer("world_size", long(members_.size()))
                     .num("paused_seconds",
                          std::chrono::duration<double>(Clock::now() - paused_since_).count()));
    }
    spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + cfg_.name + "] [coordinator] [gen " +
                        std::to_string(generation_) + "] [%l] %v");
    auto msg = ControlMessage::build([&](proto::Envelope::Builder e) {
      auto g = e.initBody().initGenerationStart();
      g.setGeneration(generation_);
      g.setStartStep(start);
      g.setStateSource(source);
      auto ms = g.initMembers(unsigned(members_.size()));
      for (unsigned i = 0; i < members_.size(); ++i) {
        ms[i].setRank(i);
        ms[i].setAgentId(members_[i].agent);
        ms[i].setDevice(members_[i].device);
        ms[i].setAddress(members_[i].address);
        ms[i].setAppliedStep(members_[i].applied);
        auto h = ms[i].initHeldBlocks(unsigned(members_[i].held.size()));
        for (unsigned k = 0; k < members_[i].held.size(); ++k) h.set(k, members_[i].held[k]);
        auto sb = ms[i].initSnapshotBlocks(unsigned(members_[i].snapshot.size()));
        for (unsigned k = 0; k < members_[i].snapshot.size(); ++k)
          sb.set(k, members_[i].snapshot[k]);
        auto bb = ms[i].initBackupBlocks(unsigned(members_[i].backup.size()));
        for (unsigned k = 0; k < members_[i].backup.size(); ++k) bb.set(k, members_[i].backup[k]);
        ms[i].setBackupStep(members_[i].backup_step);
      }
    });
    // Every live agent hears it, standbys included: they publish again for the next one.
    for (auto& a : agents_)
      if (a.alive)
        send(bridge_, actors::send_atom::value,
             actors::RemoteAddress{a.node, actors::kAgentActorId}, msg);
    uint32_t lacking = 0;
    for (auto& m : members_) lacking += m.applied != start;
    log_.event("generation_started", Json()
                                         .integer("generation", long(generation_))
                                         .integer("world_size", long(members_.size()))
                                         .integer("step", long(start))
                                         .integer("state_source", source)
                                         .integer("lacking_state", lacking));
    spdlog::info("generation {} started: {} worker(s) from step {}", generation_, members_.size(),
                 start);
    // Drained agents leave now that the others have moved on without them.
    for (uint32_t id : draining_) shut_down_drained(id, start);
    draining_.clear();
  }

  // Every member left the current generation without a membership event: its data plane broke
  // (an error every member saw, not a lost member). The same members form the next generation;
  // a generation that breaks kMaxReforms times in a row without committing a step fails the job
  // with the error, instead of going round for ever.
  bool reform() {
    static constexpr int kMaxReforms = 3;
    std::string error;
    for (auto& m : members_) {
      uint64_t k = key_of(m.agent, m.device);
      auto it = pending_.find(k);
      if (!usable(k) || it == pending_.end()) return false;
      if (error.empty()) error = it->second.error;
    }
    if (error.empty()) error = "no error reported";
    log_.event("generation_failed", Json()
                                        .integer("generation", long(generation_))
                                        .integer("step", long(committed_))
                                        .str("error", error));
    if (++reforms_ > kMaxReforms) {
      fail("generation " + std::to_string(generation_) + " broke " + std::to_string(reforms_) +
           " times in a row without committing a step: " + error);
      return false;
    }
    spdlog::warn("generation {} broke ({}); the same members form the next one", generation_,
                 error);
    for (auto& m : members_) expected_.push_back(key_of(m.agent, m.device));
    std::sort(expected_.begin(), expected_.end());
    return true;
  }

  void shut_down_drained(uint32_t id, uint64_t step) {
    auto bye = ControlMessage::build([](proto::Envelope::Builder e) {
      auto s = e.initBody().initShutdown();
      s.setReason("drained");
      s.setExitCode(0);
    });
    send(bridge_, actors::send_atom::value,
         actors::RemoteAddress{agents_.at(id).node, actors::kAgentActorId}, bye);
    log_.event("member_left",
               Json().integer("member", id).str("reason", "drained").integer("step", long(step)));
  }

  // A worker thread that threw: its agent restarts it (it publishes for the next generation,
  // fresh, and takes the state there) or gave up on it.
  void on_worker_failed(proto::WorkerFailed::Reader f) {
    std::string why = "worker " + std::to_string(f.getAgentId()) + "/" +
                      std::to_string(f.getDevice()) + " failed: " + f.getReason().cStr();
    if (generation_ == 0 || f.getFatal()) {
      fail(why);
      return;
    }
    if (f.getAgentId() >= agents_.size()) return;
    const uint64_t k = key_of(f.getAgentId(), f.getDevice());
    log_.event("worker_failed", Json()
                                    .integer("member", f.getAgentId())
                                    .integer("device", f.getDevice())
                                    .integer("generation", long(f.getGeneration()))
                                    .str("reason", f.getReason().cStr())
                                    .boolean("restarting", f.getRestarting()));
    last_failure_ = why;
    if (f.getRestarting())
      failed_workers_.insert(k);
    else
      dead_workers_.insert(k);
    spdlog::warn("{}{}", why, f.getRestarting() ? "; its agent restarts it" : "");
    decide_and_act();
  }

  void on_step(proto::StepReport::Reader r) {
    if (r.getGeneration() != generation_) return;  // a late report of an older generation
    auto& acc = steps_[r.getStep()];
    acc.reports++;
    acc.reported.push_back(r.getRank());
    acc.ranges.push_back({r.getPositionBegin(), r.getPositionEnd()});
    acc.loss = r.getLoss();
    acc.samples += r.getSamples();
    acc.tokens += r.getTokens();
    acc.seconds = std::max(acc.seconds, r.getSeconds());
    acc.busy += r.getBusySeconds();
    if (acc.reports < members_.size()) return;
    commit(r.getStep(), false);
  }

  // Commits a step and writes its ledger lines (only now: a step reported by some members and
  // then redone is never in the ledger twice). recovered: applied by some members of the old
  // generation but not reported by all (the lost one among them); the positions nobody reported
  // were used by the members that did not report (they took part in the reduction) and go on
  // one line under the first of them.
  void commit(uint64_t step, bool recovered) {
    StepAcc acc = steps_[step];
    if (cfg_.ledger) {
      auto line = [&](uint32_t rank, const std::string& positions) {
        log_.ledger(Json()
                        .integer("step", long(step))
                        .integer("generation", long(generation_))
                        .integer("member", rank)
                        .raw("positions", "[" + positions + "]"));
      };
      auto pair = [](uint64_t a, uint64_t b) {
        return "[" + std::to_string(a) + "," + std::to_string(b) + "]";
      };
      for (size_t i = 0; i < acc.reported.size(); ++i)
        line(acc.reported[i], pair(acc.ranges[i].first, acc.ranges[i].second));
      if (recovered) {
        const uint64_t B = uint64_t(cfg_.global_batch);
        auto ranges = acc.ranges;
        std::sort(ranges.begin(), ranges.end());
        std::string gaps;
        uint64_t at = step * B;
        for (auto [a, b] : ranges) {
          if (a > at) gaps += (gaps.empty() ? "" : ",") + pair(at, a);
          at = std::max(at, b);
        }
        if (at < (step + 1) * B) gaps += (gaps.empty() ? "" : ",") + pair(at, (step + 1) * B);
        uint32_t missing = 0;
        while (std::count(acc.reported.begin(), acc.reported.end(), missing)) ++missing;
        if (!gaps.empty()) line(missing, gaps);
      }
    }
    committed_ = step + 1;
    reforms_ = 0;
    last_loss_ = acc.loss;
    double sps = acc.samples / std::max(acc.seconds, 1e-9),
           tps = acc.tokens / std::max(acc.seconds, 1e-9);
    log_.event("step_committed", Json()
                                     .integer("step", long(step))
                                     .num("loss", acc.loss)
                                     .integer("samples", long(cfg_.global_batch))
                                     .integer("generation", long(generation_))
                                     .integer("world_size", long(members_.size())));
    log_.metric(
        Json()
            .integer("step", long(step))
            .num("loss", acc.loss)
            .num("step_seconds", acc.seconds)
            .num("idle_fraction",
                 acc.reports ? 1.0 - acc.busy / (acc.reports * std::max(acc.seconds, 1e-9)) : 0.0)
            .num("samples_per_s", sps)
            .num("tokens_per_s", tps)
            .integer("world_size", long(members_.size())));
    steps_.erase(step);
    if (observer_)
      send(observer_, JobProgress{committed_, uint64_t(cfg_.steps), acc.loss, sps, tps, generation_,
                                  members_.size()});
  }

  void on_done(proto::WorkerDone::Reader d) {
    if (finished_ || d.getGeneration() != generation_) return;  // e.g. a drained member's
    checksums_[d.getRank()] = d.getChecksum();
    if (checksums_.size() < members_.size()) return;
    bool identical = true;
    std::string list = "[";
    for (auto& [rank, sum] : checksums_) {
      identical = identical && sum == checksums_.begin()->second;
      list += (list.size() > 1 ? "," : "") + std::string("\"") + fmt::format("{:016x}", sum) + "\"";
    }
    list += "]";
    log_.event("job_finished",
               Json()
                   .integer("steps", long(committed_))
                   .num("loss", last_loss_)
                   .str("state", stopping_ ? "stopped" : "completed")
                   .raw("checksums", list)
                   .boolean("identical_parameters", identical)
                   .num("seconds", std::chrono::duration<double>(Clock::now() - t_start_).count()));
    finish(identical ? 0 : 1, identical ? "" : "members ended with different parameters");
  }

  void on_node_down(const actors::NodeDown& d) {
    if (finished_) return;
    for (auto& a : agents_) {
      if (a.node != d.node || !a.alive) continue;
      a.alive = false;
      log_.event("member_failed", Json()
                                      .integer("member", a.id)
                                      .str("name", a.name)
                                      .str("reason", d.code + ": " + d.reason));
      std::string why = "agent " + std::to_string(a.id) + " (" + a.name + ") was lost: " + d.code +
                        ": " + d.reason;
      if (generation_ == 0) {
        fail(why + " before training started");
        return;
      }
      spdlog::warn("{}", why);
      last_failure_ = why;
      decide_and_act();
      return;
    }
  }

  ControlMessage status() {
    return ControlMessage::build([&](proto::Envelope::Builder e) {
      auto s = e.initBody().initStatus();
      s.setJobName(cfg_.name);
      s.setState(finished_     ? "finished"
                 : stopping_   ? "stopping"
                 : generation_ ? "running"
                               : "starting");
      s.setGeneration(generation_);
      s.setStep(committed_);
      s.setSteps(uint64_t(cfg_.steps));
      s.setLastLoss(last_loss_);
      s.setPlan(plan_);
      auto ms = s.initMembers(unsigned(members_.size()));
      for (unsigned i = 0; i < members_.size(); ++i) {
        const Agent& a = agents_.at(members_[i].agent);
        ms[i].setRank(i);
        ms[i].setAgentId(a.id);
        ms[i].setPid(a.pid);
        ms[i].setHost(a.host);
        ms[i].setDevice(members_[i].device < a.devices.size() ? a.devices[members_[i].device]
                                                              : "?");
      }
    });
  }

  ControlMessage stop() {
    if (!stopping_ && !finished_) {
      stopping_ = true;
      log_.event("stop_requested", Json().integer("step", long(committed_)));
      auto msg = ControlMessage::build(
          [](proto::Envelope::Builder e) { e.initBody().setStopAtNextStep(); });
      for (auto& a : agents_)
        send(bridge_, actors::send_atom::value,
             actors::RemoteAddress{a.node, actors::kAgentActorId}, msg);
    }
    return ack();
  }

  // elastic.min_workers; a fixed number of pipeline stages needs at least that many workers too
  // (below it the job pauses in the same way).
  uint32_t min_workers() const {
    return uint32_t(std::max<int64_t>({1, cfg_.min_workers, cfg_.pipeline_stages}));
  }

  size_t usable_workers() const {
    size_t n = 0;
    for (auto& a : agents_)
      for (uint32_t d = 0; d < a.devices.size(); ++d) n += usable(key_of(a.id, d));
    return n;
  }
  bool is_member(uint32_t agent) const {
    for (auto& m : members_)
      if (m.agent == agent) return true;
    return false;
  }

  // Agents leave at the next step boundary: everyone ends the generation there, the next one is
  // built without them, then they are told to shut down. Nothing is redone. An agent that is not
  // a member (a standby) leaves at once.
  void start_drain(const std::vector<uint32_t>& ids) {
    for (uint32_t id : ids) {
      agents_[id].alive = false;
      log_.event("drain_requested", Json().integer("member", id).integer("step", long(committed_)));
      if (is_member(id))
        draining_.push_back(id);
      else
        shut_down_drained(id, committed_);
    }
    decide_and_act();
  }

  ControlMessage drain(uint32_t id) {
    if (finished_ || generation_ == 0)
      return actors::make_error_reply("refused", "the job is not running");
    if (id >= agents_.size() || !agents_[id].alive) {
      return actors::make_error_reply("invalid_input", "no live agent " + std::to_string(id));
    }
    if (usable_workers() - agents_[id].devices.size() < min_workers()) {
      return actors::make_error_reply(
          "refused", "draining agent " + std::to_string(id) +
                         " would leave fewer workers than the job needs (elastic.min_workers, "
                         "parallel.pipeline_stages)");
    }
    start_drain({id});
    return ack();
  }

  // `troupe scale --workers N`: above the current size the local launcher starts agents (an
  // external launcher's operator starts them with `troupe agent --join`); below it, agents are
  // drained, standbys first, then the newest members.
  ControlMessage scale(uint32_t n) {
    if (finished_ || generation_ == 0)
      return actors::make_error_reply("refused", "the job is not running");
    if (n < min_workers())
      return actors::make_error_reply(
          "invalid_input", std::to_string(n) + " worker(s) is fewer than the job needs: " +
                               std::to_string(min_workers()) +
                               " (elastic.min_workers, parallel.pipeline_stages)");
    if (cfg_.max_workers > 0 && n > uint32_t(cfg_.max_workers))
      return actors::make_error_reply("invalid_input", std::to_string(n) +
                                                           " worker(s) is more than "
                                                           "elastic.max_workers = " +
                                                           std::to_string(cfg_.max_workers));
    const size_t have = usable_workers();
    log_.event(
        "scale_requested",
        Json().integer("workers", n).integer("from", long(have)).integer("step", long(committed_)));
    if (n > have) {
      if (cfg_.launcher != "local")
        return actors::make_error_reply(
            "refused", "cluster.launcher is \"" + cfg_.launcher +
                           "\": add workers with `troupe agent --join` (the job has " +
                           std::to_string(have) + ")");
      const int64_t per = std::max<int64_t>(1, cfg_.devices_per_agent);
      if (observer_) send(observer_, ScaleAgents{(int64_t(n - have) + per - 1) / per});
      return ack();
    }
    // Shrink: standbys first, then members, newest first.
    std::vector<uint32_t> order;
    for (auto it = agents_.rbegin(); it != agents_.rend(); ++it)
      if (it->alive && !is_member(it->id)) order.push_back(it->id);
    for (auto it = agents_.rbegin(); it != agents_.rend(); ++it)
      if (it->alive && is_member(it->id)) order.push_back(it->id);
    std::vector<uint32_t> drain_ids;
    size_t left = have;
    for (uint32_t id : order) {
      if (left <= n) break;
      size_t w = agents_[id].devices.size();
      if (left - w < n) continue;  // would go below the target: try a smaller agent
      drain_ids.push_back(id);
      left -= w;
    }
    if (!drain_ids.empty()) start_drain(drain_ids);
    return ack();
  }

  std::chrono::milliseconds change_deadline() const {
    return std::chrono::milliseconds(2 * cfg_.failure_timeout_ms + 30000);
  }
  // A membership change began (failure, join, drain): the next generation must form in time.
  void change_started() { delayed_send(this, change_deadline(), change_atom::value, generation_); }

  void fail(const std::string& reason) {
    if (finished_) return;
    log_.event("job_failed", Json().str("reason", reason).integer("step", long(committed_)));
    finish(1, reason);
  }

  void finish(int code, const std::string& reason) {
    finished_ = true;
    auto msg = ControlMessage::build([&](proto::Envelope::Builder e) {
      auto s = e.initBody().initShutdown();
      s.setReason(reason.empty() ? "the job is finished" : reason);
      s.setExitCode(code);
    });
    for (auto& a : agents_)
      send(bridge_, actors::send_atom::value, actors::RemoteAddress{a.node, actors::kAgentActorId},
           msg);
    if (observer_) send(observer_, JobFinished{code, reason});
  }

  caf::actor bridge_;
  JobConfig cfg_;
  std::string dir_;
  caf::actor observer_;
  RunLog log_;
  std::vector<Agent> agents_;
  std::vector<Ready> members_;         // the current generation, by rank
  std::map<uint64_t, Ready> pending_;  // addresses for the next generation, by worker key
  std::map<uint64_t, StepAcc> steps_;
  std::map<uint32_t, uint64_t> checksums_;
  uint64_t generation_ = 0, committed_ = 0;
  double last_loss_ = 0;
  bool stopping_ = false, finished_ = false;
  std::vector<uint32_t> draining_;
  std::vector<uint64_t> expected_;     // the next generation's workers, once decided (sorted)
  std::set<uint64_t> failed_workers_;  // threw in this generation; restarting (re-admitted)
  std::set<uint64_t> dead_workers_;    // threw and were not restarted
  bool paused_ = false;
  Clock::time_point paused_since_{};
  uint64_t pause_epoch_ = 0;
  int reforms_ = 0;           // generations broken in a row without a committed step
  std::string plan_;          // the current generation's pipeline layout, as its rank 0 reported it
  std::string last_failure_;  // the last failure, for the message if the job fails
  Clock::time_point t_start_ = Clock::now();
};

}  // namespace

void configure_job_system(caf::actor_system_config& cfg) {
  actors::configure_system(cfg);
  cfg.add_message_type<JobProgress>("troupe_job_progress");
  cfg.add_message_type<JobFinished>("troupe_job_finished");
  cfg.add_message_type<LauncherEvent>("troupe_launcher_event");
  cfg.add_message_type<ScaleAgents>("troupe_scale_agents");
}

caf::actor spawn_coordinator(caf::actor_system& system, caf::actor bridge, const JobConfig& config,
                             const std::string& run_dir, caf::actor observer) {
  auto c = system.spawn<Coordinator, caf::detached>(bridge, config, run_dir, observer);
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
