#include "workers/registered_gradients.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "workers/host_staging.h"

namespace troupe::workers {
namespace {

// A buffer of the arena as a tensor's memory; gives it back when the tensor goes.
class ArenaMemory final : public models::Memory {
 public:
  ArenaMemory(std::shared_ptr<comm::SharedArena> arena, void* data, size_t bytes,
              models::Compute& compute)
      : Memory(data, bytes, models::Device::cpu, compute), arena_(std::move(arena)) {}
  ~ArenaMemory() override { arena_->release(data_); }
  ArenaMemory(const ArenaMemory&) = delete;
  ArenaMemory& operator=(const ArenaMemory&) = delete;
  void discard() override { arena_->discard(data_); }  // (a pipeline's unowned blocks)

 private:
  std::shared_ptr<comm::SharedArena> arena_;
};

size_t rounded(size_t bytes) {
  return (bytes + comm::SharedArena::kAlign - 1) / comm::SharedArena::kAlign *
         comm::SharedArena::kAlign;
}

// The room `also` takes.
size_t room_for(models::Model& model, AlsoSummed also) {
  size_t most = 0, halves = 0;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    const size_t n = model.block(b).grads().numel();
    most = std::max(most, n);
    halves += rounded((n + 1) / 2 * sizeof(float));
  }
  return (also.exact_sums ? rounded(most * sizeof(int64_t)) : 0) + (also.bf16_copies ? halves : 0);
}

}  // namespace

std::shared_ptr<comm::SharedArena> register_gradients(models::Model& model, AlsoSummed also,
                                                      std::string* why) {
  std::vector<models::Storage*> host;  // (each once: a tied weight's views share one)
  size_t capacity = 0;
  for (size_t b = 0; b < model.num_blocks(); ++b) {
    models::Tensor& g = model.block(b).grads();
    if (!g.defined() || g.device() != models::Device::cpu || g.numel() == 0) continue;
    if (std::find(host.begin(), host.end(), g.storage().get()) != host.end()) continue;
    host.push_back(g.storage().get());
    capacity += rounded(g.storage()->bytes());
  }
  if (host.empty()) {
    *why = "no gradients in host memory";
    return nullptr;
  }
  auto arena = comm::SharedArena::create(capacity + room_for(model, also), why);
  if (!arena) return nullptr;
  for (models::Storage* s : host) {
    void* p = arena->allocate(s->bytes());  // (room for all: capacity counts each rounded)
    s->replace(std::make_unique<ArenaMemory>(arena, p, s->bytes(), s->compute()));
  }
  return arena;
}

models::Tensor InPlaceBuffers::take(size_t key, size_t numel, models::Compute& compute) {
  if (!arena_ || compute.device() != models::Device::cpu) return {};
  models::Tensor& kept = kept_[key];
  if (kept.defined() && kept.storage().use_count() > 1)
    throw std::logic_error("InPlaceBuffers: buffer " + std::to_string(key) +
                           " taken again while its last taker still holds it");
  if (kept.defined() && kept.numel() == numel && &compute_of(kept) == &compute) return kept;
  kept = models::Tensor();  // (its room back before the new one)
  const size_t bytes = numel * sizeof(float);
  void* p = arena_->allocate(bytes);
  if (!p) return {};
  std::unique_ptr<ArenaMemory> memory;
  try {
    memory = std::make_unique<ArenaMemory>(arena_, p, bytes, compute);
  } catch (...) {
    arena_->release(p);
    throw;
  }
  kept = models::Tensor({numel}, std::make_shared<models::Storage>(std::move(memory)));
  return kept;
}

}  // namespace troupe::workers
