#include "workers/block_state.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "models/state.h"
#include "workers/checkpoint_writer.h"
#include "workers/host_staging.h"

namespace troupe::workers {

BlockStates::BlockStates(models::Model& model, models::Optimizer& opt, const Origin& origin,
                         bool lazy)
    : model_(model), opt_(opt), origin_(origin) {
  const size_t n = model.num_blocks();
  // Every worker of the first generation starts from the same initial state (a pure function of
  // the seed, or the checkpoint's); one that skipped it holds nothing until it receives the state.
  const bool init = origin.init_state;
  held_at_.assign(n, init ? (origin.checkpoint.empty() ? 0 : origin.step) : kStale);
  pending_init_.assign(n, init);
  snap_at_.assign(n, kStale);
  snap_.resize(n);
  if (init && !lazy)
    for (uint32_t b = 0; b < n; ++b) materialize(b);
}

void BlockStates::reload(const std::string& directory, uint64_t step, bool lazy) {
  origin_.init_state = true;
  origin_.checkpoint = directory;
  origin_.step = step;
  held_at_.assign(held_at_.size(), step);
  pending_init_.assign(held_at_.size(), true);
  snap_at_.assign(held_at_.size(), kStale);
  if (!lazy)
    for (uint32_t b = 0; b < num_blocks(); ++b) materialize(b);
}

std::vector<models::Tensor*> BlockStates::buffers(uint32_t b) {
  opt_.ensure(b);
  std::vector<models::Tensor*> out{&model_.block(b).params(), &opt_.m(b)};
  if (opt_.has_v()) out.push_back(&opt_.v(b));
  return out;
}

std::vector<size_t> BlockStates::sizes(uint32_t b) const {
  const size_t n = model_.block(b).param_count();
  return opt_.has_v() ? std::vector<size_t>{n, n, n} : std::vector<size_t>{n, n};
}

uint64_t BlockStates::bytes(uint32_t b) const {
  uint64_t total = 0;
  for (size_t n : sizes(b)) total += n * sizeof(float);
  return total;
}

void BlockStates::hold(uint32_t b, uint64_t step) {
  held_at_[b] = step;
  pending_init_[b] = false;
}

void BlockStates::materialize(uint32_t b) {
  if (!pending_init_[b]) return;
  if (origin_.checkpoint.empty()) {
    model_.init_block(b, origin_.seed);
    opt_.release(b);  // (zero moments, as at the start: a reload's may be of lost steps)
    opt_.ensure(b);
  } else {
    // (The coordinator checked every shard's checksum before the job started.)
    const std::string path = origin_.checkpoint + "/" + shard_file_name(b);
    opt_.ensure(b);
    models::BlockState s = models::load_block_state_file(path, model_.block(b), b, opt_);
    if (s.step != origin_.step)
      throw std::runtime_error(path + ": it holds step " + std::to_string(s.step) + ", not " +
                               std::to_string(origin_.step));
  }
  pending_init_[b] = false;
}

void BlockStates::snapshot(uint32_t b, uint64_t step) {
  auto bufs = buffers(b);
  auto& snap = snap_[b];
  if (snap.size() != bufs.size()) snap.assign(bufs.size(), models::Tensor());
  for (size_t i = 0; i < bufs.size(); ++i) {
    if (snap[i].numel() != bufs[i]->numel()) snap[i] = models::Tensor({bufs[i]->numel()});
    copy_between(snap[i].data(), models::cpu_compute(), bufs[i]->data(), compute_of(*bufs[i]),
                 bufs[i]->bytes());
  }
  snap_at_[b] = step;
}

void BlockStates::release(uint32_t b) {
  opt_.release(b);
  model_.block(b).discard();  // (lazy buffers: their memory goes back)
  pending_init_[b] = false;
  held_at_[b] = kStale;
  snap_at_[b] = kStale;
  snap_[b].clear();
}

elastic::Holding BlockStates::holding(uint64_t next_step) const {
  elastic::Holding h;
  h.applied = next_step;
  for (uint32_t b = 0; b < num_blocks(); ++b) {
    if (held_at_[b] == next_step) h.held.push_back(b);
    if (next_step > 0 && snap_at_[b] == next_step - 1) h.snapshot.push_back(b);
  }
  return h;
}

}  // namespace troupe::workers
