#include "workers/agent.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <thread>

#include "actors/bridge.h"
#include "actors/restart_intensity.h"
#include "actors/services.h"
#include "comm/ucx_communicator.h"
#include "workers/worker.h"

namespace troupe::workers {
namespace {

using Clock = std::chrono::steady_clock;
using actors::ControlMessage;

struct Member {
  uint32_t rank, agent_id, device;
  std::string address;
  uint64_t applied;                // steps it had applied when it published
  std::vector<uint32_t> held;      // blocks it held as of then
  std::vector<uint32_t> snapshot;  // blocks it held as of the step before
  uint64_t backup_step;
  std::vector<uint32_t> backup;  // stage backups it held, as of backup_step
};

// What the agent actor learns from the coordinator, for the worker threads and main.
struct AgentState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0, start_step = 0;
  uint32_t state_source = 0;
  std::atomic<uint64_t> leave_generation{0};
  std::string job_id, name;                    // for log lines
  std::atomic<uint32_t> agent_id{UINT32_MAX};  // end this generation at the next step boundary
  std::vector<Member> members;
  std::atomic<bool> stop{false};
  bool shutdown = false;
  int exit_code = 0;
  std::string reason;

  void finish(int code, const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (shutdown) return;
    shutdown = true;
    exit_code = code;
    reason = why;
    stop.store(true);
    cv.notify_all();
  }
};

WorkerSpec spec_from(proto::JobSpec::Reader s) {
  WorkerSpec w;
  w.job_name = s.getJobName();
  w.seed = s.getSeed();
  w.steps = s.getSteps();
  w.model.kind = s.getModelKind();
  if (w.model.kind == "mlp") {
    w.model.mlp_sizes = {size_t(s.getInputs())};
    for (int64_t h : s.getHidden()) w.model.mlp_sizes.push_back(size_t(h));
    w.model.mlp_sizes.push_back(size_t(s.getClasses()));
  }
  w.model.layers = size_t(s.getLayers());
  w.model.d_model = size_t(s.getDModel());
  w.model.heads = size_t(s.getHeads());
  w.model.context = size_t(s.getContext());
  w.model.tied_head = s.getTiedHead();
  w.data_kind = s.getDataKind();
  w.data_path = s.getDataPath();
  w.samples = s.getSamples();
  w.global_batch = s.getGlobalBatch();
  w.micro_batch = s.getMicroBatch();
  w.optimizer.kind = s.getOptimizer();
  w.optimizer.lr = s.getLr();
  w.optimizer.momentum = s.getMomentum();
  w.optimizer.weight_decay = s.getWeightDecay();
  w.optimizer.clip_norm = s.getClipNorm();
  w.optimizer.warmup_steps = size_t(s.getWarmupSteps());
  w.optimizer.decay_steps = size_t(s.getDecaySteps());
  w.threads = int(s.getThreadsPerWorker());
  w.failure_timeout_ms = s.getFailureTimeoutMs();
  w.overlap_reduce = s.getOverlapReduce();
  w.pipeline_stages = s.getPipelineStages();
  w.max_params_per_worker = s.getMaxParamsPerWorker();
  w.stage_backup_steps = s.getStageBackupSteps();
  w.recompute_activations = s.getRecomputeActivations();
  return w;
}

std::string host_name() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

std::pair<std::string, std::string> read_token_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot read the token file '" + path + "'");
  std::string job, token;
  in >> job >> token;
  if (job.empty() || token.empty())
    throw std::invalid_argument("the token file '" + path + "' is not 'JOB_ID TOKEN'");
  return {job, token};
}

