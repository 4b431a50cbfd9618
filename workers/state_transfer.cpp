#include "workers/state_transfer.h"

#include <chrono>

#include "workers/host_staging.h"
#include "workers/tags.h"

namespace troupe::workers {
namespace {

// This rank's copy of block b's buffer i as of the start step, and the Compute whose memory it
// is in (a live buffer may be on a device; snapshots and backups are in host memory).
struct Source {
  float* data;
  models::Compute* on;
};
Source copy_data(elastic::Copy copy, uint32_t b, size_t i, BlockStates& states,
                 StageBackups& backups) {
  switch (copy) {
    case elastic::Copy::live: {
      states.materialize(b);  // (held as of step 0: made from the seed when first needed)
      models::Tensor* t = states.buffers(b)[i];
      return {t->data(), &compute_of(*t)};
    }
    case elastic::Copy::snapshot:
      return {states.snapshot_data(b, i), &models::cpu_compute()};
    case elastic::Copy::backup:
      return {backups.data(b, i), &models::cpu_compute()};
  }
  return {nullptr, &models::cpu_compute()};
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
    for (size_t i = 0; i < bufs.size(); ++i) {
      const Source src = copy_data(r.copy, r.block, i, states, backups);
      copy_between(bufs[i]->data(), compute_of(*bufs[i]), src.data, *src.on, bufs[i]->bytes());
    }
    states.hold(r.block, start);
  }
  for (const auto& batch : mig.batches) {
    if (batch.from != me && batch.to != me) continue;
    // Host-staged where a buffer is on a device: sent from a host copy, received into one and
    // copied to the device after.
    std::vector<comm::Span> spans;
    std::vector<std::vector<float>> staged;
    std::vector<std::pair<models::Tensor*, size_t>> received;  // (device buffer, staged index)
    staged.reserve(batch.blocks.size() * 3);
    for (size_t k = 0; k < batch.blocks.size(); ++k) {
      const uint32_t b = batch.blocks[k];
      auto bufs = states.buffers(b);
      for (size_t i = 0; i < bufs.size(); ++i) {
        const size_t bytes = bufs[i]->bytes();
        Source at = batch.from == me ? copy_data(batch.copies[k], b, i, states, backups)
                                     : Source{bufs[i]->data(), &compute_of(*bufs[i])};
        if (at.on->device() != models::Device::cpu) {
          staged.emplace_back(bufs[i]->numel());
          if (batch.from == me)
            at.on->to_host(staged.back().data(), at.data, bytes);
          else
            received.emplace_back(bufs[i], staged.size() - 1);
          at.data = staged.back().data();
        }
        spans.push_back({at.data, bytes});
      }
    }
    if (batch.from == me) {
      send_batch(comm, std::move(spans), int(batch.to), mid_send);
      continue;
    }
    comm.recv_many(spans, int(batch.from), tags::kState);
    for (auto& [dev, k] : received)
      compute_of(*dev).from_host(dev->data(), staged[k].data(), dev->bytes());
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
