#include "comm/frame.h"

#include <capnp/dynamic.h>
#include <kj/exception.h>

namespace troupe::comm {
namespace {

kj::ArrayPtr<const capnp::word> words_of(const Buffer& b) {
  return {reinterpret_cast<const capnp::word*>(b.data()), b.size() / sizeof(capnp::word)};
}

// The validating read: a budget in proportion to the frame (a well-formed frame read through
// once by totalSize() and once by the walk charges about twice its words).
capnp::ReaderOptions checking_options(const FrameLimits& limits, size_t words) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.read_words_per_word * words + 1024;
  options.nestingLimit = limits.nesting_limit;
  return options;
}

// Later reads, of a frame already read through within that budget: they cannot throw, and
// however often an actor reads a field, the budget must not run out under it.
capnp::ReaderOptions trusted_options(const FrameLimits& limits) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = uint64_t(1) << 62;
  options.nestingLimit = limits.nesting_limit;
  return options;
}

// Reads every pointer of the message through its type: a struct where a list is, a list of
// the wrong element size, a text without its NUL, a blob of non-bytes each throw here, once.
// totalSize() checks the pointers' bounds only (the frame fuzzer found envelopes whose job id
// lacked its NUL and whose token was a list of words: both threw out of decode and ended the
// process).
void check_value(const capnp::DynamicValue::Reader& v);

void check_struct(const capnp::DynamicStruct::Reader& s) {
  for (auto field : s.getSchema().getFields())
    if (s.has(field)) check_value(s.get(field));  // (get() reads the pointer as its type)
}

void check_value(const capnp::DynamicValue::Reader& v) {
  switch (v.getType()) {
    case capnp::DynamicValue::STRUCT:
      check_struct(v.as<capnp::DynamicStruct>());
      break;
    case capnp::DynamicValue::LIST:
      for (auto e : v.as<capnp::DynamicList>()) check_value(e);
      break;
    default:
      break;
  }
}

}  // namespace

bool body_is_flat(proto::Envelope::Body::Which kind) {
  using B = proto::Envelope::Body;
  switch (kind) {
    case B::HEARTBEAT:
    case B::STEP_REPORT:
    case B::WORKER_DONE:
    case B::STATS:
    case B::ACK:
    case B::STOP_AT_NEXT_STEP:
    case B::LEAVE_GENERATION:
    case B::DRAIN_REQUEST:
    case B::SCALE_REQUEST:
    case B::STATUS_REQUEST:
    case B::STOP_REQUEST:
    case B::STATS_REQUEST:
    case B::LEARNING_RATE_REQUEST:
    case B::STOP_WITH_CHECKPOINT:
    case B::ABANDON_GENERATION:
      return true;
    default:
      return false;
  }
}

namespace {

// Every pointer of an envelope, read once. The frequent kinds are read by hand (the generic
// walk costs a few microseconds, which halved the control plane's message rate when applied to
// every frame); the others generically, so a new kind is covered without a line here.
void check_pointers(proto::Envelope::Reader env) {
  (void)env.getJobId();
  (void)env.getToken();
  auto body = env.getBody();
  if (body_is_flat(body.which())) {
    // Their bodies hold no pointer (a test holds this to the schema): reading the struct is all.
    switch (body.which()) {
      case proto::Envelope::Body::HEARTBEAT:
        (void)body.getHeartbeat();
        break;
      case proto::Envelope::Body::STEP_REPORT:
        (void)body.getStepReport();
        break;
      case proto::Envelope::Body::WORKER_DONE:
        (void)body.getWorkerDone();
        break;
      case proto::Envelope::Body::STATS:
        (void)body.getStats();
        break;
      default:
        break;  // (void or a number)
    }
    return;
  }
  if (body.isEcho()) {
    auto e = body.getEcho();
    (void)e.getPayload();
    (void)e.getNote();
    return;
  }
  check_struct(capnp::DynamicStruct::Reader(body));
}

bool equal_bytes(capnp::Data::Reader data, const std::string& s) {
  return data.size() == s.size() &&
         (s.empty() || std::memcmp(data.begin(), s.data(), s.size()) == 0);
}

}  // namespace

const char* reject_name(Reject r) {
  switch (r) {
    case Reject::malformed:
      return "malformed";
    case Reject::oversized:
      return "oversized";
    case Reject::wrong_job:
      return "wrong_job";
    case Reject::stale:
      return "stale_generation";
    case Reject::spoofed:
      return "spoofed_source";
    case Reject::unknown_kind:
      return "unknown_kind";
    case Reject::count_:
      break;
  }
  return "unknown";
}

DecodedFrame::DecodedFrame(Buffer bytes, const FrameLimits& limits)
    : bytes_(std::move(bytes)), reader_(words_of(bytes_), trusted_options(limits)) {
  // Read everything once, within the budget, so that a malformed pointer or text anywhere
  // throws here, not in an actor later.
  capnp::FlatArrayMessageReader check(
      words_of(bytes_), checking_options(limits, bytes_.size() / sizeof(capnp::word)));
  auto env = check.getRoot<proto::Envelope>();
  (void)env.totalSize();
  check_pointers(env);
  root_ = reader_.getRoot<proto::Envelope>();
}

