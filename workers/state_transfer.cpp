#include "workers/state_transfer.h"

#include <chrono>
#include <memory>

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

// A batch this rank received in full: counted, and its blocks held as of the start (only now: a
// transfer that fails half way leaves them stale).
void received(StateTransfer& t, const elastic::StateBatch& batch, BlockStates& states,
              uint64_t start) {
  t.needed = true;
  t.blocks += uint32_t(batch.blocks.size());
  for (uint32_t b : batch.blocks) {
    for (models::Tensor* buf : states.buffers(b)) t.bytes += buf->bytes();
    states.hold(b, start);
  }
}

// A batch over the device plane: device addresses at both ends, nothing staged through host
// memory (a sender's snapshot or backup, in host memory, goes up to its device first). The
// device's pending writes finish before the plane's stream reads or writes the buffers.
void device_batch(comm::Communicator& device, const elastic::StateBatch& batch, uint32_t me,
                  BlockStates& states, StageBackups& backups,
                  const std::function<void()>& mid_send) {
  std::vector<comm::Span> spans;
  std::vector<std::unique_ptr<models::Memory>> uploaded;
  models::Compute* on = nullptr;
  for (size_t k = 0; k < batch.blocks.size(); ++k) {
    const uint32_t b = batch.blocks[k];
    auto bufs = states.buffers(b);
    for (size_t i = 0; i < bufs.size(); ++i) {
      on = &compute_of(*bufs[i]);
      TROUPE_ENFORCE(on->device() != models::Device::cpu, "a device plane with a host buffer");
      const size_t bytes = bufs[i]->bytes();
      if (batch.to == me) {
        spans.push_back({bufs[i]->data(), bytes});
        continue;
      }
      Source at = copy_data(batch.copies[k], b, i, states, backups);
      if (at.on->device() == models::Device::cpu) {
        uploaded.push_back(on->allocate(bytes));
        on->from_host(uploaded.back()->data(), at.data, bytes);
        at.data = static_cast<float*>(uploaded.back()->data());
      }
      spans.push_back({at.data, bytes});
    }
  }
  if (on) on->synchronize();
  if (batch.from == me)
    send_batch(device, std::move(spans), int(batch.to), mid_send);
  else
    device.recv_many(spans, int(batch.from), tags::kState);
}

}  // namespace

StateTransfer execute_migration(comm::Communicator& comm, const elastic::Migration& mig,
                                uint64_t start, BlockStates& states, StageBackups& backups,
                                const std::function<void()>& mid_send, comm::Communicator* device) {
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
    if (device) {
      device_batch(*device, batch, me, states, backups, mid_send);
      if (batch.to == me) received(t, batch, states, start);
      continue;
    }
    // Host-staged where a buffer is on a device: sent from a host copy, received into one and
    // copied to the device after.
    std::vector<comm::Span> spans;
    std::vector<std::vector<float>> staged;
    std::vector<std::pair<models::Tensor*, size_t>> staged_in;  // (device buffer, staged index)
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
            staged_in.emplace_back(bufs[i], staged.size() - 1);
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
    for (auto& [dev, k] : staged_in)
      compute_of(*dev).from_host(dev->data(), staged[k].data(), dev->bytes());
    received(t, batch, states, start);
  }
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

}  // namespace troupe::workers
