# The control protocol: every message between Troupe processes is one Envelope.
# Field numbers are never reused; add new message kinds at the end of the union.
@0xdfac8f2007fc1ba4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::proto");

struct Envelope {
  jobId @0 :Text;          # the job this message belongs to; a mismatch is rejected
  token @1 :Data;          # the job's secret token; a mismatch is rejected
  generation @2 :UInt64;   # sender's membership generation; 0 = not generation-scoped
  srcNode @3 :UInt64;      # the sending process's node id (must match the transport's)
  srcActor @4 :UInt64;     # the sending actor within srcNode; 0 = anonymous
  dstActor @5 :UInt64;     # the destination actor within the receiving process
  requestId @6 :UInt64;    # nonzero on a request and on its reply; 0 on a one-way message
  isReply @7 :Bool;        # true when this message answers requestId

  body :union {
    heartbeat @8 :Heartbeat;   # liveness, sent every heartbeat_interval_ms
    echo @9 :Echo;             # a ping answered with the same content (demo, tests, benchmarks)
    error @10 :ErrorReply;     # a request could not be served
    fenced @11 :Fenced;        # the receiver refuses the sender: rejoin as a new member
    statsRequest @12 :Void;    # asks a process for its control-plane counters
    stats @13 :Stats;          # the answer to statsRequest
    join @14 :Join;                        # agent -> coordinator (request): admit me
    jobSpec @15 :JobSpec;                  # coordinator -> agent: the answer to join
    workerReady @16 :WorkerReady;          # agent -> coordinator: a worker's data-plane address
    generationStart @17 :GenerationStart;  # coordinator -> agents: members and ranks of a generation
    stepReport @18 :StepReport;            # worker -> coordinator (one way): a step it applied
    workerDone @19 :WorkerDone;            # worker -> coordinator (one way): finished, with a checksum
    shutdown @20 :Shutdown;                # coordinator -> agents: the job is over
    statusRequest @21 :Void;               # admin -> coordinator (request)
    status @22 :JobStatus;                 # the answer to statusRequest
    stopRequest @23 :Void;                 # admin -> coordinator (request): stop after the current step
    ack @24 :Void;                         # a request was accepted
    stopAtNextStep @25 :Void;              # coordinator -> agents: stop after the current step
    workerFailed @26 :WorkerFailed;        # worker -> coordinator (one way): it cannot go on
    leaveGeneration @27 :UInt64;           # coordinator -> agents: end this generation at the next step boundary (a member joins or leaves)
    drainRequest @28 :UInt32;              # admin -> coordinator (request): this agent leaves at a step boundary
    scaleRequest @29 :UInt32;              # admin -> coordinator (request): run with this many workers
    stateReceived @30 :StateReceived;      # worker -> coordinator (one way): it took the state source's state
    checkpointWritten @31 :CheckpointWritten;  # worker -> coordinator (one way): its shards of a checkpoint are durable
    checkpointRequest @32 :CheckpointRequest;  # admin -> coordinator (request): a checkpoint at the next step boundary
    checkpointAtStep @33 :UInt64;          # coordinator -> agents: a checkpoint at the first step boundary at or after this step
    traceChunk @34 :TraceChunk;            # worker -> coordinator (one way): its trace of observability.trace_steps
    learningRateRequest @35 :Float64;      # admin -> coordinator (request): optimizer.lr from the next step boundary
    stopWithCheckpoint @36 :Void;          # coordinator -> agents: stop after the current step, with a checkpoint there (one message: no vote sees one without the other)
    abandonGeneration @37 :UInt64;         # coordinator -> agents: a member of this generation is gone: give up its device collectives in flight (they may never complete)
    accepted @38 :Text;                    # a request was accepted: what it does, for the operator (troupe scale's answer)
  }
}

struct Join {
  agentName @0 :Text;       # for people and logs
  pid @1 :UInt32;           # the agent's process id
  host @2 :Text;            # the agent's host name
  devices @3 :List(Text);   # devices it offers, e.g. "cpu:0"
  rejoin @4 :Bool;          # its coordinator was lost and it holds the job's state: adopt it
  protocol @5 :UInt32;      # the control protocol's revision it speaks (actors::kProtocol; 0:
                            # a Troupe from before it was sent)
  hostIdentity @6 :Text;    # comm::host_identity(): where its pid names its process ("": unknown)
  kinds @7 :List(Text);     # what its program trains: "model:gpt", "data:tokens", ... ("model:
                            # external" for a loop of its own); empty: a Troupe from before it
                            # was sent (its JobSpec is checked by the agent alone)
}

