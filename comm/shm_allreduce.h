// Allreduce through shared memory, for the members of a communicator that share a host.
//
// Each rank owns one segment (a memfd every other member maps through /proc/PID/fd/FD, the way
// UCX's posix transport does): a header (an identity the others check after mapping, two
// progress counters, the description of the call in progress) and, double-buffered, a staging
// area (the slices of its input that the other ranks reduce) and a result area (the slice it
// reduced). The buffer goes in chunks of n slices. Rank r, for chunk t:
//   1. waits until every rank has staged chunk t                      (staged_q >= t+1)
//   2. reduces slice r: its own input and the others' staged copies, in rank order, into its
//      output and its result area (one pass, or a copy after it: peer_lines; avg: divided
//      first)                                                           -> reduced_r = t+1
//   3. stages chunk t+1 (the slices q != r of its input)                -> staged_r = t+2
//   4. waits until every rank has reduced chunk t, copies their results into its output.
// Step 3 is where a rank that is ahead would otherwise wait for a slow one. (Gathering chunk
// t-1 after reducing t instead, one wait per chunk, was 4-9% slower on the Intel host.) A call
// of at most kSmallBytes is one step instead: publish the input in the header's small area
// (staged), wait for everyone's, sum them all in rank order (every rank: the same bits), then
// reduced. Why no rank overwrites what another still reads: every rank reads a rank's call, small
// area and staging for step s before it stores reduced = s+1, and its result slot for step s before
// it stores staged = s+3. A call starts by waiting until everyone's reduced reaches its first
// step (a small call returns without waiting for that), so the call and small area are free;
// staging slot (t+1)%2 is written only after everyone reduced chunk t-1 (step 4 of t-1, or the
// start of the call), and result slot t%2 only after everyone staged chunk t.
// Calls that differ are found by comparing the published calls, on every rank. Ranks that chose
// different paths (the communicator picks by size, so only a size mismatch does that: one here,
// another over UCX) never see each other's call: every allreduce, whichever path it takes, says
// first which call it is and its size (entered), and a wait that stalls compares them (split).
// Nobody writes into another process's memory or into a caller's buffer but its own, so a
// member that dies or is aborted half way through cannot corrupt a survivor's buffers.
//
// Registered buffers (comm/shared_arena.h): when every rank's buffer of a call of at least
// registered_min_bytes() is in place (in == out) in its arena, which every other rank mapped
// read-only at attach, nothing is staged. Rank r reduces slice r of chunk t straight from the
// others' buffers into its own (reduce_sum_parts, peer_lines) -> reduced_r = t+1, then copies
// slice q of chunk t-1 straight from rank q's buffer once q reduced it; after the last chunk it
// says so (gathered) and returns once everyone has: until then the others may read its buffer.
// Per rank that is 2.5 x the bytes of memory traffic with two ranks instead of 4 x (4.5 x where
// the result is copied after the pass).
// Why nobody reads a slice being rewritten: rank q rewrites slice r of its buffer (gathering)
// only after r reduced it, and its own slice q (reducing) before anyone gathers it.
// Every rank publishes its call, then `announced`; a rank whose own buffer is registered waits
// for everyone's announcement and takes this path only if all are, so all ranks choose alike.
// A rank that gives a registered call up (its idle threw) marks it `abandoned` before its caller
// can touch the buffer again, and every rank checks everyone's mark after it read the others'
// buffers and before it says it gathered: what was read from a buffer being reused is never
// returned as a success (Abandoned: the communicator fails with peer_lost).
//
// Every element is reduced by one rank, adding the ranks' values in rank order: all ranks end
// bitwise equal, and the bits are the same whichever rank reduces it, so whatever the path and
// its slices.
// Thread-safety: one thread per rank calls run().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/error.h"
#include "comm/reduce.h"
#include "comm/shared_arena.h"

namespace troupe::comm {

class ShmAllreduce {
 public:
  // Calls of at most this many bytes go whole through each rank's header: every rank sums all
  // of them (in rank order: the same bits everywhere), one wait instead of chunks.
  static constexpr size_t kSmallBytes = 256;
  // Registered buffers from this size up: below it the registered path's extra wait (everyone
  // gathered) costs more than the staging it saves (by CPU vendor, measured: peer_lines()).
  static size_t registered_min_bytes() { return peer_lines().registered_min_bytes; }
  // The most a segment may take (the slice shrinks to fit): n ranks map n segments.
  static constexpr size_t kMaxSegmentBytes = size_t(16) << 20;
  // The slice size used for n ranks when slice_bytes is asked for (bounded, 64-byte multiple).
  static size_t slice_for(int n, size_t slice_bytes);

