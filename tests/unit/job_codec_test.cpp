// The job protocol's codec: every message survives encode -> decode with every field, lists
// included (holdings with held, snapshot and backup blocks; generation members; status rows).
#include <gtest/gtest.h>

#include <algorithm>

#include "actors/job_protocol.h"
#include "coordinator/config.h"

namespace troupe::actors {
namespace {

proto::Envelope::Body::Reader body(const ControlMessage& m) { return m.envelope().getBody(); }

elastic::Holding holding() {
  elastic::Holding h;
  h.applied = 41;
  h.held = {0, 1, 2};
  h.snapshot = {1};
  h.backup_step = 40;
  h.backup = {3, 4};
  return h;
}

// A program that cannot train the job's kinds is refused at its join, saying what it lacks (it
// joined, and its workers' failure failed the job); one that did not say (older) is not.
TEST(JobCodec, AJoinOfAProgramWithoutTheJobsKindsIsRefused) {
  Join agent{"a",   "h",       1,  {"cpu:0"},
             false, kProtocol, "", {"model:mlp", "model:gpt", "data:synthetic", "data:text"}};
  EXPECT_EQ(kind_refusal(agent, "gpt", "text"), "");
  EXPECT_EQ(kind_refusal(agent, "convnet", "text"),
            "the job's model.kind = \"convnet\" is not a kind this program has: run the agents "
            "from the program that added it (its troupe::main)");
  EXPECT_EQ(kind_refusal(agent, "mlp", "stripes").find("the job's data.kind = \"stripes\" is not"),
            0u);
  EXPECT_EQ(kind_refusal(agent, "external", "external")
                .find("the job's model.kind = \"external\""
                      ": its members run their own"),
            0u);
  Join loop = agent;
  loop.kinds = {"model:external", "data:external"};
  EXPECT_EQ(kind_refusal(loop, "external", "external"), "");
  EXPECT_EQ(kind_refusal(loop, "mlp", "synthetic"),
            "the job trains model.kind = \"mlp\": a loop of its own joins a job of model.kind = "
            "\"external\"");
  Join older = agent;
  older.kinds.clear();
  EXPECT_EQ(kind_refusal(older, "convnet", "stripes"), "");
}

// Every built-in kind a config accepts is one that agents say they train (a kind added to the
// config alone: every troupe agent refused at its join for a job of it).
TEST(JobCodec, AgentsSayEveryBuiltInKindAConfigAccepts) {
  const std::vector<std::string> said = builtin_kinds();
  for (const std::string table : {"model", "data"}) {
    std::string choices;
    try {
      coordinator::parse_config("[" + table + "]\nkind = \"nope\"\n", "job.toml");
    } catch (const coordinator::ConfigError& e) {
      choices = e.what();
    }
    const std::string from = "is not one of: ";
    ASSERT_NE(choices.find(from), std::string::npos) << choices;
    choices = choices.substr(choices.find(from) + from.size());
    choices = choices.substr(0, choices.find(" ("));
    int kinds = 0;
    for (size_t at = 0; at < choices.size(); ++kinds) {
      const size_t end = std::min(choices.find(", ", at), choices.size());
      const std::string kind = choices.substr(at, end - at);
      at = end + 2;
      if (kind == "external") continue;  // (a loop of its own: troupe agent does not train it)
      EXPECT_NE(std::find(said.begin(), said.end(), table + ":" + kind), said.end()) << kind;
    }
    EXPECT_GE(kinds, 3) << choices;
  }
}

TEST(JobCodec, JoinAndJobSpecRoundTrip) {
  Join j{"agent-3",
         "host-a",
         1234,
         {"cpu:0", "cpu:1"},
         true,
         kProtocol,
         "host-a/boot/4026531836",
         {"model:gpt", "data:stripes"}};
  Join k = decode(body(encode(j)).getJoin());
  EXPECT_EQ(k.kinds, j.kinds);
  EXPECT_TRUE(k.rejoin);
  EXPECT_EQ(k.agent_name, j.agent_name);
  EXPECT_EQ(k.host, j.host);
  EXPECT_EQ(k.pid, j.pid);
  EXPECT_EQ(k.devices, j.devices);
  EXPECT_EQ(k.host_identity, j.host_identity);
  EXPECT_EQ(k.protocol, kProtocol);
  EXPECT_EQ(protocol_refusal(k), "");
  // An agent of a build from before the revision was sent (the field absent: 0), or of another
  // revision: refused, saying both.
  k.protocol = 0;
  EXPECT_EQ(protocol_refusal(k),
            "agent 'agent-3' speaks control protocol 0 (a Troupe older than its revisions), this "
            "coordinator " +
                std::to_string(kProtocol) +
                ": run one Troupe build for the coordinator and every agent (troupe version)");
  k.protocol = kProtocol + 1;
  EXPECT_NE(protocol_refusal(k).find("speaks control protocol " + std::to_string(kProtocol + 1)),
            std::string::npos);

  JobSpec s;
  s.agent_id = 7;
  s.first_generation = 5;
  s.job_name = "gpt";
  s.seed = 11;
  s.steps = 300;
  s.model_kind = "gpt";
  s.hidden = {64, 32};
  s.block_params = {12, 1ull << 33};
  s.layers = 3;
  s.d_model = 96;
  s.heads = 3;
  s.context = 32;
  s.tied_head = true;
  s.dtype = "bf16";
  s.backend = "nccl";
  s.data_kind = "text";
  s.data_path = "/tmp/x";
  s.global_batch = 24;
  s.micro_batch = 8;
  s.optimizer = "adamw";
  s.lr = 2e-3;
  s.clip_norm = 1.5;
  s.warmup_steps = 10;
  s.pipeline_stages = 0;
  s.stage_backup_steps = 20;
  s.recompute_activations = true;
  s.deterministic = true;
  s.checkpoint_dir = "/runs/x/checkpoints";
  s.checkpoint_every = 20;
  s.checkpoint_skip_if_busy = true;
  s.resume_dir = "/runs/x/checkpoints/step-00000040";
  s.resume_step = 40;
  s.failure_timeout_ms = 4000;
  s.heartbeat_interval_ms = 250;
  s.worker_max_restarts = 9;
  s.worker_restart_window_ms = 12345;
  s.rejoin_timeout_ms = 2500;
  s.model_options = {{"channels", int64_t(-8)}, {"rate", 0.25}, {"on", true}, {"name", "x y"}};
  s.data_options = {{"size", int64_t(12)}};
  s.log_level = "warn";
  JobSpec t = decode(body(encode(s)).getJobSpec());
  EXPECT_EQ(t.log_level, "warn");
  EXPECT_EQ(t.model_options, s.model_options);
  EXPECT_EQ(t.rejoin_timeout_ms, 2500);
  EXPECT_EQ(t.data_options, s.data_options);
  EXPECT_EQ(t.agent_id, 7u);
  EXPECT_EQ(t.first_generation, 5u);
  EXPECT_EQ(t.hidden, s.hidden);
  EXPECT_EQ(t.block_params, s.block_params);
  EXPECT_EQ(t.model_kind, "gpt");
  EXPECT_EQ(t.data_path, "/tmp/x");
  EXPECT_EQ(t.lr, 2e-3);
  EXPECT_EQ(t.clip_norm, 1.5);
  EXPECT_TRUE(t.tied_head);
  EXPECT_EQ(t.dtype, "bf16");
  EXPECT_EQ(t.backend, "nccl");
  EXPECT_TRUE(t.recompute_activations);
  EXPECT_TRUE(t.deterministic);
  EXPECT_EQ(t.checkpoint_dir, s.checkpoint_dir);
  EXPECT_EQ(t.checkpoint_every, 20);
  EXPECT_TRUE(t.checkpoint_skip_if_busy);
  EXPECT_EQ(t.resume_dir, s.resume_dir);
  EXPECT_EQ(t.resume_step, 40u);
  EXPECT_EQ(t.pipeline_stages, 0);
  EXPECT_EQ(t.worker_max_restarts, 9);
  EXPECT_EQ(t.worker_restart_window_ms, 12345);
  EXPECT_EQ(t.failure_timeout_ms, 4000);
  EXPECT_EQ(t.heartbeat_interval_ms, 250);
}

TEST(JobCodec, WorkerReadyAndGenerationStartCarryTheWholeHolding) {
  WorkerReady r{{2, 1}, 6, "9@h@ab", holding(), 5, "peer_lost: rank 1 lost", {7, 1ull << 40, 3}};
  WorkerReady q = decode(body(encode(r)).getWorkerReady());
  EXPECT_EQ(q.worker, r.worker);
  EXPECT_EQ(q.generation, 6u);
  EXPECT_EQ(q.address, r.address);
  EXPECT_EQ(q.holding, r.holding);
  EXPECT_EQ(q.num_blocks, 5u);
  EXPECT_EQ(q.last_error, r.last_error);
  EXPECT_EQ(q.block_params, r.block_params);

  GenerationStart g{6,
                    40,
                    1,
                    {{0, {0, 0}, "a", holding()}, {1, {2, 1}, "b", {}}},
                    2.5e-4,
                    true,
                    "/runs/a/checkpoints/step-0000040",
                    {{45, 1e-3}, {60, 5e-4}}};
  GenerationStart h = decode(body(encode(g)).getGenerationStart());
  EXPECT_EQ(h.lr, 2.5e-4);
  EXPECT_EQ(h.lr_changes, g.lr_changes);
  EXPECT_TRUE(h.reload);
  EXPECT_EQ(h.checkpoint, g.checkpoint);
  EXPECT_EQ(h.generation, 6u);
  EXPECT_EQ(h.start_step, 40u);
  EXPECT_EQ(h.state_source, 1u);
  ASSERT_EQ(h.members.size(), 2u);
  EXPECT_EQ(h.members[0].holding, holding());
  EXPECT_EQ(h.members[1].worker, (WorkerId{2, 1}));
  EXPECT_EQ(h.members[1].address, "b");
}

// A start whose members do not hold the ranks 0..n-1 once each, or whose state source is not one
// of them, decodes (the codec checks no ranges) and is named invalid: an agent drops it rather
// than index its peers by those ranks.
TEST(JobCodec, AGenerationStartWithRanksOutsideItsMembersIsInvalid) {
  GenerationStart g{6, 40, 1, {{0, {0, 0}, "a", {}}, {1, {2, 1}, "b", {}}}, 0, false, "", {}};
  EXPECT_EQ(invalid_members(g), "");
  GenerationStart past = g;
  past.members[1].rank = 7;
  EXPECT_NE(invalid_members(decode(body(encode(past)).getGenerationStart()))
                .find("rank 7 twice or outside 0..1"),
            std::string::npos);
  GenerationStart twice = g;
  twice.members[1].rank = 0;
  EXPECT_NE(invalid_members(twice).find("rank 0 twice"), std::string::npos);
  GenerationStart source = g;
  source.state_source = 2;
  EXPECT_NE(invalid_members(source).find("state source 2 outside"), std::string::npos);
}

TEST(JobCodec, ReportsAndAnswersRoundTrip) {
  StepReport s{3, 17, 2, 1.25, 8, 256, 100, 108, 0.5, 0.4, 0.1, 0, 0, 3e9, 2e11, 1};
  StepReport t = decode(body(encode(s)).getStepReport());
  EXPECT_EQ(t.flops, 3e9);
  EXPECT_EQ(t.peak_flops, 2e11);
  EXPECT_EQ(t.peak_source, 1);
  EXPECT_EQ(t.step, 17u);
  EXPECT_EQ(t.position_end, 108u);
  EXPECT_EQ(t.tokens, 256u);
  EXPECT_EQ(t.busy_seconds, 0.4);

  StateReceived a{3, 1, 0, 4096, 0.01, true, 2, "dp 1 x pp 2", "NCCL: every member on a GPU"};
  StateReceived b = decode(body(encode(a)).getStateReceived());
  EXPECT_EQ(b.plan, a.plan);
  EXPECT_EQ(b.data_plane, a.data_plane);
  EXPECT_EQ(b.bytes, 4096u);
  EXPECT_TRUE(b.needed);

  CheckpointWritten c{
      3,    1,   40, 5, "/ckpt/step-00000040", {{2, "block-00002.trpblk", 1234, 0xabcULL}},
      0.01, 0.2, ""};
  CheckpointWritten c2 = decode(body(encode(c)).getCheckpointWritten());
  EXPECT_EQ(c2.step, 40u);
  EXPECT_EQ(c2.blocks, 5u);
  EXPECT_EQ(c2.directory, c.directory);
  ASSERT_EQ(c2.shards.size(), 1u);
  EXPECT_EQ(c2.shards[0].file, "block-00002.trpblk");
  EXPECT_EQ(c2.shards[0].checksum, 0xabcULL);
  EXPECT_EQ(c2.write_seconds, 0.2);

  WorkerDone d{1, 3, 100, 0xfeedULL, 2};
  EXPECT_EQ(decode(body(encode(d)).getWorkerDone()).checksum, 0xfeedULL);
  EXPECT_EQ(decode(body(encode(d)).getWorkerDone()).group, 2u);
  d.group = kHoldsNoBlocks;
  EXPECT_EQ(decode(body(encode(d)).getWorkerDone()).group, kHoldsNoBlocks);

  WorkerFailed f{{4, 2}, 3, 9, "injected", true, false};
  WorkerFailed g = decode(body(encode(f)).getWorkerFailed());
  EXPECT_EQ(g.worker, (WorkerId{4, 2}));
  EXPECT_EQ(g.reason, "injected");
  EXPECT_TRUE(g.restarting);
  EXPECT_FALSE(g.fatal);

  Shutdown x{"drained", 0};
  EXPECT_EQ(decode(body(encode(x)).getShutdown()).reason, "drained");

  JobStatus st{"job",
               "running",
               "",
               2,
               10,
               100,
               1.5,
               {{0, 1, 99, "h", "cpu:0", "agent-1", 1, 0.5, 0.25, 120, 0.125, 180, "paused"}},
               {{0, 3, 98, "h", "cpu:0", "agent-3", -1, 0, 0, -1, 0, -1, "standby"}},
               40,
               "/r/checkpoints/step-40/manifest.json",
               1.5,
               0.25,
               "2 x cpu",
               "host-staged over UCX: rank 0 computes on the CPU"};
  JobStatus su = decode(body(encode(st)).getStatus());
  EXPECT_EQ(su.model_tflops, 1.5);
  EXPECT_EQ(su.mfu, 0.25);
  EXPECT_EQ(su.peak, "2 x cpu");
  EXPECT_EQ(su.data_plane, st.data_plane);
  EXPECT_EQ(su.state, "running");
  ASSERT_EQ(su.members.size(), 1u);
  EXPECT_EQ(su.members[0].pid, 99u);
  EXPECT_EQ(su.members[0].device, "cpu:0");
  EXPECT_EQ(su.members[0].name, "agent-1");
  EXPECT_EQ(su.members[0].stage, 1);
  EXPECT_EQ(su.members[0].step_seconds, 0.5);
  EXPECT_EQ(su.members[0].compute_seconds, 0.25);
  EXPECT_EQ(su.members[0].last_report_ms, 120);
  EXPECT_EQ(su.members[0].data_seconds, 0.125);
  EXPECT_EQ(su.members[0].state, "paused");
  EXPECT_EQ(su.members[0].last_heard_ms, 180);
  EXPECT_EQ(su.standbys[0].last_report_ms, -1);
  EXPECT_EQ(su.standbys[0].last_heard_ms, -1);
  ASSERT_EQ(su.standbys.size(), 1u);
  EXPECT_EQ(su.standbys[0].name, "agent-3");
  EXPECT_EQ(su.checkpoint_step, 40u);
  EXPECT_EQ(su.checkpoint_path, "/r/checkpoints/step-40/manifest.json");

  EXPECT_EQ(body(encode(LeaveGeneration{4})).getLeaveGeneration(), 4u);
  EXPECT_EQ(body(encode(AbandonGeneration{5})).getAbandonGeneration(), 5u);
  EXPECT_TRUE(body(make_ack()).isAck());
  EXPECT_EQ(body(make_scale_request(3)).getScaleRequest(), 3u);
  EXPECT_TRUE(body(make_checkpoint_request(true)).getCheckpointRequest().getStop());
  EXPECT_FALSE(body(make_checkpoint_request(false)).getCheckpointRequest().getStop());
  EXPECT_EQ(body(make_checkpoint_at_step(12)).getCheckpointAtStep(), 12u);
  TraceChunk tc{3, 1, 2, {{"allreduce", "comm", 1796000000000000, 250, 1, 41}}};
  TraceChunk td = decode(body(encode(tc)).getTraceChunk());
  EXPECT_EQ(td.agent, 3u);
  EXPECT_EQ(td.rank, 2u);
  ASSERT_EQ(td.events.size(), 1u);
  EXPECT_EQ(td.events[0].name, "allreduce");
  EXPECT_EQ(td.events[0].ts_us, 1796000000000000);
  EXPECT_EQ(td.events[0].thread, 1u);
  EXPECT_EQ(td.events[0].step, 41);
}

TEST(JobCodec, ErrorRepliesCarryTheTypedCode) {
  auto e = make_error_reply(comm::Errc::refused, "the job is finished");
  auto err = body(e).getError();
  EXPECT_EQ(comm::errc_from_wire(uint32_t(err.getErrc())), comm::Errc::refused);
  EXPECT_STREQ(err.getMessage().cStr(), "the job is finished");
  EXPECT_EQ(comm::errc_from_wire(999), comm::Errc::internal);
}

TEST(WorkerIds, PackIntoOneKeyAndBack) {
  WorkerId w{7, 3};
  EXPECT_EQ(WorkerId::from_key(w.key()), w);
  EXPECT_EQ(w.name(), "7/3");
  EXPECT_LT((WorkerId{1, 9}), (WorkerId{2, 0}));
}

}  // namespace
}  // namespace troupe::actors
