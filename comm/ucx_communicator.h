// The UCX backend of the Communicator (CPU memory): tagged messages between the workers of one
// generation, over shared memory (sysv/posix, cma zero-copy for rendezvous) or tcp.
//
// Building one is two steps, because every member must know every other's address first:
//   UcxCommunicator c(generation, options);   // a fresh UCX worker
//   publish(c.address());                     // the caller's business (control plane, files)
//   c.connect(rank, addresses_by_rank);        // endpoints to everyone, then a barrier
//
// Algorithms: allreduce by recursive doubling (small buffers: log2 n exchanges) or a ring
// (reduce-scatter + allgather, each step chunked into segment_bytes messages, with a window of
// chunks in flight so that reducing one chunk overlaps receiving the next); when every member
// is on this host, larger allreduces go through segments every member maps (ShmAllreduce:
// plain copies instead of the kernel's cross-process copies and a handshake per chunk). Every
// element is reduced by exactly one rank, or in the same order everywhere, so all ranks end
// bitwise equal.
//
// Failure: endpoints use peer error handling; a dead member fails the operation with peer_lost
// at once; no progress for `timeout` fails it with timed_out. On any failure the outstanding
// receives are cancelled and the endpoints closed before the call returns, so no late message
// can write into the caller's buffers.
//
// Parts (internal): ucx_link.h (worker, endpoints, requests, the give-up policy, failure
// notices), ucx_algorithms.h (the algorithms as free functions over a group),
// shm_allreduce.h, host_identity.h. Groups (split) share the Link and use the algorithms over
// UCX messages (the shared-memory allreduce is the whole communicator's).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/shared_arena.h"

namespace troupe::comm {

struct UcxCommOptions {
  std::chrono::milliseconds timeout{30000};  // no progress for this long: timed_out
  size_t segment_bytes = 256u << 10;         // ring chunk size (256 KiB measured best here)
  size_t window = 4;                         // ring chunks in flight per step
  size_t small_bytes = 32u << 10;            // automatic: below this, recursive doubling
  bool shared_memory = true;
  // Allreduce through shared memory when every member is on this host (comm/shm_allreduce.h):
  // the most each rank reduces per chunk, and the smallest buffer chunked through it (calls of
  // at most ShmAllreduce::kSmallBytes go through it whole; recursive doubling in between).
  size_t shm_slice_bytes = 128u << 10;
  size_t shm_min_bytes = 8u << 10;
  // Registered buffers (comm/shared_arena.h): an in-place allreduce of a buffer in this arena,
  // when every member's is in its own, reads the others' buffers directly instead of staging
  // copies (the arena must outlive the communicator; null: none).
  std::shared_ptr<const SharedArena> registered;
};

class UcxCommunicator : public Communicator {
 public:
  UcxCommunicator(uint64_t generation, const UcxCommOptions& options = {});
  ~UcxCommunicator() override;

  // This member's address (hex of the UCX worker address), to hand to the others.
  std::string address() const;
  // Connects to every member (addresses by rank; this rank's entry is its own) and waits at a
  // barrier for all of them, up to timeout.
  void connect(int rank, const std::vector<std::string>& addresses,
               std::chrono::milliseconds timeout);

  // Whether allreduce can go through shared memory (every member on this host, segments mapped).
  bool shared_memory_allreduce() const;
  // Why not, when it cannot ("" when it can).
  std::string shared_memory_fallback_reason() const;
  // How many allreduces read the members' registered buffers in place (UcxCommOptions::registered).
  uint64_t registered_allreduces() const;

  int rank() const override;
  int size() const override;
  uint64_t generation() const override;
  void allreduce(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                 const CollectiveOptions& options = {}) override;
  void broadcast(void* buf, size_t count, DataType type, int root,
                 const CollectiveOptions& options = {}) override;
  void allgather(const void* in, void* out, size_t count, DataType type,
                 const CollectiveOptions& options = {}) override;
  void reduce_scatter(const void* in, void* out, size_t count, DataType type, ReduceOp op,
                      const CollectiveOptions& options = {}) override;
  void send(const void* buf, size_t bytes, int peer, Tag tag,
            const CollectiveOptions& options = {}) override;
  void recv(void* buf, size_t bytes, int peer, Tag tag,
            const CollectiveOptions& options = {}) override;
  void send_many(const std::vector<Span>& spans, int peer, Tag tag,
                 const CollectiveOptions& options = {}) override;
  void recv_many(const std::vector<Span>& spans, int peer, Tag tag,
                 const CollectiveOptions& options = {}) override;
  void sendrecv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                size_t recv_bytes, int recv_peer, Tag tag,
                const CollectiveOptions& options = {}) override;
  void barrier(const CollectiveOptions& options = {}) override;
  std::unique_ptr<Communicator> split(int color, int key,
                                      const CollectiveOptions& options = {}) override;
  void abort() override;

 private:
  struct Impl;
  explicit UcxCommunicator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::comm
