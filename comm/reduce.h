// Element-wise reductions for the collectives, written so the compiler vectorises them.
#pragma once

#include <cstddef>

#include "comm/communicator.h"

namespace troupe::comm {

// Throws invalid_input for a reduction the type has no meaning for (avg of i64).
void check_reduction(DataType t, ReduceOp op);
// acc[i] += in[i] for count elements of type t (bf16/f16 accumulate in float, round once).
void reduce_sum(void* acc, const void* in, size_t count, DataType t);
// out[i] = a[i] + b[i] (out may be a or b): one pass where a copy and a reduce_sum take two.
void reduce_sum_into(void* out, const void* a, const void* b, size_t count, DataType t);
// buf[i] /= divisor
void scale_down(void* buf, size_t count, DataType t, int divisor);
// How a reduction stores lines that other cores read next: in its pass with ordinary or with
// streamed stores, or (a copy only) copied after the pass (memcpy: rep movsb).
enum class Store { ordinary, streamed, copied_after };
// How this CPU best handles lines shared between cores (chosen by vendor, each measured: see
// reduce.cpp): the store kind for a result other cores read next (`store`), and for a second
// copy of a result, published for them (`publish`); how far ahead to prefetch lines another
// core wrote (0: leave it to the hardware).
struct PeerLines {
  const char* name;  // whose choice: "intel" or "amd"
  Store store;
  Store publish;
  size_t prefetch_bytes;
  // Registered buffers read in place from this many bytes up (comm/shm_allreduce.h): below it the
  // staged path is as fast (the registered path's extra wait costs what the staging saves).
  size_t registered_min_bytes;
  // The slice a rank reduces of registered buffers at a time (0: the staged path's slice).
  size_t registered_slice_bytes;
};
const PeerLines& peer_lines();
// memcpy of lines another core wrote, prefetched as peer_lines() says.
void copy_from_peer(void* dst, const void* src, size_t bytes);
// out[i] = ((parts[0][i] + parts[1][i]) + parts[2][i]) + ..., divided by `divisor` unless it is
// 1: the bits of reduce_sum_into, reduce_sum and scale_down in that order; stored to out and,
// when copy is not null, to copy as well, each as its Store says (out: not copied_after). f32
// goes in one pass over all the parts (all but parts[own], this core's, are taken to be another
// core's: prefetched as peer_lines() says; own -1: none is); other types stepwise through a
// buffer, copied after. Streamed stores are non-temporal: whole cache lines written without
// reading them first (a line another core read would otherwise be fetched back for ownership),
// sent towards memory. out may be any one of the parts; copy must not overlap out or the parts.
void reduce_sum_parts(void* out, Store out_store, void* copy, Store copy_store,
                      const void* const* parts, int nparts, int own, size_t count, DataType t,
                      int divisor);

}  // namespace troupe::comm