struct JobSpec {
  agentId @0 :UInt32;       # the id the coordinator gives this agent
  jobName @1 :Text;         # job.name
  seed @2 :UInt64;          # job.seed
  steps @3 :UInt64;         # job.steps
  modelKind @4 :Text;       # model.kind: mlp | gpt
  hidden @5 :List(Int64);   # model.hidden (mlp)
  inputs @6 :Int64;         # model.inputs (mlp)
  classes @7 :Int64;        # model.classes (mlp)
  layers @8 :Int64;         # model.layers (gpt)
  dModel @9 :Int64;         # model.d_model (gpt)
  heads @10 :Int64;         # model.heads (gpt)
  context @11 :Int64;       # model.context (gpt)
  tiedHead @12 :Bool;       # model.tied_head
  dataKind @13 :Text;       # data.kind: synthetic | text | tokens
  dataPath @14 :Text;       # data.path
  samples @15 :Int64;       # data.samples (synthetic)
  globalBatch @16 :Int64;   # batch.global
  microBatch @17 :Int64;    # batch.micro
  optimizer @18 :Text;      # optimizer.kind
  lr @19 :Float64;          # optimizer.lr
  momentum @20 :Float64;    # optimizer.momentum
  weightDecay @21 :Float64; # optimizer.weight_decay
  clipNorm @22 :Float64;    # optimizer.clip_norm
  warmupSteps @23 :Int64;   # optimizer.warmup_steps
  decaySteps @24 :Int64;    # optimizer.decay_steps
  threadsPerWorker @25 :Int64;  # parallel.threads_per_worker
  failureTimeoutMs @26 :Int64;  # elastic.failure_timeout_ms (data-plane deadline)
  overlapReduce @27 :Bool;      # parallel.overlap_reduce
  firstGeneration @28 :UInt64;  # the generation this agent's workers first publish for
  pipelineStages @29 :Int64;    # parallel.pipeline_stages (0 = auto)
  maxParamsPerWorker @30 :Int64;  # parallel.max_params_per_worker (0 = no limit)
  stageBackupSteps @31 :Int64;    # parallel.stage_backup_steps (0 = no backups)
  recomputeActivations @32 :Bool; # parallel.recompute_activations
  workerMaxRestarts @33 :Int64;   # elastic.worker_max_restarts (a worker thread that throws)
  workerRestartWindowMs @34 :Int64;  # elastic.worker_restart_window_ms
  deterministic @35 :Bool;        # parallel.deterministic
  checkpointDir @36 :Text;        # checkpoint.dir, resolved ("" = no checkpoints)
  checkpointEvery @37 :Int64;     # checkpoint.every_steps (0 = none)
  checkpointSkipIfBusy @38 :Bool; # checkpoint.if_busy = "skip"
  resumeDir @39 :Text;            # the checkpoint a resumed job starts from ("" = from the seed)
  resumeStep @40 :UInt64;         # its step (the next step to run)
  traceFirst @41 :Int64 = -1;     # observability.trace_steps: the first step traced (-1: none)
  traceLast @42 :Int64 = -1;      # ... and the last
  dataMix @43 :List(Text);        # data.mix: token data sets (data.kind = "tokens") ...
  dataMixWeights @44 :List(Float64);  # ... and their weights, one each
  evalEvery @45 :Int64;           # eval.every_steps (0: no evaluation)
  evalPath @46 :Text;             # data.eval_path ("": the held-out tail of the training sets)
  evalFraction @47 :Float64;      # data.eval_fraction
  modelOptions @48 :List(Option); # a program's own model.kind: its keys' values
  dataOptions @49 :List(Option);  # a program's own data.kind: its keys' values
  rejoinTimeoutMs @50 :Int64;     # elastic.rejoin_timeout_ms: how long a lost coordinator is waited for
  initState @51 :Bool;            # its workers start from the seed or the checkpoint (else: receive it)
  dtype @52 :Text;                # model.dtype: f32 | bf16 ("" from an older coordinator: f32)
  peakTflops @53 :Float64;        # observability.peak_tflops: a worker's peak for MFU (0: its device's)
  backend @54 :Text;             # parallel.backend: auto | ucx | nccl ("" from an older coordinator: auto)
  reduceDtype @55 :Text;          # parallel.reduce_dtype: f32 | bf16 ("" from an older coordinator: f32)
  blockParams @56 :List(UInt64);  # each block's parameter count in the job's model (empty: not known yet)
  logLevel @57 :Text;             # logging.level: debug | info | warn | error ("" from an older coordinator: info)
  heartbeatIntervalMs @58 :Int64; # elastic.heartbeat_interval_ms (0 from an older coordinator: the agent's own)
}