  // Creates this rank's segment. identity: a value every member agrees to check after mapping.
  ShmAllreduce(int rank, int n, size_t slice_bytes, uint64_t identity);
  ~ShmAllreduce();
  ShmAllreduce(const ShmAllreduce&) = delete;
  ShmAllreduce& operator=(const ShmAllreduce&) = delete;

  // What the others need to map this rank's segment; -1 if it could not be created (why()).
  int fd() const { return fd_; }
  const std::string& why() const { return why_; }
  // Maps every other rank's segment (pids, fds and identities by rank) and checks that each is
  // the segment that rank made. Returns "" or why it cannot.
  std::string attach(const std::vector<int>& pids, const std::vector<int>& fds,
                     const std::vector<uint64_t>& identities);
  // Registered buffers: this rank's arena (null: none) and every rank's, as SharedArena
  // describes it (fd -1: none), mapped read-only here. Call after attach(). Returns "" or why.
  struct ArenaRef {
    int fd = -1;
    uint64_t bytes = 0, identity = 0;
  };
  std::string attach_arenas(std::shared_ptr<const SharedArena> mine, const std::vector<int>& pids,
                            const std::vector<ArenaRef>& arenas);

  // Called while waiting for the other ranks (spins: how many times in this wait so far). It
  // throws to give up (abort, a lost member, the deadline) and may yield the core.
  using Idle = std::function<void(uint64_t spins)>;
  // Another rank gave the call up; code: why it did (timed_out, peer_lost, aborted, ...).
  class Abandoned : public std::runtime_error {
   public:
    Abandoned(Errc code, const std::string& why) : std::runtime_error(why), code(code) {}
    Errc code;
  };

  // out = in summed (average: divided by n) over the ranks; in == out is in place. Returns ""
  // or, when the ranks called it with different arguments, what differs (then the ranks are
  // out of step: the caller must break the communicator). Throws Abandoned when another rank
  // gave a registered call up (the caller must break the communicator: peer_lost).
  std::string run(const uint8_t* in, uint8_t* out, size_t count, DataType t, bool average,
                  const Idle& idle);
  // This rank entered the communicator's collective number `seq` (every member counts them
  // alike), an allreduce of `bytes`, by whichever path. One store.
  void entered(uint64_t seq, uint64_t bytes);
  // "" or, when another rank entered the same collective as an allreduce of another size (so
  // possibly on another path, where neither sees the other's call), what differs.
  std::string split() const;

  // The slice this rank reads registered buffers in (peer_lines(), else the staged path's).
  size_t registered_slice() const;
  // How many calls went the registered path so far.
  uint64_t registered_calls() const { return registered_calls_; }

 private:
  struct Header;
  Header* header(int rank) const;
  uint8_t* staging(int rank, uint64_t slot, int slice) const;
  uint8_t* result(int rank, uint64_t slot) const;
  // Until every other rank's counter is at least at_least (idle every 32 looks).
  void wait_all(std::atomic<uint64_t> Header::*counter, uint64_t at_least, const Idle& idle);
  std::string mismatch() const;
  std::string run_small(const uint8_t* in, uint8_t* out, size_t count, DataType t, bool average,
                        const Idle& idle);
  // Whether every rank's published call is in place in its arena (after everyone announced).
  bool all_registered() const;
  void run_registered(uint8_t* out, size_t count, DataType t, bool average, const Idle& idle);
  // Throws Abandoned when a rank gave the call in progress up.
  void check_not_abandoned() const;

  int rank_, n_;
  size_t slice_bytes_, bytes_ = 0;
  uint64_t identity_;
  int fd_ = -1;
  std::string why_;
  std::vector<uint8_t*> base_;                // every rank's segment, mapped here
  std::shared_ptr<const SharedArena> arena_;  // this rank's registered buffers (null: none)
  std::vector<const uint8_t*> arenas_;        // every other rank's arena, mapped read-only
  std::vector<uint64_t> arena_bytes_;
  std::vector<std::shared_ptr<const void>> arena_maps_;  // (kept across communicators: .cpp)
  uint64_t step_ = 0;   // chunks done by this rank (all ranks agree)
  uint64_t calls_ = 0;  // run() calls so far
  uint64_t registered_calls_ = 0;
};

}  // namespace troupe::comm
