// The one place where the job protocol's C++ values (job_protocol.h) meet their Cap'n Proto
// bodies (comm/control.capnp).
#include <algorithm>
#include <utility>

#include "actors/job_protocol.h"

namespace troupe::actors {
namespace {

using Env = proto::Envelope::Builder;

template <typename List, typename T>
void set_list(List list, const std::vector<T>& v) {
  for (unsigned i = 0; i < v.size(); ++i) list.set(i, v[i]);
}

template <typename T, typename Reader>
std::vector<T> list_of(Reader r) {
  std::vector<T> out;
  out.reserve(r.size());
  for (auto x : r) out.push_back(T(x));
  return out;
}

// The holding of a WorkerReady or a Member (the same fields in both).
template <typename Builder>
void set_holding(Builder b, const elastic::Holding& h) {
  b.setAppliedStep(h.applied);
  set_list(b.initHeldBlocks(unsigned(h.held.size())), h.held);
  set_list(b.initSnapshotBlocks(unsigned(h.snapshot.size())), h.snapshot);
  set_list(b.initBackupBlocks(unsigned(h.backup.size())), h.backup);
  b.setBackupStep(h.backup_step);
}

template <typename Reader>
elastic::Holding holding_of(Reader r) {
  elastic::Holding h;
  h.applied = r.getAppliedStep();
  h.held = list_of<uint32_t>(r.getHeldBlocks());
  h.snapshot = list_of<uint32_t>(r.getSnapshotBlocks());
  h.backup = list_of<uint32_t>(r.getBackupBlocks());
  h.backup_step = r.getBackupStep();
  return h;
}

}  // namespace

ControlMessage encode(const Join& m) {
  return ControlMessage::build([&](Env e) {
    auto j = e.initBody().initJoin();
    j.setAgentName(m.agent_name);
    j.setPid(m.pid);
    j.setHost(m.host);
    auto d = j.initDevices(unsigned(m.devices.size()));
    for (unsigned i = 0; i < m.devices.size(); ++i) d.set(i, m.devices[i]);
    j.setRejoin(m.rejoin);
    j.setProtocol(m.protocol);
    j.setHostIdentity(m.host_identity);
    auto k = j.initKinds(unsigned(m.kinds.size()));
    for (unsigned i = 0; i < m.kinds.size(); ++i) k.set(i, m.kinds[i]);
  });
}

Join decode(proto::Join::Reader r) {
  Join m{r.getAgentName(), r.getHost(),     r.getPid(),          {},
         r.getRejoin(),    r.getProtocol(), r.getHostIdentity(), {}};
  for (auto d : r.getDevices()) m.devices.push_back(d);
  for (auto k : r.getKinds()) m.kinds.push_back(k);
  return m;
}

std::string protocol_refusal(const Join& j) {
  if (j.protocol == kProtocol) return "";
  return "agent '" + j.agent_name + "' speaks control protocol " +
         (j.protocol == 0 ? std::string("0 (a Troupe older than its revisions)")
                          : std::to_string(j.protocol)) +
         ", this coordinator " + std::to_string(kProtocol) +
         ": run one Troupe build for the coordinator and every agent (troupe version)";
}

std::vector<std::string> builtin_kinds() {
  return {"model:mlp", "model:gpt", "data:synthetic", "data:text", "data:tokens"};
}

// (Said as the agent prints it: "troupe agent: join refused: ...". The agent checks its JobSpec
// too, for a coordinator that did not check.)
std::string kind_refusal(const Join& j, const std::string& model_kind,
                         const std::string& data_kind) {
  if (j.kinds.empty()) return "";
  auto has = [&](const std::string& kind) {
    return std::find(j.kinds.begin(), j.kinds.end(), kind) != j.kinds.end();
  };
  const bool loop = has("model:external");
  if (model_kind == "external" && !loop)
    return "the job's model.kind = \"external\": its members run their own training loop "
           "(troupe::ElasticLoop, workers/elastic_loop.h); troupe agent cannot train it";
  if (model_kind != "external" && loop)
    return "the job trains model.kind = \"" + model_kind +
           "\": a loop of its own joins a job of model.kind = \"external\"";
  const std::pair<std::string, std::string> wanted[] = {{"model", model_kind}, {"data", data_kind}};
  for (const auto& [table, kind] : wanted)
    if (!has(table + ":" + kind))
      return "the job's " + table + ".kind = \"" + kind +
             "\" is not a kind this program has: run the agents from the program that added it "
             "(its troupe::main)";
  return "";
}

namespace {

void set_options(capnp::List<proto::Option>::Builder out, const JobSpec::Options& in) {
  unsigned i = 0;
  for (const auto& [name, value] : in) {
    auto o = out[i++];
    o.setName(name);
    auto v = o.initValue();
    if (auto* x = std::get_if<int64_t>(&value)) v.setInteger(*x);
    if (auto* x = std::get_if<double>(&value)) v.setNumber(*x);
    if (auto* x = std::get_if<bool>(&value)) v.setBoolean(*x);
    if (auto* x = std::get_if<std::string>(&value)) v.setText(*x);
  }
}

JobSpec::Options options_of(capnp::List<proto::Option>::Reader in) {
  JobSpec::Options out;
  for (auto o : in) {
    auto v = o.getValue();
    auto& value = out[o.getName()];
    switch (v.which()) {
      case proto::Option::Value::INTEGER:
        value = v.getInteger();
        break;
      case proto::Option::Value::NUMBER:
        value = v.getNumber();
        break;
      case proto::Option::Value::BOOLEAN:
        value = v.getBoolean();
        break;
      case proto::Option::Value::TEXT:
        value = std::string(v.getText());
        break;
    }
  }
  return out;
}

}  // namespace

ControlMessage encode(const JobSpec& m) {
  return ControlMessage::build([&](Env e) {
    auto s = e.initBody().initJobSpec();
    s.setAgentId(m.agent_id);
    s.setFirstGeneration(m.first_generation);
    s.setJobName(m.job_name);
    s.setSeed(m.seed);
    s.setSteps(m.steps);
    s.setModelKind(m.model_kind);
    set_list(s.initHidden(unsigned(m.hidden.size())), m.hidden);
    s.setInputs(m.inputs);
    s.setClasses(m.classes);
    s.setLayers(m.layers);
    s.setDModel(m.d_model);
    s.setHeads(m.heads);
    s.setContext(m.context);
    s.setTiedHead(m.tied_head);
    s.setDtype(m.dtype);
    s.setBackend(m.backend);
    s.setReduceDtype(m.reduce_dtype);
    set_list(s.initBlockParams(unsigned(m.block_params.size())), m.block_params);
    s.setDataKind(m.data_kind);
    s.setDataPath(m.data_path);
    auto mix = s.initDataMix(unsigned(m.data_mix.size()));
    for (unsigned i = 0; i < m.data_mix.size(); ++i) mix.set(i, m.data_mix[i].c_str());
    set_list(s.initDataMixWeights(unsigned(m.data_mix_weights.size())), m.data_mix_weights);
    s.setEvalEvery(m.eval_every);
    s.setEvalPath(m.eval_path);
    s.setEvalFraction(m.eval_fraction);
    set_options(s.initModelOptions(unsigned(m.model_options.size())), m.model_options);
    set_options(s.initDataOptions(unsigned(m.data_options.size())), m.data_options);
    s.setSamples(m.samples);
    s.setGlobalBatch(m.global_batch);
    s.setMicroBatch(m.micro_batch);
    s.setOptimizer(m.optimizer);
    s.setLr(m.lr);
    s.setMomentum(m.momentum);
    s.setWeightDecay(m.weight_decay);
    s.setClipNorm(m.clip_norm);
    s.setWarmupSteps(m.warmup_steps);
    s.setDecaySteps(m.decay_steps);
    s.setThreadsPerWorker(m.threads_per_worker);
    s.setOverlapReduce(m.overlap_reduce);
    s.setPipelineStages(m.pipeline_stages);
    s.setMaxParamsPerWorker(m.max_params_per_worker);
    s.setStageBackupSteps(m.stage_backup_steps);
    s.setRecomputeActivations(m.recompute_activations);
    s.setDeterministic(m.deterministic);
    s.setCheckpointDir(m.checkpoint_dir);
    s.setCheckpointEvery(m.checkpoint_every);
    s.setCheckpointSkipIfBusy(m.checkpoint_skip_if_busy);
    s.setResumeDir(m.resume_dir);
    s.setResumeStep(m.resume_step);
    s.setTraceFirst(m.trace_first);
    s.setPeakTflops(m.peak_tflops);
    s.setLogLevel(m.log_level);
    s.setTraceLast(m.trace_last);
    s.setFailureTimeoutMs(m.failure_timeout_ms);
    s.setHeartbeatIntervalMs(m.heartbeat_interval_ms);
    s.setWorkerMaxRestarts(m.worker_max_restarts);
    s.setWorkerRestartWindowMs(m.worker_restart_window_ms);
    s.setRejoinTimeoutMs(m.rejoin_timeout_ms);
    s.setInitState(m.init_state);
  });
}

JobSpec decode(proto::JobSpec::Reader s) {
  JobSpec m;
  m.agent_id = s.getAgentId();
  m.first_generation = std::max<uint64_t>(1, s.getFirstGeneration());
  m.job_name = s.getJobName();
  m.seed = s.getSeed();
  m.steps = s.getSteps();
  m.model_kind = s.getModelKind();
  m.hidden = list_of<int64_t>(s.getHidden());
  m.inputs = s.getInputs();
  m.classes = s.getClasses();
  m.layers = s.getLayers();
  m.d_model = s.getDModel();
  m.heads = s.getHeads();
  m.context = s.getContext();
  m.tied_head = s.getTiedHead();
  m.dtype = s.getDtype();
  m.backend = s.getBackend();
  m.reduce_dtype = s.getReduceDtype();
  m.block_params = list_of<uint64_t>(s.getBlockParams());
  m.data_kind = s.getDataKind();
  m.data_path = s.getDataPath();
  for (auto p : s.getDataMix()) m.data_mix.emplace_back(p.cStr());
  m.data_mix_weights = list_of<double>(s.getDataMixWeights());
  m.eval_every = s.getEvalEvery();
  m.eval_path = s.getEvalPath();
  m.eval_fraction = s.getEvalFraction();
  m.model_options = options_of(s.getModelOptions());
  m.data_options = options_of(s.getDataOptions());
  m.samples = s.getSamples();
  m.global_batch = s.getGlobalBatch();
  m.micro_batch = s.getMicroBatch();
  m.optimizer = s.getOptimizer();
  m.lr = s.getLr();
  m.momentum = s.getMomentum();
  m.weight_decay = s.getWeightDecay();
  m.clip_norm = s.getClipNorm();
  m.warmup_steps = s.getWarmupSteps();
  m.decay_steps = s.getDecaySteps();
  m.threads_per_worker = s.getThreadsPerWorker();
  m.overlap_reduce = s.getOverlapReduce();
  m.pipeline_stages = s.getPipelineStages();
  m.max_params_per_worker = s.getMaxParamsPerWorker();
  m.stage_backup_steps = s.getStageBackupSteps();
  m.recompute_activations = s.getRecomputeActivations();
  m.deterministic = s.getDeterministic();
  m.checkpoint_dir = s.getCheckpointDir();
  m.checkpoint_every = s.getCheckpointEvery();
  m.checkpoint_skip_if_busy = s.getCheckpointSkipIfBusy();
  m.resume_dir = s.getResumeDir();
  m.resume_step = s.getResumeStep();
  m.trace_first = s.getTraceFirst();
  m.peak_tflops = s.getPeakTflops();
  m.log_level = s.getLogLevel();
  m.trace_last = s.getTraceLast();
  m.failure_timeout_ms = s.getFailureTimeoutMs();
  m.heartbeat_interval_ms = s.getHeartbeatIntervalMs();
  m.worker_max_restarts = s.getWorkerMaxRestarts();
  m.worker_restart_window_ms = s.getWorkerRestartWindowMs();
  m.rejoin_timeout_ms = s.getRejoinTimeoutMs();
  m.init_state = s.getInitState();
  return m;
}

ControlMessage encode(const WorkerReady& m) {
  return ControlMessage::build([&](Env e) {
    auto w = e.initBody().initWorkerReady();
    w.setAgentId(m.worker.agent);
    w.setDevice(m.worker.device);
    w.setGeneration(m.generation);
    w.setAddress(m.address);
    set_holding(w, m.holding);
    w.setNumBlocks(m.num_blocks);
    w.setLastError(m.last_error);
    set_list(w.initBlockParams(unsigned(m.block_params.size())), m.block_params);
  });
}

WorkerReady decode(proto::WorkerReady::Reader r) {
  return {{r.getAgentId(), r.getDevice()},
          r.getGeneration(),
          r.getAddress(),
          holding_of(r),
          r.getNumBlocks(),
          r.getLastError(),
          list_of<uint64_t>(r.getBlockParams())};
}

ControlMessage encode(const GenerationStart& m) {
  return ControlMessage::build([&](Env e) {
    auto g = e.initBody().initGenerationStart();
    g.setGeneration(m.generation);
    g.setStartStep(m.start_step);
    g.setStateSource(m.state_source);
    g.setLr(m.lr);
    g.setReload(m.reload);
    g.setCheckpoint(m.checkpoint);
    auto changes = g.initLrChanges(unsigned(m.lr_changes.size()));
    unsigned at = 0;
    for (const auto& [step, lr] : m.lr_changes) {
      changes[at].setStep(step);
      changes[at++].setLr(lr);
    }
    auto ms = g.initMembers(unsigned(m.members.size()));
    for (unsigned i = 0; i < m.members.size(); ++i) {
      const GenerationMember& x = m.members[i];
      ms[i].setRank(x.rank);
      ms[i].setAgentId(x.worker.agent);
      ms[i].setDevice(x.worker.device);
      ms[i].setAddress(x.address);
      set_holding(ms[i], x.holding);
    }
  });
}

GenerationStart decode(proto::GenerationStart::Reader r) {
  GenerationStart m{r.getGeneration(), r.getStartStep(), r.getStateSource(), {},
                    r.getLr(),         r.getReload(),    r.getCheckpoint(),  {}};
  for (auto x : r.getMembers())
    m.members.push_back(
        {x.getRank(), {x.getAgentId(), x.getDevice()}, x.getAddress(), holding_of(x)});
  for (auto c : r.getLrChanges()) m.lr_changes[c.getStep()] = c.getLr();
  return m;
}

ControlMessage encode(const StepReport& m) {
  return ControlMessage::build([&](Env e) {
    auto r = e.initBody().initStepReport();
    r.setGeneration(m.generation);
    r.setStep(m.step);
    r.setRank(m.rank);
    r.setLoss(m.loss);
    r.setSamples(m.samples);
    r.setTokens(m.tokens);
    r.setPositionBegin(m.position_begin);
    r.setPositionEnd(m.position_end);
    r.setSeconds(m.seconds);
    r.setBusySeconds(m.busy_seconds);
    r.setDataSeconds(m.data_seconds);
    r.setEvalLoss(m.eval_loss);
    r.setEvalTokens(m.eval_tokens);
    r.setFlops(m.flops);
    r.setPeakFlops(m.peak_flops);
    r.setPeakSource(m.peak_source);
    r.setEpochSamples(m.epoch_samples);
  });
}

StepReport decode(proto::StepReport::Reader r) {
  return {r.getGeneration(),  r.getStep(),        r.getRank(),          r.getLoss(),
          r.getSamples(),     r.getTokens(),      r.getPositionBegin(), r.getPositionEnd(),
          r.getSeconds(),     r.getBusySeconds(), r.getDataSeconds(),   r.getEvalLoss(),
          r.getEvalTokens(),  r.getFlops(),       r.getPeakFlops(),     r.getPeakSource(),
          r.getEpochSamples()};
}

ControlMessage encode(const StateReceived& m) {
  return ControlMessage::build([&](Env e) {
    auto r = e.initBody().initStateReceived();
    r.setGeneration(m.generation);
    r.setRank(m.rank);
    r.setSourceRank(m.source_rank);
    r.setBytes(m.bytes);
    r.setSeconds(m.seconds);
    r.setNeeded(m.needed);
    r.setBlocks(m.blocks);
    r.setPlan(m.plan);
    r.setDataPlane(m.data_plane);
  });
}

StateReceived decode(proto::StateReceived::Reader r) {
  return {r.getGeneration(), r.getRank(),   r.getSourceRank(), r.getBytes(),    r.getSeconds(),
          r.getNeeded(),     r.getBlocks(), r.getPlan(),       r.getDataPlane()};
}

ControlMessage encode(const WorkerDone& m) {
  return ControlMessage::build([&](Env e) {
    auto d = e.initBody().initWorkerDone();
    d.setRank(m.rank);
    d.setGeneration(m.generation);
    d.setSteps(m.steps);
    d.setChecksum(m.checksum);
    d.setGroup(m.group);
    d.setEvalLoss(m.eval_loss);
    d.setEvalTokens(m.eval_tokens);
  });
}

WorkerDone decode(proto::WorkerDone::Reader r) {
  return {r.getRank(),  r.getGeneration(), r.getSteps(),     r.getChecksum(),
          r.getGroup(), r.getEvalLoss(),   r.getEvalTokens()};
}

ControlMessage encode(const CheckpointWritten& m) {
  return ControlMessage::build([&](Env e) {
    auto c = e.initBody().initCheckpointWritten();
    c.setGeneration(m.generation);
    c.setRank(m.rank);
    c.setStep(m.step);
    c.setBlocks(m.blocks);
    c.setDirectory(m.directory);
    auto shards = c.initShards(unsigned(m.shards.size()));
    for (unsigned i = 0; i < m.shards.size(); ++i) {
      shards[i].setBlock(m.shards[i].block);
      shards[i].setFile(m.shards[i].file);
      shards[i].setBytes(m.shards[i].bytes);
      shards[i].setChecksum(m.shards[i].checksum);
    }
    c.setBlockingSeconds(m.blocking_seconds);
    c.setWriteSeconds(m.write_seconds);
    c.setError(m.error);
  });
}

CheckpointWritten decode(proto::CheckpointWritten::Reader r) {
  CheckpointWritten m{r.getGeneration(),      r.getRank(),         r.getStep(),
                      r.getBlocks(),          r.getDirectory(),    {},
                      r.getBlockingSeconds(), r.getWriteSeconds(), r.getError()};
  for (auto s : r.getShards())
    m.shards.push_back({s.getBlock(), s.getFile(), s.getBytes(), s.getChecksum()});
  return m;
}

ControlMessage encode(const WorkerFailed& m) {
  return ControlMessage::build([&](Env e) {
    auto f = e.initBody().initWorkerFailed();
    f.setAgentId(m.worker.agent);
    f.setDevice(m.worker.device);
    f.setRank(m.rank);
    f.setGeneration(m.generation);
    f.setReason(m.reason);
    f.setRestarting(m.restarting);
    f.setFatal(m.fatal);
  });
}

WorkerFailed decode(proto::WorkerFailed::Reader r) {
  return {{r.getAgentId(), r.getDevice()},
          r.getRank(),
          r.getGeneration(),
          r.getReason(),
          r.getRestarting(),
          r.getFatal()};
}

ControlMessage encode(const Shutdown& m) {
  return ControlMessage::build([&](Env e) {
    auto s = e.initBody().initShutdown();
    s.setReason(m.reason);
    s.setExitCode(m.exit_code);
  });
}

Shutdown decode(proto::Shutdown::Reader r) { return {r.getReason(), r.getExitCode()}; }

namespace {

template <typename List>
void set_members(List list, const std::vector<MemberStatus>& v) {
  for (unsigned i = 0; i < v.size(); ++i) {
    list[i].setRank(v[i].rank);
    list[i].setAgentId(v[i].agent);
    list[i].setPid(v[i].pid);
    list[i].setHost(v[i].host);
    list[i].setDevice(v[i].device);
    list[i].setName(v[i].name);
    list[i].setStage(v[i].stage);
    list[i].setStepSeconds(v[i].step_seconds);
    list[i].setComputeSeconds(v[i].compute_seconds);
    list[i].setLastReportMs(v[i].last_report_ms);
    list[i].setDataSeconds(v[i].data_seconds);
    list[i].setLastHeardMs(v[i].last_heard_ms);
    list[i].setState(v[i].state);
  }
}

template <typename Reader>
std::vector<MemberStatus> members_of(Reader r) {
  std::vector<MemberStatus> out;
  for (auto x : r)
    out.push_back({x.getRank(), x.getAgentId(), x.getPid(), x.getHost(), x.getDevice(), x.getName(),
                   x.getStage(), x.getStepSeconds(), x.getComputeSeconds(), x.getLastReportMs(),
                   x.getDataSeconds(), x.getLastHeardMs(), x.getState()});
  return out;
}

}  // namespace

ControlMessage encode(const JobStatus& m) {
  return ControlMessage::build([&](Env e) {
    auto s = e.initBody().initStatus();
    s.setJobName(m.job_name);
    s.setState(m.state);
    s.setGeneration(m.generation);
    s.setStep(m.step);
    s.setSteps(m.steps);
    s.setLastLoss(m.last_loss);
    s.setPlan(m.plan);
    set_members(s.initMembers(unsigned(m.members.size())), m.members);
    set_members(s.initStandbys(unsigned(m.standbys.size())), m.standbys);
    s.setCheckpointStep(m.checkpoint_step);
    s.setCheckpointPath(m.checkpoint_path);
    s.setModelTflops(m.model_tflops);
    s.setMfu(m.mfu);
    s.setPeak(m.peak);
    s.setDataPlane(m.data_plane);
    s.setEpoch(m.epoch);
  });
}

JobStatus decode(proto::JobStatus::Reader r) {
  return {r.getJobName(),
          r.getState(),
          r.getPlan(),
          r.getGeneration(),
          r.getStep(),
          r.getSteps(),
          r.getLastLoss(),
          members_of(r.getMembers()),
          members_of(r.getStandbys()),
          r.getCheckpointStep(),
          r.getCheckpointPath(),
          r.getModelTflops(),
          r.getMfu(),
          r.getPeak(),
          r.getDataPlane(),
          r.getEpoch()};
}

ControlMessage encode(const LeaveGeneration& m) {
  return ControlMessage::build([&](Env e) { e.initBody().setLeaveGeneration(m.generation); });
}

ControlMessage encode(const AbandonGeneration& m) {
  return ControlMessage::build([&](Env e) { e.initBody().setAbandonGeneration(m.generation); });
}

ControlMessage encode(const TraceChunk& m) {
  return ControlMessage::build([&](Env e) {
    auto c = e.initBody().initTraceChunk();
    c.setAgentId(m.agent);
    c.setDevice(m.device);
    c.setRank(m.rank);
    auto list = c.initEvents(unsigned(m.events.size()));
    for (unsigned i = 0; i < m.events.size(); ++i) {
      const TraceEvent& t = m.events[i];
      list[i].setName(t.name);
      list[i].setCategory(t.category);
      list[i].setTsUs(t.ts_us);
      list[i].setDurUs(t.dur_us);
      list[i].setThread(t.thread);
      list[i].setStep(t.step);
    }
  });
}

TraceChunk decode(proto::TraceChunk::Reader r) {
  TraceChunk c{r.getAgentId(), r.getDevice(), r.getRank(), {}};
  for (auto t : r.getEvents())
    c.events.push_back(
        {t.getName(), t.getCategory(), t.getTsUs(), t.getDurUs(), t.getThread(), t.getStep()});
  return c;
}

ControlMessage make_ack() {
  return ControlMessage::build([](Env e) { e.initBody().setAck(); });
}
ControlMessage make_accepted(const std::string& what) {
  return ControlMessage::build([&](Env e) { e.initBody().setAccepted(what); });
}
ControlMessage make_stop_at_next_step(bool with_checkpoint) {
  return ControlMessage::build([with_checkpoint](Env e) {
    if (with_checkpoint)
      e.initBody().setStopWithCheckpoint();
    else
      e.initBody().setStopAtNextStep();
  });
}
ControlMessage make_status_request() {
  return ControlMessage::build([](Env e) { e.initBody().setStatusRequest(); });
}
ControlMessage make_stop_request() {
  return ControlMessage::build([](Env e) { e.initBody().setStopRequest(); });
}
ControlMessage make_drain_request(uint32_t agent) {
  return ControlMessage::build([&](Env e) { e.initBody().setDrainRequest(agent); });
}
ControlMessage make_checkpoint_request(bool stop) {
  return ControlMessage::build([&](Env e) { e.initBody().initCheckpointRequest().setStop(stop); });
}
ControlMessage make_learning_rate_request(double lr) {
  return ControlMessage::build([&](Env e) { e.initBody().setLearningRateRequest(lr); });
}
ControlMessage make_checkpoint_at_step(uint64_t step) {
  return ControlMessage::build([&](Env e) { e.initBody().setCheckpointAtStep(step); });
}
ControlMessage make_scale_request(uint32_t workers) {
  return ControlMessage::build([&](Env e) { e.initBody().setScaleRequest(workers); });
}

}  // namespace troupe::actors