# A value of a program's own config key (models/extension.h).
struct Option {
  name @0 :Text;            # the key, under [model] or [data]
  value :union {
    integer @1 :Int64;
    number @2 :Float64;
    boolean @3 :Bool;
    text @4 :Text;
  }
}

struct TraceEvent {
  name @0 :Text;            # forward, backward, allreduce, update, ...
  category @1 :Text;        # compute | data | comm | wait | state
  tsUs @2 :Int64;           # its start, unix microseconds
  durUs @3 :Int64;          # its length
  thread @4 :UInt32;        # 0: the worker's thread; 1: its reducer thread
  step @5 :Int64;           # the step it belongs to (-1: between steps)
}

struct TraceChunk {
  agentId @0 :UInt32;       # the worker's agent
  device @1 :UInt32;        # and device index
  rank @2 :UInt32;          # its rank when it traced
  events @3 :List(TraceEvent);
}

struct CheckpointShard {
  block @0 :UInt32;         # the model block
  file @1 :Text;            # its file in the checkpoint's directory
  bytes @2 :UInt64;         # the file's size
  checksum @3 :UInt64;      # FNV-1a 64 of the file's bytes
}

struct CheckpointWritten {
  generation @0 :UInt64;    # the writer's generation
  rank @1 :UInt32;          # the writer's rank
  step @2 :UInt64;          # the checkpoint's step (the next step to run; state after step - 1)
  blocks @3 :UInt32;        # blocks in the model: the checkpoint is complete when all are written
  directory @4 :Text;       # the checkpoint's directory
  shards @5 :List(CheckpointShard);
  blockingSeconds @6 :Float64;  # training stopped while the state was copied
  writeSeconds @7 :Float64;     # the background write (files, fsync, rename)
  error @8 :Text;               # "" or why the shards could not be written (the checkpoint fails)
}

struct WorkerReady {
  agentId @0 :UInt32;       # the agent
  device @1 :UInt32;        # index among the agent's devices
  address @2 :Text;         # the worker's data-plane address for the coming generation
  generation @3 :UInt64;    # the generation this address is for
  appliedStep @4 :UInt64;   # steps this worker has applied (the next step it would run)
  heldBlocks @5 :List(UInt32);  # model blocks whose state it holds as of appliedStep
  lastError @6 :Text;       # why it left its previous generation, if a data-plane error ended it
  snapshotBlocks @7 :List(UInt32);  # blocks whose state it holds as of appliedStep - 1
  numBlocks @8 :UInt32;     # blocks in the model
  backupBlocks @9 :List(UInt32);  # blocks whose state it holds as of backupStep (stage backups)
  backupStep @10 :UInt64;   # the step of those copies
  blockParams @11 :List(UInt64);  # each block's parameter count in the model it built
}

struct Member {
  rank @0 :UInt32;          # rank in the generation
  agentId @1 :UInt32;       # the agent that hosts it
  device @2 :UInt32;        # device index within the agent
  address @3 :Text;         # data-plane address
  appliedStep @4 :UInt64;   # steps it had applied when it published (it lacks the state if < startStep)
  heldBlocks @5 :List(UInt32);  # blocks whose state it holds as of appliedStep
  snapshotBlocks @6 :List(UInt32);  # blocks whose state it holds as of appliedStep - 1
  backupBlocks @7 :List(UInt32);  # blocks whose state it holds as of backupStep
  backupStep @8 :UInt64;    # the step of those copies
}

