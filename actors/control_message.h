// ControlMessage: a control-plane message as actors see it: a Cap'n Proto Envelope.
//
// Outbound, an actor builds the body (ControlMessage::build) and hands the message to the bridge,
// which fills the header (job, token, generation, source, destination, request id) and encodes
// it, or delivers it in-process without serialising. Inbound, it wraps a frame that
// comm::FrameValidator has fully validated, so reading any field cannot throw.
//
// Thread-safety: an inbound message is immutable and may be shared. An outbound message belongs
// to its sender until it is sent; after that only the bridge touches it.
#pragma once

#include <capnp/message.h>

#include <functional>
#include <memory>

#include "comm/error.h"
#include "comm/frame.h"

namespace troupe::actors {

class ControlMessage {
 public:
  ControlMessage() = default;
  explicit ControlMessage(std::shared_ptr<const comm::DecodedFrame> inbound)
      : in_(std::move(inbound)) {}

  static ControlMessage build(const std::function<void(proto::Envelope::Builder)>& fill) {
    ControlMessage m;
    // Control messages are small: a 512-byte first segment (capnp's default of 8 KiB is zeroed
    // on every allocation, which dominated the cost of a message).
    m.out_ = std::make_shared<capnp::MallocMessageBuilder>(kFirstSegmentWords);
    fill(m.out_->initRoot<proto::Envelope>());
    return m;
  }

  bool valid() const { return in_ || out_; }
  bool inbound() const { return in_ != nullptr; }

  proto::Envelope::Reader envelope() const {
    return in_ ? in_->envelope() : out_->getRoot<proto::Envelope>().asReader();
  }

  // Bridge only: sets the header (copying an inbound message first) and returns the frame.
  comm::Buffer encode(const comm::EnvelopeHeader& header) {
    prepare(header);
    return comm::encode(*out_);
  }
  // Bridge only: sets the header for in-process delivery.
  void prepare(const comm::EnvelopeHeader& header) {
    if (in_) {
      auto copy = std::make_shared<capnp::MallocMessageBuilder>(kFirstSegmentWords);
      copy->setRoot(in_->envelope());
      out_ = std::move(copy);
      in_.reset();
    }
    comm::set_header(out_->getRoot<proto::Envelope>(), header);
  }

 private:
  static constexpr unsigned kFirstSegmentWords = 64;
  std::shared_ptr<capnp::MallocMessageBuilder> out_;
  std::shared_ptr<const comm::DecodedFrame> in_;
};

// Common bodies.
inline ControlMessage make_echo(uint64_t sequence, const void* payload, size_t bytes,
                                const std::string& note = "") {
  return ControlMessage::build([&](proto::Envelope::Builder e) {
    auto echo = e.initBody().initEcho();
    echo.setSequence(sequence);
    echo.setPayload(capnp::Data::Reader(static_cast<const kj::byte*>(payload), bytes));
    echo.setNote(note);
  });
}

inline ControlMessage make_error_reply(comm::Errc code, const std::string& message) {
  return ControlMessage::build([&](proto::Envelope::Builder e) {
    auto err = e.initBody().initError();
    err.setCode(comm::errc_name(code));
    err.setErrc(static_cast<proto::ErrorCode>(code));
    err.setMessage(message);
  });
}

}  // namespace troupe::actors
