// The UCX backend's algorithms as free functions over a group (as gloo's): recursive doubling,
// the chunked ring (reduce-scatter, allgather), a binomial-tree broadcast and a dissemination
// barrier. Internal to comm/. Every element is reduced by exactly one rank, or in the same
// order on every rank, so all ranks end bitwise equal.
#pragma once

#include <memory>
#include <vector>

#include "comm/buffer.h"
#include "comm/ucx_link.h"

namespace troupe::comm::ucx {

// Some members of a Link: the whole communicator (context 0) or a group made by split().
struct Group {
  std::shared_ptr<Link> link;
  uint32_t context = 0;
  std::vector<int> members;  // group rank -> link rank
  int rank = 0;              // this member's group rank
  uint32_t seq = 0;          // collectives so far (part of their tags)
  Buffer scratch;

  int size() const { return int(members.size()); }
  int mod(int x) const { return ((x % size()) + size()) % size(); }
  uint64_t tag(uint64_t kind, uint64_t seq_or_tag, int src, uint64_t slot) const {
    return make_tag(link->generation(), context, kind, seq_or_tag, uint64_t(src), slot);
  }
  Request isend(int peer, const void* buf, size_t bytes, uint64_t tag) {
    return link->isend(members[size_t(peer)], buf, bytes, tag);
  }
  Request irecv(void* buf, size_t bytes, uint64_t tag) { return link->irecv(buf, bytes, tag); }
  uint8_t* scratch_of(size_t bytes) {
    if (scratch.size() < bytes) scratch = Buffer(bytes);
    return scratch.data();
  }
};

// The n segments a buffer of count elements is cut into for the ring (balanced).
struct Segments {
  std::vector<size_t> offset, count;  // in elements
};
Segments split_evenly(size_t count, int n);
Segments equal_segments(size_t count, int n);  // n segments of count elements each

using Millis = std::chrono::milliseconds;

// buf = sum over the group, in place: log2(n) exchanges of the whole buffer (small buffers).
void allreduce_recursive_doubling(Group& g, uint8_t* buf, size_t count, DataType t, uint64_t s,
                                  Millis to);
// Ring reduce-scatter over buf's n segments: at step k rank r sends segment (r-k+off) and
// reduces the received segment (r-k-1+off); at the end it owns segment (r+1+off) reduced. Each
// step is chunked into segment_bytes messages with a window of chunks in flight, so reducing one
// chunk overlaps receiving the next.
void ring_reduce_scatter(Group& g, uint8_t* buf, const Segments& sg, DataType t, int off,
                         uint64_t s, Millis to);
// Ring allgather of segments: at step k rank r sends segment (r-k+off), receives (r-k-1+off).
void ring_allgather(Group& g, uint8_t* buf, const Segments& sg, size_t es, int off, uint64_t s,
                    uint64_t phase, Millis to);
// buf of root to everyone, down a binomial tree.
void broadcast_binomial(Group& g, uint8_t* buf, size_t bytes, int root, uint64_t s, Millis to);
// log2(n) rounds of one-byte messages.
void barrier_dissemination(Group& g, uint64_t s, Millis to);

}  // namespace troupe::comm::ucx
