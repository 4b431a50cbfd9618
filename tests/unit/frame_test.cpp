// Every way a control-plane frame can be bad is rejected, named and counted; a good one passes.
#include "comm/frame.h"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <random>

namespace troupe::comm {
namespace {

Buffer make_frame(const EnvelopeHeader& h, size_t payload_bytes = 16) {
  capnp::MallocMessageBuilder b;
  auto env = b.initRoot<proto::Envelope>();
  set_header(env, h);
  auto echo = env.initBody().initEcho();
  echo.setSequence(42);
  std::vector<kj::byte> payload(payload_bytes, 7);
  echo.setPayload(capnp::Data::Reader(payload.data(), payload.size()));
  echo.setNote("hi");
  return encode(b);
}

EnvelopeHeader good_header() {
  EnvelopeHeader h;
  h.job_id = "job";
  h.token = "secret";
  h.generation = 3;
  h.src_node = 99;
  h.dst_actor = 1;
  return h;
}

// One of the frame fuzzer's inputs (tests/unit/data/NAME, made for job "fuzz", token
// "fuzz-token"), decoded: it must be rejected, not throw.
Rejection fuzz_find(const std::string& name) {
  std::ifstream in(std::string(TROUPE_SOURCE_DIR) + "/tests/unit/data/" + name, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_FALSE(bytes.empty()) << name;
  FrameValidator fuzz("fuzz", "fuzz-token");
  auto r = fuzz.decode(Buffer::copy_of(bytes.data(), bytes.size()), 7);
  if (auto* rejection = std::get_if<Rejection>(&r)) return *rejection;
  ADD_FAILURE() << name << " was accepted";
  return Rejection{Reject::count_, "accepted", nullptr};
}

class FrameTest : public ::testing::Test {
 protected:
  FrameValidator v{"job", "secret", FrameLimits{1 << 16}};

  Reject rejected(Buffer frame, uint64_t from = 99) {
    auto r = v.decode(std::move(frame), from);
    EXPECT_TRUE(std::holds_alternative<Rejection>(r)) << "frame was accepted";
    if (!std::holds_alternative<Rejection>(r)) return Reject::count_;
    EXPECT_FALSE(std::get<Rejection>(r).detail.empty());
    return std::get<Rejection>(r).reason;
  }
};

TEST_F(FrameTest, GoodFrameRoundTrips) {
  v.set_generation(3);
  auto r = v.decode(make_frame(good_header()), 99);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const DecodedFrame>>(r));
  auto env = std::get<std::shared_ptr<const DecodedFrame>>(r)->envelope();
  EXPECT_EQ(env.getGeneration(), 3u);
  EXPECT_EQ(env.getBody().getEcho().getSequence(), 42u);
  EXPECT_EQ(std::string(env.getBody().getEcho().getNote().cStr()), "hi");
  EXPECT_EQ(v.accepted(), 1u);
}

// A text without its terminating NUL (found by the frame fuzzer: it threw out of decode and ended
// the process) is malformed, anywhere in the envelope.
TEST_F(FrameTest, ATextWithoutItsNulIsMalformedNotAThrow) {
  EnvelopeHeader h = good_header();
  Buffer b = make_frame(h);
  // The note "hi" is the last text of the frame: its NUL is the byte after "hi".
  uint8_t* at = static_cast<uint8_t*>(::memmem(b.data(), b.size(), "hi", 3));
  ASSERT_NE(at, nullptr);
  at[2] = 'x';
  EXPECT_EQ(rejected(std::move(b)), Reject::malformed);
  // And the fuzzer's own input.
  EXPECT_EQ(fuzz_find("frame-unterminated-text.bin").reason, Reject::malformed);
}

// The fuzzer's second find: a token that is a list of words, not of bytes.
TEST(FrameFuzzFinds, ABlobOfWordsIsMalformedNotAThrow) {
  EXPECT_EQ(fuzz_find("frame-token-not-bytes.bin").reason, Reject::malformed);
}

// The kinds decode reads by hand really hold no pointer below their struct (checked against the
// schema), and echo's pointers are the two it reads: a pointer added later fails here instead of
// slipping past the check.
TEST(FrameSchema, KindsReadByHandHoldNoOtherPointer) {
  auto pointers = [](capnp::StructSchema s) {
    std::vector<std::string> out;
    for (auto f : s.getFields()) {
      if (f.getProto().isGroup()) continue;  // a group lives in its parent's sections
      auto t = f.getType();
      if (t.isText() || t.isData() || t.isList() || t.isStruct() || t.isAnyPointer() ||
          t.isInterface())
        out.push_back(f.getProto().getName().cStr());
    }
    return out;
  };
  auto body = capnp::Schema::from<proto::Envelope::Body>();
  int flat = 0;
  for (auto f : body.getUnionFields()) {
    auto kind = proto::Envelope::Body::Which(f.getProto().getDiscriminantValue());
    if (!body_is_flat(kind)) continue;
    ++flat;
    auto t = f.getType();
    if (t.isStruct())
      EXPECT_TRUE(pointers(t.asStruct()).empty()) << f.getProto().getName().cStr();
    else
      EXPECT_FALSE(t.isText() || t.isData() || t.isList()) << f.getProto().getName().cStr();
  }
  EXPECT_EQ(flat, 15);
  EXPECT_EQ(pointers(capnp::Schema::from<proto::Echo>()),
            (std::vector<std::string>{"payload", "note"}));
  EXPECT_EQ(pointers(capnp::Schema::from<proto::Envelope>()),
            (std::vector<std::string>{"jobId", "token"}));
}

// Every kind of the schema is one the validator lets through: a kind added to the schema and
// not to the validator is dropped as unknown by every receiver (a stop that never arrived).
TEST_F(FrameTest, EveryKindOfTheSchemaIsAccepted) {
  v.set_generation(3);
  auto schema = capnp::Schema::from<proto::Envelope::Body>();
  for (auto f : schema.getUnionFields()) {
    capnp::MallocMessageBuilder b;
    auto env = b.initRoot<proto::Envelope>();
    set_header(env, good_header());
    capnp::toDynamic(env.initBody()).clear(f);  // (this kind, with its defaults)
    auto r = v.decode(encode(b), 99);
    const auto* no = std::get_if<Rejection>(&r);
    EXPECT_TRUE(no == nullptr || no->reason != Reject::unknown_kind)
        << f.getProto().getName().cStr() << ": " << no->detail;
  }
}

TEST_F(FrameTest, EmptyFrameIsMalformed) { EXPECT_EQ(rejected(Buffer()), Reject::malformed); }

TEST_F(FrameTest, PartialWordIsMalformed) {
  Buffer good = make_frame(good_header());
  EXPECT_EQ(rejected(Buffer::copy_of(good.data(), good.size() - 3)), Reject::malformed);
}

TEST_F(FrameTest, EveryTruncationIsRejected) {
  Buffer good = make_frame(good_header());
  for (size_t n = 8; n < good.size(); n += 8) {
    EXPECT_EQ(rejected(Buffer::copy_of(good.data(), n)), Reject::malformed) << "prefix " << n;
  }
  EXPECT_EQ(v.rejected(Reject::malformed), good.size() / 8 - 1);
}

TEST_F(FrameTest, RandomBytesNeverCrashAndAreRejected) {
  std::mt19937_64 rng(12345);
  int accepted = 0;
  for (int i = 0; i < 2000; ++i) {
    size_t words = 1 + rng() % 64;
    Buffer b(words * 8);
    for (size_t j = 0; j < b.size(); ++j) b.data()[j] = static_cast<uint8_t>(rng());
    auto r = v.decode(std::move(b), 99);
    accepted += std::holds_alternative<std::shared_ptr<const DecodedFrame>>(r);
  }
  EXPECT_EQ(accepted, 0);
}

TEST_F(FrameTest, OversizedIsRejectedBeforeParsing) {
  EXPECT_EQ(rejected(make_frame(good_header(), 70000)), Reject::oversized);
}

// The fuzzer's third find: 264 bytes whose generationStart claims 581,631 members, each an
// empty struct (which costs the sender nothing). Read within a fixed 4 Mi-word budget it took
// seconds, and the codec's later read ran out of budget and threw; read within a budget in
// proportion to the frame it is malformed at once.
TEST(FrameFuzzFinds, AListOfEmptyStructsIsMalformed) {
  Rejection r = fuzz_find("frame-empty-structs.bin");
  EXPECT_EQ(r.reason, Reject::malformed);
  EXPECT_NE(r.detail.find("traversal limit"), std::string::npos) << r.detail;
}

// A frame that passed decode can be read any number of times: the budget bounds the validating
// read only (an actor that reads a 4 KiB frame 10,000 times reads 5 Mi words).
TEST_F(FrameTest, AnAcceptedFrameCanBeReadAgainAndAgain) {
  auto r = v.decode(make_frame(good_header(), 4096), 99);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<const DecodedFrame>>(r));
  auto frame = std::get<std::shared_ptr<const DecodedFrame>>(r);
  size_t bytes = 0;
  for (int i = 0; i < 10000; ++i)
    bytes += frame->envelope().getBody().getEcho().getPayload().size();
  EXPECT_EQ(bytes, 4096u * 10000);
}

TEST_F(FrameTest, WrongTokenAndWrongJobAreRejected) {
  auto h = good_header();
  h.token = "guess";
  EXPECT_EQ(rejected(make_frame(h)), Reject::wrong_job);
  h = good_header();
  h.job_id = "other-job";
  EXPECT_EQ(rejected(make_frame(h)), Reject::wrong_job);
  EXPECT_EQ(v.rejected(Reject::wrong_job), 2u);
}

TEST_F(FrameTest, StaleGenerationIsRejected) {
  v.set_generation(5);
  auto h = good_header();
  h.generation = 4;
  EXPECT_EQ(rejected(make_frame(h)), Reject::stale);
  h.generation = 0;  // not generation-scoped (a join): accepted
  EXPECT_TRUE(
      std::holds_alternative<std::shared_ptr<const DecodedFrame>>(v.decode(make_frame(h), 99)));
  h.generation = 6;  // newer: accepted (the receiver learns of it through the membership actor)
  EXPECT_TRUE(
      std::holds_alternative<std::shared_ptr<const DecodedFrame>>(v.decode(make_frame(h), 99)));
}

TEST_F(FrameTest, SpoofedSourceIsRejected) {
  EXPECT_EQ(rejected(make_frame(good_header()), /*from=*/100), Reject::spoofed);
}

TEST(FrameEncode, FramesAreWordAlignedAndWholeWords) {
  Buffer b = make_frame(good_header(), 5);
  EXPECT_EQ(b.size() % 8, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % Buffer::kAlignment, 0u);
}

}  // namespace
}  // namespace troupe::comm
