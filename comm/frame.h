// Control-plane frames: a Cap'n Proto Envelope (comm/control.capnp) as a flat word array.
//
// decode() is the one door through which bytes from the network become a message. It checks,
// in order: size (empty, not whole words, over the cap), Cap'n Proto structure (the whole
// message read once through its types, with a read budget in proportion to its size and a
// nesting limit, so later reads can neither throw nor cost more than the bytes sent), the
// transport's node id against srcNode, job id and token, generation (older than the current
// one is stale), and a known message kind. Each rejection names its reason and is counted.
//
// Thread-safety: FrameValidator's counters and generation are atomics; decode() may run on any
// thread. DecodedFrame is immutable after construction and may be shared.
#pragma once

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <variant>

#include "comm/buffer.h"
#include "comm/control.capnp.h"

namespace troupe::comm {

enum class Reject {
  malformed = 0,  // empty, not whole words, or not a valid Cap'n Proto envelope
  oversized,      // above the cap
  wrong_job,      // job id or token mismatch
  stale,          // generation older than the current one
  spoofed,        // srcNode differs from the node the transport saw
  unknown_kind,   // a message kind this build does not know
  count_
};
const char* reject_name(Reject r);

struct FrameLimits {
  size_t max_bytes = 16u << 20;
  // Words the validating read may charge per word of the frame (plus 1024). Cap'n Proto
  // charges each object read against it, so what costs the sender nothing (a list of empty
  // structs, many pointers to one object) cannot make a small frame expensive: a 264-byte
  // frame from the fuzzer claimed 581,631 members and took seconds to decode.
  uint64_t read_words_per_word = 4;
  int nesting_limit = 16;
};

// A decoded, fully validated envelope. Holds the aligned bytes and the reader over them.
class DecodedFrame {
 public:
  // Throws kj::Exception when the bytes are not a valid envelope within the limits.
  DecodedFrame(Buffer bytes, const FrameLimits& limits);
  proto::Envelope::Reader envelope() const { return root_; }
  size_t size_bytes() const { return bytes_.size(); }

 private:
  Buffer bytes_;
  capnp::FlatArrayMessageReader reader_;
  proto::Envelope::Reader root_;
};

struct Rejection {
  Reject reason;
  std::string detail;
  // For wrong_job and stale: the envelope itself (well-formed), so the receiver can tell the
  // sender why it is refused instead of leaving it to time out.
  std::shared_ptr<const DecodedFrame> frame;
};

class FrameValidator {
 public:
  FrameValidator(std::string job_id, std::string token, FrameLimits limits = {});

  // from: the node the transport received it from (0: skip the check, e.g. local delivery).
  std::variant<std::shared_ptr<const DecodedFrame>, Rejection> decode(Buffer frame,
                                                                      uint64_t from) const;

  void set_generation(uint64_t g) { generation_.store(g); }
  uint64_t generation() const { return generation_.load(); }
  const std::string& job_id() const { return job_id_; }
  const std::string& token() const { return token_; }
  uint64_t rejected(Reject r) const { return counters_[size_t(r)].load(); }
  uint64_t accepted() const { return accepted_.load(); }

 private:
  Rejection reject(Reject r, std::string detail,
                   std::shared_ptr<const DecodedFrame> frame = nullptr) const;

  std::string job_id_;
  std::string token_;
  FrameLimits limits_;
  std::atomic<uint64_t> generation_{0};
  mutable std::array<std::atomic<uint64_t>, size_t(Reject::count_)> counters_{};
  mutable std::atomic<uint64_t> accepted_{0};
};

// Whether a body of this kind holds no pointer below its own struct (decode reads those kinds by
// hand, the others generically; a test holds this list to the schema).
bool body_is_flat(proto::Envelope::Body::Which kind);

// Serialises a built message into a frame.
Buffer encode(capnp::MessageBuilder& message);

// Fills the envelope's header fields.
struct EnvelopeHeader {
  std::string job_id;
  std::string token;
  uint64_t generation = 0;
  uint64_t src_node = 0;
  uint64_t src_actor = 0;
  uint64_t dst_actor = 0;
  uint64_t request_id = 0;
  bool is_reply = false;
};
void set_header(proto::Envelope::Builder envelope, const EnvelopeHeader& header);

}  // namespace troupe::comm