FrameValidator::FrameValidator(std::string job_id, std::string token, FrameLimits limits)
    : job_id_(std::move(job_id)), token_(std::move(token)), limits_(limits) {}

Rejection FrameValidator::reject(Reject r, std::string detail,
                                 std::shared_ptr<const DecodedFrame> frame) const {
  counters_[size_t(r)].fetch_add(1);
  return Rejection{r, std::move(detail), std::move(frame)};
}

std::variant<std::shared_ptr<const DecodedFrame>, Rejection> FrameValidator::decode(
    Buffer frame, uint64_t from) const {
  const size_t n = frame.size();
  if (n == 0) return reject(Reject::malformed, "empty frame");
  if (n > limits_.max_bytes) {
    return reject(Reject::oversized,
                  std::to_string(n) + " bytes, cap " + std::to_string(limits_.max_bytes));
  }
  if (n % sizeof(capnp::word) != 0) {
    return reject(Reject::malformed, std::to_string(n) + " bytes is not a whole number of words");
  }
  std::shared_ptr<const DecodedFrame> decoded;
  try {
    decoded = std::make_shared<const DecodedFrame>(std::move(frame), limits_);
  } catch (const kj::Exception& e) {
    return reject(Reject::malformed,
                  std::string("not a valid envelope: ") + e.getDescription().cStr());
  } catch (const std::exception& e) {
    return reject(Reject::malformed, std::string("not a valid envelope: ") + e.what());
  }
  auto env = decoded->envelope();
  if (from != 0 && env.getSrcNode() != from) {
    return reject(Reject::spoofed, "srcNode does not match the sending node");
  }
  if (env.getJobId() != job_id_.c_str() || !equal_bytes(env.getToken(), token_)) {
    return reject(Reject::wrong_job, "job id or token does not match job '" + job_id_ + "'",
                  decoded);
  }
  uint64_t current = generation_.load();
  if (env.getGeneration() != 0 && env.getGeneration() < current) {
    return reject(Reject::stale,
                  "generation " + std::to_string(env.getGeneration()) + " is older than " +
                      std::to_string(current),
                  decoded);
  }
  switch (env.getBody().which()) {
    case proto::Envelope::Body::HEARTBEAT:
    case proto::Envelope::Body::ECHO:
    case proto::Envelope::Body::ERROR:
    case proto::Envelope::Body::FENCED:
    case proto::Envelope::Body::STATS_REQUEST:
    case proto::Envelope::Body::STATS:
    case proto::Envelope::Body::JOIN:
    case proto::Envelope::Body::JOB_SPEC:
    case proto::Envelope::Body::WORKER_READY:
    case proto::Envelope::Body::GENERATION_START:
    case proto::Envelope::Body::STEP_REPORT:
    case proto::Envelope::Body::WORKER_DONE:
    case proto::Envelope::Body::SHUTDOWN:
    case proto::Envelope::Body::STATUS_REQUEST:
    case proto::Envelope::Body::STATUS:
    case proto::Envelope::Body::STOP_REQUEST:
    case proto::Envelope::Body::ACK:
    case proto::Envelope::Body::STOP_AT_NEXT_STEP:
    case proto::Envelope::Body::WORKER_FAILED:
    case proto::Envelope::Body::LEAVE_GENERATION:
    case proto::Envelope::Body::DRAIN_REQUEST:
    case proto::Envelope::Body::SCALE_REQUEST:
    case proto::Envelope::Body::STATE_RECEIVED:
    case proto::Envelope::Body::CHECKPOINT_WRITTEN:
    case proto::Envelope::Body::CHECKPOINT_REQUEST:
    case proto::Envelope::Body::CHECKPOINT_AT_STEP:
    case proto::Envelope::Body::TRACE_CHUNK:
    case proto::Envelope::Body::LEARNING_RATE_REQUEST:
    case proto::Envelope::Body::STOP_WITH_CHECKPOINT:
    case proto::Envelope::Body::ABANDON_GENERATION:
    case proto::Envelope::Body::ACCEPTED:
      break;
    default:
      return reject(Reject::unknown_kind,
                    "message kind " + std::to_string(int(env.getBody().which())));
  }
  accepted_.fetch_add(1);
  return decoded;
}

Buffer encode(capnp::MessageBuilder& message) {
  auto segments = message.getSegmentsForOutput();
  size_t words = capnp::computeSerializedSizeInWords(segments);
  Buffer out(words * sizeof(capnp::word));
  kj::ArrayPtr<capnp::word> dst(reinterpret_cast<capnp::word*>(out.data()), words);
  // Write the segment table and segments straight into the aligned buffer.
  kj::ArrayOutputStream stream(dst.asBytes());
  capnp::writeMessage(stream, segments);
  return out;
}

void set_header(proto::Envelope::Builder envelope, const EnvelopeHeader& h) {
  envelope.setJobId(h.job_id);
  envelope.setToken(
      capnp::Data::Reader(reinterpret_cast<const kj::byte*>(h.token.data()), h.token.size()));
  envelope.setGeneration(h.generation);
  envelope.setSrcNode(h.src_node);
  envelope.setSrcActor(h.src_actor);
  envelope.setDstActor(h.dst_actor);
  envelope.setRequestId(h.request_id);
  envelope.setIsReply(h.is_reply);
}

}  // namespace troupe::comm