struct GenerationStart {
  generation @0 :UInt64;    # the new generation
  startStep @1 :UInt64;     # the first step to run
  members @2 :List(Member); # by rank
  stateSource @3 :UInt32;   # the rank whose parameters and optimizer state everyone takes
  lr @4 :Float64;           # optimizer.lr from startStep on (0: the job's optimizer.lr)
  reload @5 :Bool;          # the job's state was lost with its members: every member reloads
                            # it as of startStep (checkpoint.on_state_lost = "rollback") ...
  checkpoint @6 :Text;      # ... from this checkpoint (its directory), or "" the job's seed
  lrChanges @7 :List(LrChange);  # optimizer.lr from later steps on (troupe lr's changes of
                            # steps a rollback redoes: each acts at its step again)
}

struct LrChange {
  step @0 :UInt64;          # the first step it acts on
  lr @1 :Float64;
}

struct StepReport {
  generation @0 :UInt64;    # the generation it ran in
  step @1 :UInt64;          # the step
  rank @2 :UInt32;          # the reporting rank
  loss @3 :Float64;         # the step's global mean loss (the same on every rank)
  samples @4 :UInt64;       # samples this rank used
  positionBegin @5 :UInt64; # first global sample position this rank used
  positionEnd @6 :UInt64;   # one past the last
  seconds @7 :Float64;      # wall time of the step on this rank
  tokens @8 :UInt64;        # tokens this rank used (samples for the mlp)
  busySeconds @9 :Float64;  # of `seconds`, the time it computed (the rest: waiting on others)
  dataSeconds @10 :Float64; # of `busySeconds`, the time it assembled its batches
  evalLoss @11 :Float64;    # the held-out loss of the parameters the step started from
  evalTokens @12 :UInt64;   # the tokens it scored over (0: the step did not evaluate)
  flops @13 :Float64;       # the model's training FLOPs this rank computed in the step
  peakFlops @14 :Float64;   # its device's peak FLOP/s (0: unknown), for MFU
  peakSource @15 :UInt8;    # where it comes from: 0 unknown, 1 a CPU estimate, 2 a GPU's data
                            # sheet, 3 observability.peak_tflops (models::PeakSource; no text:
                            # a step report is a flat frame, comm/frame.h)
  epochSamples @16 :UInt64; # the samples of the data set's epoch (its size; 0 unknown)
}

struct WorkerDone {
  rank @0 :UInt32;          # the rank
  generation @1 :UInt64;    # its generation
  steps @2 :UInt64;         # steps applied in total
  checksum @3 :UInt64;      # FNV-1a of the parameters it holds: equal within its group
  group @4 :UInt32;         # whose checksums must equal it: 0 the whole model (every member);
                            # a pipeline stopped early, 1 + its stage (what the stage's replicas
                            # hold); 0xffffffff holds no blocks (a pipeline's idle rank)
  evalLoss @5 :Float64;     # a completed job's held-out loss of the parameters it ended with ...
  evalTokens @6 :UInt64;    # ... over these tokens (0: not evaluated)
}

struct Shutdown {
  reason @0 :Text;          # why
  exitCode @1 :Int32;       # what the agent should exit with
}

struct MemberStatus {
  rank @0 :UInt32;          # rank in the current generation
  agentId @1 :UInt32;       # agent id
  pid @2 :UInt32;           # agent process id
  host @3 :Text;            # agent host
  device @4 :Text;          # the device
  name @5 :Text;            # the agent's name (its log: RUN_DIR/NAME.log for local agents)
  stage @6 :Int32 = -1;     # its pipeline stage (-1: the whole model)
  stepSeconds @7 :Float64;  # its last reported step's time (0: none in this generation yet)
  computeSeconds @8 :Float64;  # ... and its compute part (forward, backward)
  lastReportMs @9 :Int64 = -1;  # milliseconds since that report (-1: none yet)
  dataSeconds @10 :Float64;  # ... and the part of compute spent assembling batches
  lastHeardMs @11 :Int64 = -1;  # milliseconds since the coordinator last heard from its agent
                                # (a heartbeat or any frame; -1: not known)
  state @12 :Text;          # training | starting | paused | restarting | lost | given up | idle
                            # | standby ("" from an older coordinator: from lastReportMs)
}

