// Allreduce through shared memory, for the members of a communicator that share a host.
//
// Each rank owns one segment (a memfd every other member maps through /proc/PID/fd/FD, the way
// UCX's posix transport does): three progress counters and, double-buffered, a staging area
// (the slices of its input that other ranks reduce) and a result area (the slice it reduced).
// The buffer is processed in chunks of n slices; for chunk t rank r
//   1. copies the slices q != r of its input into its staging area       -> staged_r = t+1
//   2. reduces slice r: its own input, then every other rank's staged copy in rank order, into
//      its output, copied to its result area (avg: divided first)        -> reduced_r = t+1
//   3. copies the other ranks' results into its output                   -> gathered_r = t+1
// and before it overwrites a slot of chunk t-2 it waits until every rank is done reading it.
// Nobody ever writes into another process's memory or into a caller's buffer but its own, so a
// member that dies or is aborted half way through cannot corrupt a survivor's buffers.
//
// Compared with the ring over UCX (rendezvous: the kernel copies between processes, page by
// page, one handshake per chunk) this costs plain memcpy's and flag writes, and each rank reads
// its own input once: the same memory traffic as the ring, at memcpy speed.
//
// Every element is reduced by one rank, in a fixed order: all ranks end bitwise equal.
// Thread-safety: one thread per rank calls run().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace troupe::comm {

class ShmAllreduce {
 public:
  // Creates this rank's segment (slice_bytes: the most each rank reduces per chunk).
  ShmAllreduce(int rank, int n, size_t slice_bytes);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // What the others need to map this rank's segment; -1 if it could not be created.
  int fd() const { return fd_; }
  // Maps every other rank's segment (pids and fds by rank). Returns "" or why it cannot.
  std::string attach(const std::vector<int>& pids, const std::vector<int>& fds);

  // Called while waiting for the other ranks (spins: how many times in this wait so far). It
  // throws to give up (abort, a lost member, the deadline) and may yield the core.
  using Idle = std::function<void(uint64_t spins)>;

  // out = in summed (average: divided by n) over the ranks; in == out is in place.
  void run(const uint8_t* in, uint8_t* out, size_t count, DataType t, bool average,
           const Idle& idle);

 private:
  struct Counters;
  Counters* counters(int rank) const;
  uint8_t* staging(int rank, uint64_t slot, int slice) const;
  uint8_t* result(int rank, uint64_t slot) const;
  template <typename Ready>
  void wait(Ready ready, const Idle& idle);

  int rank_, n_;
  size_t slice_bytes_, bytes_ = 0;
  int fd_ = -1;
  std::vector<uint8_t*> base_;  // every rank's segment, mapped here
  uint64_t step_ = 0;           // chunks done by this rank (all ranks agree)
};

}  // namespace troupe::comm
