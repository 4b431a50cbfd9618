// Fuzzes the one door for network bytes: FrameValidator::decode, and for every frame it accepts,
// the job protocol's codec on its body (whatever decode lets through must be readable without
// a throw or a crash). `make fuzz`; the corpus is fuzz/corpus/frame (seeds: one valid frame of
// every kind, written by TROUPE_FUZZ_WRITE_SEEDS=DIR troupe_frame_fuzz).
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "actors/job_protocol.h"
#include "comm/frame.h"

namespace {

using troupe::actors::ControlMessage;
namespace actors = troupe::actors;
namespace comm = troupe::comm;
namespace proto = troupe::proto;

const char* kJob = "fuzz";
const char* kToken = "fuzz-token";

void read_body(proto::Envelope::Reader e) {
  auto b = e.getBody();
  using B = proto::Envelope::Body;
  switch (b.which()) {
    case B::JOIN:
      (void)actors::decode(b.getJoin());
      break;
    case B::JOB_SPEC:
      (void)actors::decode(b.getJobSpec());
      break;
    case B::WORKER_READY:
      (void)actors::decode(b.getWorkerReady());
      break;
    case B::GENERATION_START:
      (void)actors::decode(b.getGenerationStart());
      break;
    case B::STEP_REPORT:
      (void)actors::decode(b.getStepReport());
      break;
    case B::WORKER_DONE:
      (void)actors::decode(b.getWorkerDone());
      break;
    case B::WORKER_FAILED:
      (void)actors::decode(b.getWorkerFailed());
      break;
    case B::STATE_RECEIVED:
      (void)actors::decode(b.getStateReceived());
      break;
    case B::CHECKPOINT_WRITTEN:
      (void)actors::decode(b.getCheckpointWritten());
      break;
    case B::SHUTDOWN:
      (void)actors::decode(b.getShutdown());
      break;
    case B::STATUS:
      (void)actors::decode(b.getStatus());
      break;
    case B::TRACE_CHUNK:
      (void)actors::decode(b.getTraceChunk());
      break;
    case B::CHECKPOINT_REQUEST:
      (void)b.getCheckpointRequest().getStop();
      break;
    case B::ERROR:
      (void)comm::errc_from_wire(uint32_t(b.getError().getErrc()));
      break;
    default:
      break;
  }
}

// A job spec of a program's own kinds (their keys' values of every type).
actors::JobSpec extension_spec() {
  actors::JobSpec s;
  s.model_kind = "convnet";
  s.model_options = {{"channels", int64_t(16)}, {"rate", 0.5}, {"on", true}, {"name", "x"}};
  s.data_options = {{"size", int64_t(24)}};
  s.rejoin_timeout_ms = 30000;
  s.init_state = false;
  return s;
}

void write_seeds(const std::string& dir) {
  comm::EnvelopeHeader h;
  h.job_id = kJob;
  h.token = kToken;
  h.src_node = 7;
  troupe::elastic::Holding holding{41, {0, 1, 2}, {1}, 40, {3}};
  ControlMessage seeds[] = {
      actors::encode(actors::Join{"agent-0", "host", 12, {"cpu:0", "cpu:1"}, true}),
      actors::encode(actors::JobSpec{}),
      actors::encode(extension_spec()),
      actors::make_learning_rate_request(3e-4),
      actors::encode(actors::WorkerReady{{1, 0}, 3, "1@h@00", holding, 5, "peer_lost", {7, 8}}),
      actors::encode(actors::GenerationStart{
          3, 40, 1, {{0, {1, 0}, "a", holding}}, 1e-3, true, "/c/step-40", {{41, 2e-3}}}),
      actors::encode(actors::StepReport{3, 17, 0, 1.5, 8, 8, 0, 8, 0.1, 0.09, 0.01}),
      actors::encode(actors::WorkerDone{0, 3, 100, 0xfeed}),
      actors::encode(actors::WorkerFailed{{1, 0}, 0, 3, "boom", true, false}),
      actors::encode(actors::StateReceived{3, 1, 0, 4096, 0.1, true, 2, "dp 1 x pp 2"}),
      actors::encode(actors::Shutdown{"drained", 0}),
      actors::encode(actors::JobStatus{"job", "running", "", 2, 10, 100, 1.5, {}, {}, 8, "m"}),
      actors::make_checkpoint_request(true),
      actors::make_checkpoint_at_step(12),
      actors::encode(actors::TraceChunk{1, 0, 2, {{"forward", "compute", 1000, 50, 0, 7}}}),
      actors::make_error_reply(comm::Errc::refused, "no"),
      actors::make_ack()};
  int i = 0;
  for (auto& m : seeds) {
    comm::Buffer b = m.encode(h);
    std::ofstream(dir + "/seed-" + std::to_string(i++), std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* dir = std::getenv("TROUPE_FUZZ_WRITE_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const comm::FrameValidator validator(kJob, kToken);
  auto result = validator.decode(comm::Buffer::copy_of(data, size), 7);
  if (auto* frame = std::get_if<std::shared_ptr<const comm::DecodedFrame>>(&result))
    read_body((*frame)->envelope());
  return 0;
}
