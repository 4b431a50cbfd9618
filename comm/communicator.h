// The data plane: collectives for one generation of a job's members.
//
// A Communicator is built from a member list (rank -> address) that the caller supplies (the
// control plane carries it) and belongs to one generation: the generation is part of every
// message's tag, so traffic of an older generation can never be mistaken for the current one.
// Operations are collective and blocking (the calling thread drives the progress, as in gloo);
// each either completes or throws comm::Error within its deadline:
//   peer_lost  a member died or its link broke      -> abort, rebuild with the survivors
//   timed_out  no progress before the deadline       -> (a stopped or hung member) abort, rebuild
//   aborted    abort() was called (from any thread)
//   invalid_input  bad arguments (unknown type, sizes that do not match)
// After any of these the communicator is broken: every later call throws the same error. It
// must be destroyed (never "fixed"); a new one is built for the next generation.
//
// Element types are runtime values (gloo style). Buffers may alias (in place) or not.
// Leaving: a member that exits right after a collective may leave another still waiting for
// the acknowledgement of a send to it (which then fails with peer_lost). End with barrier().
//
// Groups: split(color, key) makes a sub-communicator of the members with the same color (as
// MPI_Comm_split and ncclCommSplit): pipeline stages' replicas, stage neighbours, tensor-parallel
// groups. A group shares its parent's links and fate: a failure or abort in either breaks both
// (the generation is over either way). It must not outlive the generation's communicator.
//
// Thread-safety: one thread calls the operations (of a communicator and all its groups); abort()
// may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/error.h"

namespace troupe::comm {

// i64: exact sums (integer addition is associative: the same bits whatever the order, which
// parallel.deterministic builds on); avg of i64 is refused.
enum class DataType : uint8_t { f32, f64, bf16, f16, i64 };
enum class ReduceOp : uint8_t { sum, avg };

size_t element_size(DataType t);
const char* dtype_name(DataType t);

enum class Algorithm : uint8_t {
  automatic,           // by size: recursive doubling for small buffers, ring for large
  ring,                // reduce-scatter + allgather around a ring, chunked and pipelined
  recursive_doubling,  // log2(n) exchanges of the whole buffer (latency-optimal)
  shared_memory,       // members on one host reduce in segments they all map (else: ring)
};

struct CollectiveOptions {
  Algorithm algorithm = Algorithm::automatic;
  std::chrono::milliseconds timeout{0};  // 0: the communicator's default
};

// The caller's tag of a point-to-point message (pipeline activations, state transfer, ...):
// kBits bits on the wire. A value that does not fit is refused where the Tag is made: at
// compile time for a constexpr Tag (the way callers declare theirs: workers/tags.h), with
// Error(invalid_input) at run time otherwise. Never masked.
class Tag {
 public:
  static constexpr unsigned kBits = 16;
  static constexpr uint32_t kMax = (1u << kBits) - 1;
  constexpr Tag(uint32_t value) : value_(value <= kMax ? value : too_large(value)) {}  // NOLINT
  constexpr uint32_t value() const { return value_; }
  constexpr bool operator==(const Tag& o) const { return value_ == o.value_; }

 private:
  static uint32_t too_large(uint32_t value);  // throws Error(invalid_input); not constexpr
  uint32_t value_;
};

// A buffer of a batched point-to-point transfer.
struct Span {
  void* data;
  size_t bytes;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual uint64_t generation() const = 0;

  // out = op over ranks of in. in == out (or in == nullptr) is in place.
  virtual void allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                         const CollectiveOptions& options = {}) = 0;
  // buf of root is copied into buf of every rank.
  virtual void broadcast(void* buf, size_t count, DataType type, int root,
                         const CollectiveOptions& options = {}) = 0;
  // out (size * count elements) = concatenation of every rank's in (count elements), by rank.
  virtual void allgather(const void* in, void* out, size_t count, DataType type,
                         const CollectiveOptions& options = {}) = 0;
  // out (count elements) = op over ranks of in's slice [rank*count, (rank+1)*count).
  virtual void reduce_scatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                              const CollectiveOptions& options = {}) = 0;
  // Point to point (pipeline stages, state transfer). A receive takes a message of exactly its
  // bytes; another size fails (invalid_input, naming both), as does a collective whose members
  // pass different sizes, where the transport can tell.
  virtual void send(const void* buf, size_t bytes, int peer, Tag tag,
                    const CollectiveOptions& options = {}) = 0;
  virtual void recv(void* buf, size_t bytes, int peer, Tag tag,
                    const CollectiveOptions& options = {}) = 0;
  // Every span to (from) peer, all in flight at once: a batch of buffers (a model block's state)
  // moves at the link's speed instead of one handshake at a time. The receiver's spans must
  // have the sender's sizes, in the same order.
  virtual void send_many(const std::vector<Span>& spans, int peer, Tag tag,
                         const CollectiveOptions& options = {}) = 0;
  virtual void recv_many(const std::vector<Span>& spans, int peer, Tag tag,
                         const CollectiveOptions& options = {}) = 0;
  // Sends to send_peer and receives from recv_peer at once, so two neighbours that exchange
  // (a pipeline's activations one way, gradients the other) never wait on each other. A peer of
  // -1 skips that half. Sends and receives with the same (peer, tag) match in order.
  virtual void sendrecv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                        size_t recv_bytes, int recv_peer, Tag tag,
                        const CollectiveOptions& options = {}) = 0;
  virtual void barrier(const CollectiveOptions& options = {}) = 0;

  // Collective over every member: the members that pass the same color form a group, ranked by
  // (key, rank here). A negative color joins no group and gets nullptr.
  virtual std::unique_ptr<Communicator> split(int color, int key,
                                              const CollectiveOptions& options = {}) = 0;
  // Collective over every member: the group of `ranks` (ranked in that order; every member
  // passes the same list). nullptr on members not in it.
  std::unique_ptr<Communicator> group(const std::vector<int>& ranks,
                                      const CollectiveOptions& options = {});

  // Fails every pending and later operation with Errc::aborted. Any thread, any time.
  virtual void abort() = 0;
};

}  // namespace troupe::comm
