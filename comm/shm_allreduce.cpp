#include "comm/shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>

#include "comm/reduce.h"

namespace troupe::comm {
namespace {

constexpr size_t kLine = 64;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

// One cache line per counter: each is written by its owner only and polled by the others.
struct ShmAllreduce::Counters {
  alignas(kLine) std::atomic<uint64_t> staged{0};
  alignas(kLine) std::atomic<uint64_t> reduced{0};
  alignas(kLine) std::atomic<uint64_t> gathered{0};
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");

// Segment: Counters | staging[2][n][slice] | result[2][slice], slices 64-byte aligned.
ShmAllreduce::ShmAllreduce(int rank, int n, size_t slice_bytes)
    : rank_(rank),
      n_(n),
      slice_bytes_((std::max<size_t>(slice_bytes, kLine) + kLine - 1) / kLine * kLine) {
  bytes_ = sizeof(Counters) + 2 * size_t(n_) * slice_bytes_ + 2 * slice_bytes_;
  base_.assign(n_, nullptr);
  fd_ = memfd_create("troupe-allreduce", MFD_CLOEXEC);
  if (fd_ < 0) return;
  void* p = MAP_FAILED;
  if (ftruncate(fd_, off_t(bytes_)) == 0)
    p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
  if (p == MAP_FAILED) {
    close(fd_);
    fd_ = -1;
    return;
  }
  base_[rank_] = static_cast<uint8_t*>(p);
  new (base_[rank_]) Counters();
}

ShmAllreduce::~ShmAllreduce() {
  for (uint8_t* b : base_)
    if (b) munmap(b, bytes_);
  if (fd_ >= 0) close(fd_);
}

std::string ShmAllreduce::attach(const std::vector<int>& pids, const std::vector<int>& fds) {
  if (fd_ < 0) return "cannot create a shared segment: " + std::string(std::strerror(errno));
  for (int r = 0; r < n_; ++r) {
    if (r == rank_) continue;
    std::string path = "/proc/" + std::to_string(pids[r]) + "/fd/" + std::to_string(fds[r]);
    int fd = fds[r] < 0 ? -1 : open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return "cannot open rank " + std::to_string(r) + "'s segment " + path;
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
      return "cannot map rank " + std::to_string(r) + "'s segment: " + std::strerror(errno);
    base_[r] = static_cast<uint8_t*>(p);
  }
  return "";
}

ShmAllreduce::Counters* ShmAllreduce::counters(int rank) const {
  return reinterpret_cast<Counters*>(base_[rank]);
}
uint8_t* ShmAllreduce::staging(int rank, uint64_t slot, int slice) const {
  return base_[rank] + sizeof(Counters) + (slot * size_t(n_) + size_t(slice)) * slice_bytes_;
}
uint8_t* ShmAllreduce::result(int rank, uint64_t slot) const {
  return base_[rank] + sizeof(Counters) + 2 * size_t(n_) * slice_bytes_ + slot * slice_bytes_;
}

template <typename Ready>
void ShmAllreduce::wait(Ready ready, const Idle& idle) {
  for (uint64_t spins = 1; !ready(); ++spins) {
    cpu_relax();
    if (spins % 32 == 0) idle(spins);
  }
}

void ShmAllreduce::run(const uint8_t* in, uint8_t* out, size_t count, DataType t, bool average,
                       const Idle& idle) {
  const size_t es = element_size(t);
  const size_t slice_elems = slice_bytes_ / es;
  const size_t chunk_elems = slice_elems * size_t(n_);
  Counters* mine = counters(rank_);
  auto all_others = [&](auto field, uint64_t at_least) {
    return [this, field, at_least] {
      for (int q = 0; q < n_; ++q)
        if (q != rank_ && (counters(q)->*field).load(std::memory_order_acquire) < at_least)
          return false;
      return true;
    };
  };
  for (size_t done = 0; done < count; done += chunk_elems) {
    const size_t c = std::min(chunk_elems, count - done);
    const uint64_t t_ = step_, slot = t_ & 1;
    // Slice q of this chunk: [off(q), off(q) + len(q)) elements from `done`.
    const size_t base = c / size_t(n_), rem = c % size_t(n_);
    auto len = [&](int q) { return base + (size_t(q) < rem ? 1 : 0); };
    auto off = [&](int q) { return size_t(q) * base + std::min<size_t>(size_t(q), rem); };
    const uint8_t* src = in + done * es;
    uint8_t* dst = out + done * es;

    // 1. Stage the slices the others reduce, once they are done with this slot (chunk t-2).
    if (t_ >= 2) wait(all_others(&Counters::reduced, t_ - 1), idle);
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && len(q))
        std::memcpy(staging(rank_, slot, q), src + off(q) * es, len(q) * es);
    mine->staged.store(t_ + 1, std::memory_order_release);

    // 2. Reduce this rank's slice into its output, then copy it to the result area.
    wait(all_others(&Counters::staged, t_ + 1), idle);
    if (t_ >= 2) wait(all_others(&Counters::gathered, t_ - 1), idle);
    const size_t my_len = len(rank_);
    if (my_len) {
      // Reduce into this rank's own output, then copy to the result area: the result area's
      // lines were last read by the other ranks' cores, and vector stores into them would
      // fetch each line for ownership (2.5x slower here); a copy (rep movsb) does not.
      uint8_t* my_out = dst + off(rank_) * es;
      auto part = [&](int q) -> const uint8_t* {
        return q == rank_ ? src + off(rank_) * es : staging(q, slot, rank_);
      };
      // Own part first (in place, my_out is it), then the others in rank order.
      const int first = rank_ == 0 ? 1 : 0;
      reduce_sum_into(my_out, part(rank_), part(first), my_len, t);
      for (int q = first + 1; q < n_; ++q)
        if (q != rank_) reduce_sum(my_out, part(q), my_len, t);
      if (average) scale_down(my_out, my_len, t, n_);
      std::memcpy(result(rank_, slot), my_out, my_len * es);
    }
    mine->reduced.store(t_ + 1, std::memory_order_release);

    // 3. Gather the others' results.
    wait(all_others(&Counters::reduced, t_ + 1), idle);
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && len(q)) std::memcpy(dst + off(q) * es, result(q, slot), len(q) * es);
    mine->gathered.store(t_ + 1, std::memory_order_release);
    ++step_;
  }
}

}  // namespace troupe::comm
