#include "workers/state_transfer.h"

#include <chrono>
#include <cstring>

#include "workers/tags.h"

namespace troupe::workers {
namespace {

// This rank's copy of block b's buffer i as of the start step.
float* copy_data(elastic::Copy copy, uint32_t b, size_t i, BlockStates& states,
                 StageBackups& backups) {
  switch (copy) {
    case elastic::Copy::live:
      states.materialize(b);  // (held as of step 0: made from the seed when first needed)
      return states.buffers(b)[i]->data();
    case elastic::Copy::snapshot:
      return states.snapshot_data(b, i);
    case elastic::Copy::backup:
      return backups.data(b, i);
  }
  return nullptr;
}

void send_batch(comm::Communicator& comm, std::vector<comm::Span> spans, int to,
                const std::function<void()>& mid_send) {
  if (mid_send && !spans.empty()) {
    comm.send(spans[0].data, spans[0].bytes, to, tags::kState);
    mid_send();
    spans.erase(spans.begin());
  }
  comm.send_many(spans, to, tags::kState);
}

}  // namespace

StateTransfer execute_migration(comm::Communicator& comm, const elastic::Migration& mig,
                                uint64_t start, BlockStates& states, StageBackups& backups,
                                const std::function<void()>& mid_send) {
  StateTransfer t;
  const auto t0 = std::chrono::steady_clock::now();
  const uint32_t me = uint32_t(comm.rank());
  for (const auto& r : mig.restores) {
    if (r.rank != me) continue;
    auto bufs = states.buffers(r.block);
    for (size_t i = 0; i < bufs.size(); ++i)
      std::memcpy(bufs[i]->data(), copy_data(r.copy, r.block, i, states, backups),
                  bufs[i]->numel() * sizeof(float));
    states.hold(r.block, start);
  }
  for (const auto& batch : mig.batches) {
    if (batch.from != me && batch.to != me) continue;
    std::vector<comm::Span> spans;
    for (size_t k = 0; k < batch.blocks.size(); ++k) {
      const uint32_t b = batch.blocks[k];
      auto bufs = states.buffers(b);
      for (size_t i = 0; i < bufs.size(); ++i) {
        float* data =
            batch.from == me ? copy_data(batch.copies[k], b, i, states, backups) : bufs[i]->data();
        spans.push_back({data, bufs[i]->numel() * sizeof(float)});
      }
    }
    if (batch.from == me) {
      send_batch(comm, std::move(spans), int(batch.to), mid_send);
      continue;
    }
    comm.recv_many(spans, int(batch.from), tags::kState);
    t.needed = true;
    t.blocks += uint32_t(batch.blocks.size());
    for (const auto& sp : spans) t.bytes += sp.bytes;
    // Held only once all of it is here (a transfer that fails half way leaves it stale).
    for (uint32_t b : batch.blocks) states.hold(b, start);
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

}  // namespace troupe::workers