struct JobStatus {
  jobName @0 :Text;                 # job.name
  state @1 :Text;                   # forming | running | changing | paused | stopping | finished
  generation @2 :UInt64;            # current generation
  step @3 :UInt64;                  # last committed step + 1
  steps @4 :UInt64;                 # job.steps
  members @5 :List(MemberStatus);   # by rank
  lastLoss @6 :Float64;             # loss of the last committed step
  plan @7 :Text;                    # the pipeline layout of the generation ("" without pipelines)
  standbys @8 :List(MemberStatus);  # live workers that are not members (rank 0: none)
  checkpointStep @9 :UInt64;        # the newest complete checkpoint's step (0: none yet)
  checkpointPath @10 :Text;         # its manifest ("" none)
  modelTflops @11 :Float64;         # the last committed step's model TFLOP/s (training FLOPs)
  mfu @12 :Float64;                 # ... as a fraction of the members' peak (NaN: not known)
  peak @13 :Text;                   # what that peak is
  dataPlane @14 :Text;              # the generation's data plane and why ("" not reported)
  epoch @15 :Float64;               # epochs of the data set the committed steps drew (0 unknown)
}

struct CheckpointRequest {
  stop @0 :Bool;            # and stop there (troupe stop --checkpoint)
}

struct WorkerFailed {
  rank @0 :UInt32;          # the rank (or agent-local device index before ranks exist)
  reason @1 :Text;          # what went wrong
  agentId @2 :UInt32;       # the agent that hosts it
  device @3 :UInt32;        # device index within the agent
  generation @4 :UInt64;    # the generation it failed in (0: before its first)
  restarting @5 :Bool;      # true: its agent restarts it (it publishes for the next generation)
  fatal @6 :Bool;           # true: the job cannot go on (e.g. a model block held by no member)
}

struct StateReceived {
  generation @0 :UInt64;    # the generation whose start brought the state
  rank @1 :UInt32;          # the receiving rank
  sourceRank @2 :UInt32;    # the state source
  bytes @3 :UInt64;         # bytes received (parameters and optimizer state)
  seconds @4 :Float64;      # wall time of the transfer on this rank
  needed @5 :Bool;          # false when this rank already had the source's step (a no-op copy)
  blocks @6 :UInt32;        # model blocks received
  plan @7 :Text;            # the layout it trains with in this generation, e.g. "dp 2 x pp 2, stages [0,3)[3,6)"
  dataPlane @8 :Text;       # rank 0: the data plane the members chose, and why ("" none formed)
}

struct Heartbeat {
  sequence @0 :UInt64;     # increases by one per heartbeat from one sender
  sentUnixUs @1 :UInt64;   # sender's wall clock, for logs only (never compared across hosts)
}

struct Echo {
  sequence @0 :UInt64;     # chosen by the requester, returned unchanged
  payload @1 :Data;        # returned unchanged
  note @2 :Text;           # free text, returned unchanged
}

struct ErrorReply {
  code @0 :Text;           # errc's name, for people and logs only (never compared)
  message @1 :Text;        # what went wrong, for a person
  errc @2 :ErrorCode;      # what the caller should do (comm/error.h)
}

# comm::Errc on the wire: the same numbers, in the same order.
enum ErrorCode {
  ok @0;            # (not an error)
  peerLost @1;      # a peer died or its link broke: abort and rebuild
  timedOut @2;      # a deadline passed
  aborted @3;       # cancelled by a local abort
  invalidInput @4;  # malformed input: tell the user
  io @5;            # the local system failed
  internal @6;      # a bug in Troupe
  refused @7;       # understood and declined: tell the user the reason
  noActor @8;       # no such actor at the destination
}

struct Fenced {
  reason @0 :Text;         # why the sender is refused
}

struct Stats {
  framesReceived @0 :UInt64;      # frames that reached the control plane
  framesAccepted @1 :UInt64;      # frames delivered to an actor or the bridge
  rejectedMalformed @2 :UInt64;   # not a Cap'n Proto envelope (random bytes, truncated, limits)
  rejectedOversized @3 :UInt64;   # larger than the frame size cap
  rejectedWrongJob @4 :UInt64;    # job id or token mismatch
  rejectedStale @5 :UInt64;       # generation older than the receiver's
  rejectedFenced @6 :UInt64;      # from a fenced node
  rejectedNoActor @7 :UInt64;     # destination actor unknown
  rejectedTransport @8 :UInt64;   # refused by the transport (bad header, unknown peer, fenced)
  framesSent @9 :UInt64;          # frames handed to UCX by this process
}