int run_agent(const AgentOptions& o) {
  caf::actor_system_config cfg;
  actors::configure_system(cfg);
  caf::actor_system system{cfg};
  actors::BridgeConfig bc = actors::job_bridge_config(o.job_id, o.token);
  bc.heartbeat_interval = o.heartbeat_interval;
  bc.failure_timeout = o.failure_timeout;
  auto bridge = actors::spawn_bridge(system, bc);
  caf::scoped_actor self{system};
  auto state = std::make_shared<AgentState>();
  state->job_id = o.job_id;
  const std::string name = o.name.empty() ? host_name() + ":" + std::to_string(getpid()) : o.name;
  state->name = name;

  // The agent actor: the coordinator's pushes.
  auto agent = system.spawn([state](caf::event_based_actor*) -> caf::behavior {
    return {[state](ControlMessage& m) -> ControlMessage {
      auto body = m.envelope().getBody();
      if (body.isGenerationStart()) {
        auto g = body.getGenerationStart();
        std::lock_guard<std::mutex> lock(state->mu);
        state->generation = g.getGeneration();
        state->start_step = g.getStartStep();
        state->state_source = g.getStateSource();
        // Every log line names the job, the agent, the generation and this agent's ranks.
        std::string ranks;
        for (auto mem : g.getMembers())
          if (mem.getAgentId() == state->agent_id)
            ranks += (ranks.empty() ? "" : ",") + std::to_string(mem.getRank());
        spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [job " + state->job_id + "] [" + state->name +
                            "] [gen " + std::to_string(g.getGeneration()) + " rank " +
                            (ranks.empty() ? "-" : ranks) + "] [%l] %v");
        state->members.clear();
        for (auto mem : g.getMembers()) {
          std::vector<uint32_t> held, snap, backup;
          for (uint32_t b : mem.getHeldBlocks()) held.push_back(b);
          for (uint32_t b : mem.getSnapshotBlocks()) snap.push_back(b);
          for (uint32_t b : mem.getBackupBlocks()) backup.push_back(b);
          state->members.push_back({mem.getRank(), mem.getAgentId(), mem.getDevice(),
                                    mem.getAddress(), mem.getAppliedStep(), std::move(held),
                                    std::move(snap), mem.getBackupStep(), std::move(backup)});
        }
        state->cv.notify_all();
      } else if (body.isStopAtNextStep()) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->stop.store(true);
        state->cv.notify_all();
      } else if (body.isLeaveGeneration()) {
        std::lock_guard<std::mutex> lock(state->mu);
        state->leave_generation.store(body.getLeaveGeneration());
        state->cv.notify_all();
      } else if (body.isShutdown()) {
        state->finish(body.getShutdown().getExitCode(), body.getShutdown().getReason());
      }
      return ControlMessage::build([](proto::Envelope::Builder e) { e.initBody().setAck(); });
    }};
  });
  self->send(bridge, actors::register_atom::value, actors::kAgentActorId, agent);

  auto stop_all = [&](int code) {
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(bridge, caf::exit_reason::user_shutdown);
    return code;
  };

  uint64_t coord = 0;
  std::string error;
  self->request(bridge, std::chrono::seconds(30), actors::connect_atom::value, o.join)
      .receive([&](uint64_t n) { coord = n; }, [&](caf::error& e) { error = system.render(e); });
  if (!error.empty()) {
    std::fprintf(stderr, "troupe agent: cannot reach the coordinator at %s: %s\n", o.join.c_str(),
                 error.c_str());
    return stop_all(1);
  }
  self->send(bridge, actors::monitor_atom::value, coord);
  actors::RemoteAddress to_coord{coord, actors::kCoordinatorActorId};

  // Join.
  auto join = ControlMessage::build([&](proto::Envelope::Builder e) {
    auto j = e.initBody().initJoin();
    j.setAgentName(name);
    j.setPid(uint32_t(getpid()));
    j.setHost(host_name());
    auto d = j.initDevices(unsigned(o.devices.size()));
    for (unsigned i = 0; i < o.devices.size(); ++i) d.set(i, o.devices[i]);
  });
  ControlMessage spec_msg;
  self->request(bridge, std::chrono::seconds(35), actors::request_atom::value, to_coord, join,
                uint32_t(30000))
      .receive([&](ControlMessage& r) { spec_msg = r; },
               [&](caf::error& e) { error = system.render(e); });
  if (error.empty() && !spec_msg.envelope().getBody().isJobSpec())
    error = "the coordinator answered without a job spec";
  if (!error.empty()) {
    std::fprintf(stderr, "troupe agent: join refused: %s\n", error.c_str());
    return stop_all(1);
  }
  WorkerSpec spec = spec_from(spec_msg.envelope().getBody().getJobSpec());
  const uint32_t agent_id = spec_msg.envelope().getBody().getJobSpec().getAgentId();
  state->agent_id.store(agent_id);
  const uint64_t first_generation =
      std::max<uint64_t>(1, spec_msg.envelope().getBody().getJobSpec().getFirstGeneration());
  spdlog::info("agent {} joined job '{}' as agent {} with {} device(s)", name, spec.job_name,
               agent_id, o.devices.size());

  // Test-only fault injection (docs/design.md): TROUPE_TEST_THROW_AT_STEP makes device 0's worker
  // of the agent named TROUPE_TEST_THROW_AGENT throw once; TROUPE_TEST_STATE_DELAY_MS slows
  // every state transfer this agent's workers send; TROUPE_TEST_STEP_DELAY_US paces the steps.
  auto env_int = [](const char* n) -> int64_t {
    const char* v = std::getenv(n);
    return v ? std::atoll(v) : 0;
  };
  const char* throw_agent = std::getenv("TROUPE_TEST_THROW_AGENT");
  spec.test_state_delay_ms = env_int("TROUPE_TEST_STATE_DELAY_MS");
  spec.test_step_delay_us = env_int("TROUPE_TEST_STEP_DELAY_US");

  // One worker per device, each on its own thread. A worker follows the generations: for each
  // it publishes a fresh data-plane address with the steps it has applied, waits for the
  // coordinator's member list, takes the state source's state when it lacks it, and trains
  // until the job ends or a member is lost (then on to the next generation). Not a member of a
  // generation (a standby above elastic.max_workers): it publishes again for the next one.
  //
  // The thread is the worker's supervisor: a worker that throws is reported (its communicator
  // aborted first, so the other members hear it at once) and restarted from scratch, at most
  // kWorkerRestarts times a minute; it rejoins in the next generation and takes the state there.
  constexpr int kWorkerRestarts = 3;
  std::vector<std::thread> threads;
  for (uint32_t dev = 0; dev < o.devices.size(); ++dev) {
    threads.emplace_back([&, dev] {
      auto send = [&](ControlMessage m) {
        caf::anon_send(bridge, actors::send_atom::value, to_coord, std::move(m));
      };
      WorkerSpec wspec = spec;
      // Joining a running job: the state comes from the members (take_state), not the seed.
      wspec.init_state = first_generation == 1;
      if (dev == 0 && throw_agent && name == throw_agent)
        wspec.test_throw_at_step = uint64_t(env_int("TROUPE_TEST_THROW_AT_STEP"));
      actors::RestartIntensity intensity(kWorkerRestarts, std::chrono::minutes(1));
      comm::UcxCommOptions co;
      co.timeout = std::chrono::milliseconds(spec.failure_timeout_ms);
      std::unique_ptr<Worker> worker;
      uint64_t want = first_generation;
      std::string last_error;  // why the previous generation ended for this worker, if it broke
      while (true) {
        int rank = -1;
        uint64_t gen = 0;
        std::unique_ptr<comm::UcxCommunicator> comm;
        try {
          if (!worker) {
            auto t0 = Clock::now();
            worker = std::make_unique<Worker>(wspec);
            spdlog::info("worker {} built in {:.3f} s", dev,
                         std::chrono::duration<double>(Clock::now() - t0).count());
          }
          for (;; ++want) {
            comm = std::make_unique<comm::UcxCommunicator>(want, co);
            send(ControlMessage::build([&](proto::Envelope::Builder e) {
              auto w = e.initBody().initWorkerReady();
              w.setAgentId(agent_id);
              w.setDevice(dev);
              w.setAddress(comm->address());
              w.setGeneration(want);
              w.setAppliedStep(worker->next_step());
              w.setLastError(last_error);
              auto held = worker->held_blocks();
              auto h = w.initHeldBlocks(unsigned(held.size()));
              for (unsigned i = 0; i < held.size(); ++i) h.set(i, held[i]);
              auto snap = worker->snapshot_blocks();
              auto sb = w.initSnapshotBlocks(unsigned(snap.size()));
              for (unsigned i = 0; i < snap.size(); ++i) sb.set(i, snap[i]);
              w.setNumBlocks(worker->num_blocks());
              auto backup = worker->backup_blocks();
              auto bb = w.initBackupBlocks(unsigned(backup.size()));
              for (unsigned i = 0; i < backup.size(); ++i) bb.set(i, backup[i]);
              w.setBackupStep(worker->backup_step());
            }));
            last_error.clear();
            std::vector<Member> members;
            uint64_t start = 0;
            uint32_t source = 0;
            {
              // No deadline of its own: the job may pause (below elastic.min_workers) for as
              // long as the coordinator allows; the coordinator's loss ends the wait (shutdown).
              std::unique_lock<std::mutex> lock(state->mu);
              state->cv.wait(lock, [&] { return state->generation >= want || state->shutdown; });
              if (state->shutdown) return;
              members = state->members;
              gen = state->generation;
              start = state->start_step;
              source = state->state_source;
            }
            std::vector<std::string> addresses(members.size());
            std::vector<MemberState> held(members.size());
            rank = -1;
            for (auto& m : members) {
              addresses[m.rank] = m.address;
              held[m.rank] = MemberState{m.applied, m.held, m.snapshot, m.backup_step, m.backup};
              if (m.agent_id == agent_id && m.device == dev) rank = int(m.rank);
            }
            if (rank < 0 || gen != want) {
              // A standby, or a newer generation formed already: publish for the next one.
              if (rank < 0 && gen == want)
                spdlog::info("worker {}: standby in generation {}", dev, gen);
              want = gen;
              continue;
            }
            try {
              comm->connect(
                  rank, addresses,
                  std::chrono::milliseconds(std::max<int64_t>(10000, spec.failure_timeout_ms)));
              if (!comm->shared_memory_allreduce() && members.size() > 1)
                spdlog::info("worker {}: allreduce over UCX messages, not shared memory: {}", dev,
                             comm->shared_memory_fallback_reason());
              auto t = worker->take_state(*comm, start, held);
              std::string plan;
              if (spec.pipeline_stages != 1)
                plan = Worker::describe(worker->plan_for(uint32_t(members.size())));
              if (t.needed || (rank == 0 && !plan.empty()))
                send(ControlMessage::build([&](proto::Envelope::Builder e) {
                  auto r = e.initBody().initStateReceived();
                  r.setGeneration(gen);
                  r.setRank(uint32_t(rank));
                  r.setSourceRank(source);
                  r.setBytes(t.bytes);
                  r.setSeconds(t.seconds);
                  r.setNeeded(t.needed);
                  r.setBlocks(t.blocks);
                  r.setPlan(plan);
                }));
              auto result = worker->run(
                  *comm, start,
                  [&](const StepInfo& s) {
                    send(ControlMessage::build([&](proto::Envelope::Builder e) {
                      auto r = e.initBody().initStepReport();
                      r.setGeneration(gen);
                      r.setStep(s.step);
                      r.setRank(uint32_t(rank));
                      r.setLoss(s.loss);
                      r.setSamples(s.samples);
                      r.setTokens(s.tokens);
                      r.setPositionBegin(s.position_begin);
                      r.setPositionEnd(s.position_end);
                      r.setSeconds(s.seconds);
                      r.setBusySeconds(s.busy_seconds);
                    }));
                  },
                  [&] { return state->stop.load() || state->leave_generation.load() == gen; });
              // The step's vote said stop: another member's agent may have heard why (stop or
              // a membership change) before this one did. Wait for the reason before acting.
              if (result.stopped) {
                std::unique_lock<std::mutex> lock(state->mu);
                state->cv.wait_for(
                    lock, std::chrono::milliseconds(spec.failure_timeout_ms + 5000), [&] {
                      return state->stop.load() || state->leave_generation.load() == gen ||
                             state->shutdown;
                    });
              }
              if (state->shutdown) return;  // drained, or the job ended without it
              if (result.stopped && !state->stop.load() && state->leave_generation.load() == gen) {
                continue;  // the membership changes: on to the next generation
              }
              send(ControlMessage::build([&](proto::Envelope::Builder e) {
                auto d = e.initBody().initWorkerDone();
                d.setRank(uint32_t(rank));
                d.setGeneration(gen);
                d.setSteps(result.next_step);
                d.setChecksum(worker->checksum());
              }));
              return;
            } catch (const comm::Error& e) {
              if (state->shutdown) return;
              spdlog::warn(
                  "worker {} (rank {}, generation {}): {}; waiting for the next generation", dev,
                  rank, gen, e.what());
              last_error = e.what();
              // The broken communicator goes; the loop publishes for the next generation.
            }
          }
        } catch (const std::exception& ex) {
          if (state->shutdown) return;
          // Tell the other members now (they would otherwise wait out the failure timeout).
          if (comm) {
            comm->abort();
            try {
              comm->barrier();
            } catch (const std::exception&) {
            }
          }
          // A lost block (a stage without a replica) cannot be repaired by a restart.
          const bool fatal = dynamic_cast<const StateLost*>(&ex) != nullptr;
          const bool restart = !fatal && worker && intensity.allow_restart(Clock::now());
          spdlog::error("worker {} (rank {}) failed: {}{}", dev, rank, ex.what(),
                        restart ? "; restarting it" : "");
          send(ControlMessage::build([&](proto::Envelope::Builder e) {
            auto f = e.initBody().initWorkerFailed();
            f.setRank(rank < 0 ? dev : uint32_t(rank));
            f.setReason(ex.what());
            f.setAgentId(agent_id);
            f.setDevice(dev);
            f.setGeneration(gen);
            f.setRestarting(restart);
            f.setFatal(fatal);
          }));
          if (!restart) return;
          worker.reset();
          wspec.test_throw_at_step = 0;  // an injected fault happens once
          wspec.init_state = false;      // the restarted worker takes the members' state
          std::lock_guard<std::mutex> lock(state->mu);
          want = state->generation + 1;
        }
      }
    });
  }

  // Wait for the coordinator's shutdown, or its loss.
  while (true) {
    {
      std::lock_guard<std::mutex> lock(state->mu);
      if (state->shutdown) break;
    }
    self->receive(
        [&](actors::NodeDown& d) {
          if (d.node == coord)
            state->finish(1, "the coordinator was lost (" + d.code + ": " + d.reason + ")");
        },
        caf::after(std::chrono::milliseconds(100)) >> [] {});
  }
  for (auto& t : threads) t.join();
  int code = state->exit_code;
  if (code != 0) std::fprintf(stderr, "troupe agent: %s\n", state->reason.c_str());
  return stop_all(code);
}

}  // namespace troupe::workers
