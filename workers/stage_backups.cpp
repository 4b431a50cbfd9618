#include "workers/stage_backups.h"

#include <algorithm>
#include <cstring>

#include "workers/host_staging.h"
#include "workers/tags.h"

namespace troupe::workers {

std::vector<uint32_t> StageBackups::blocks() const {
  std::vector<uint32_t> out;
  for (uint32_t b = 0; b < backed_up_.size(); ++b)
    if (backed_up_[b]) out.push_back(b);
  return out;
}

std::vector<models::Tensor>& StageBackups::copy_of(uint32_t b, const BlockStates& states) {
  auto sizes = states.sizes(b);  // (the previous stage's moments are not allocated here)
  auto& copy = copies_[b];
  if (copy.size() != sizes.size()) copy.assign(sizes.size(), models::Tensor());
  for (size_t i = 0; i < sizes.size(); ++i)
    if (copy[i].numel() != sizes[i]) copy[i] = models::Tensor({sizes[i]});
  return copy;
}

void StageBackups::take(comm::Communicator& comm, const elastic::Plan& plan, uint32_t stage,
                        uint32_t replica, BlockStates& states, uint64_t step) {
  const uint32_t pp = plan.pp, prev_stage = (stage + pp - 1) % pp;
  const int to = int(elastic::rank_of(plan, (stage + 1) % pp, replica));
  const int from = int(elastic::rank_of(plan, prev_stage, replica));
  std::fill(backed_up_.begin(), backed_up_.end(), false);
  auto send_own = [&] {
    for (uint32_t b = plan.stage_block_begin(stage); b < plan.stage_block_end(stage); ++b)
      for (auto* buf : states.buffers(b)) {
        HostStaged host(static_cast<const models::Tensor&>(*buf));
        comm.send(host.data(), host.bytes(), to, tags::kBackup);
      }
  };
  auto recv_prev = [&] {
    for (uint32_t b = plan.stage_block_begin(prev_stage); b < plan.stage_block_end(prev_stage);
         ++b) {
      for (auto& t : copy_of(b, states))
        comm.recv(t.data(), t.numel() * sizeof(float), from, tags::kBackup);
      backed_up_[b] = true;
    }
  };
  if (stage == 0) {
    send_own();
    recv_prev();
  } else {
    recv_prev();
    send_own();
  }
  for (uint32_t b = plan.stage_block_begin(stage); b < plan.stage_block_end(stage); ++b) {
    auto bufs = states.buffers(b);
    auto& copy = copy_of(b, states);
    for (size_t i = 0; i < bufs.size(); ++i)
      copy_between(copy[i].data(), models::cpu_compute(), bufs[i]->data(), compute_of(*bufs[i]),
                   bufs[i]->bytes());
    backed_up_[b] = true;
  }
  step_ = step;
}

}  // namespace troupe::workers
