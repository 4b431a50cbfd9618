#include "comm/shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
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

// What a call looks like; every rank publishes its own, and the others compare.
struct Call {
  uint64_t number, first_step, count;
  uint32_t dtype, average;
  bool operator==(const Call& o) const {
    return number == o.number && first_step == o.first_step && count == o.count &&
           dtype == o.dtype && average == o.average;
  }
};

// The counters get a cache line each: each is written by its owner only and polled by the
// others. The identity is written once, before the segment is handed out.
struct ShmAllreduce::Header {
  uint64_t identity;
  int64_t rank, ranks, slice_bytes, bytes;
  alignas(kLine) std::atomic<uint64_t> staged{0};
  alignas(kLine) std::atomic<uint64_t> reduced{0};
  alignas(kLine) Call call{};
  alignas(kLine) uint8_t small[ShmAllreduce::kSmallBytes];  // a small call's whole input
};
static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");

size_t ShmAllreduce::slice_for(int n, size_t slice_bytes) {
  size_t cap = (kMaxSegmentBytes - sizeof(Header)) / (2 * size_t(std::max(n, 1)));
  size_t s = std::min(std::max(slice_bytes, kLine), cap);
  return std::max(kLine, s / kLine * kLine);
}

// Segment: Header | staging[2][n-1 slices] | result[2][1 slice]; slices 64-byte aligned.
ShmAllreduce::ShmAllreduce(int rank, int n, size_t slice_bytes, uint64_t identity)
    : rank_(rank), n_(n), slice_bytes_(slice_for(n, slice_bytes)), identity_(identity) {
  bytes_ = sizeof(Header) + 2 * size_t(n_) * slice_bytes_;
  base_.assign(size_t(n_), nullptr);
  fd_ = memfd_create("troupe-allreduce", MFD_CLOEXEC);
  if (fd_ < 0) {
    why_ = std::string("memfd_create: ") + std::strerror(errno);
    return;
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd_, off_t(bytes_)) == 0)
    p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_, 0);
  if (p == MAP_FAILED) {
    why_ = "cannot size or map a segment of " + std::to_string(bytes_) +
           " bytes: " + std::strerror(errno);
    close(fd_);
    fd_ = -1;
    return;
  }
  base_[size_t(rank_)] = static_cast<uint8_t*>(p);
  auto* h = new (p) Header();
  h->identity = identity_;
  h->rank = rank_;
  h->ranks = n_;
  h->slice_bytes = int64_t(slice_bytes_);
  h->bytes = int64_t(bytes_);
}

ShmAllreduce::~ShmAllreduce() {
  for (uint8_t* b : base_)
    if (b) munmap(b, bytes_);
  if (fd_ >= 0) close(fd_);
}

std::string ShmAllreduce::attach(const std::vector<int>& pids, const std::vector<int>& fds,
                                 const std::vector<uint64_t>& identities) {
  if (fd_ < 0) return why_;
  for (int r = 0; r < n_; ++r) {
    if (r == rank_) continue;
    const std::string who = "rank " + std::to_string(r) + "'s segment ";
    std::string path =
        "/proc/" + std::to_string(pids[size_t(r)]) + "/fd/" + std::to_string(fds[size_t(r)]);
    int fd = fds[size_t(r)] < 0 ? -1 : open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return "cannot open " + who + path + ": " + std::strerror(errno);
    struct stat st {};
    if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes_) {  // (mapping past its end: SIGBUS)
      close(fd);
      return who + path + " is not " + std::to_string(bytes_) + " bytes";
    }
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    int err = errno;
    close(fd);
    if (p == MAP_FAILED) return "cannot map " + who + path + ": " + std::strerror(err);
    base_[size_t(r)] = static_cast<uint8_t*>(p);
    // Another process's file with the same pid and fd (another pid namespace) is not it.
    const Header* h = header(r);
    if (h->identity != identities[size_t(r)] || h->rank != r || h->ranks != n_ ||
        h->slice_bytes != int64_t(slice_bytes_) || h->bytes != int64_t(bytes_))
      return who + path + " is not the one that rank made";
  }
  return "";
}

ShmAllreduce::Header* ShmAllreduce::header(int rank) const {
  return reinterpret_cast<Header*>(base_[size_t(rank)]);
}
uint8_t* ShmAllreduce::staging(int rank, uint64_t slot, int slice) const {
  // The owner's own slice is never staged: n-1 slices per slot.
  size_t index = size_t(slice < rank ? slice : slice - 1);
  return base_[size_t(rank)] + sizeof(Header) + (slot * size_t(n_ - 1) + index) * slice_bytes_;
}
uint8_t* ShmAllreduce::result(int rank, uint64_t slot) const {
  return base_[size_t(rank)] + sizeof(Header) + (2 * size_t(n_ - 1) + slot) * slice_bytes_;
}

template <typename Ready>
void ShmAllreduce::wait(Ready ready, const Idle& idle) {
  for (uint64_t spins = 1; !ready(); ++spins) {
    cpu_relax();
    if (spins % 32 == 0) idle(spins);
  }
}

// Whether every other rank's counter is at least at_least.
std::function<bool()> ShmAllreduce::everyone(std::atomic<uint64_t> Header::*counter,
                                             uint64_t at_least) const {
  return [this, counter, at_least] {
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && (header(q)->*counter).load(std::memory_order_acquire) < at_least)
        return false;
    return true;
  };
}

// After everyone published this call: "" or how another rank's call differs from this one's.
std::string ShmAllreduce::mismatch() const {
  const Call& mine = header(rank_)->call;
  auto text = [](const Call& c) {
    return "allreduce " + std::to_string(c.number) + " (step " + std::to_string(c.first_step) +
           ") with " + std::to_string(c.count) + " " + dtype_name(DataType(c.dtype)) +
           (c.average ? " avg" : " sum");
  };
  for (int q = 0; q < n_; ++q) {
    const Call& c = header(q)->call;
    if (q != rank_ && !(c == mine))
      return "rank " + std::to_string(q) + " called " + text(c) + ", this rank " + text(mine);
  }
  return "";
}

// One step: publish the input once everyone has read this rank's previous one, wait for
// everyone's, sum them all here (in rank order: the same bits everywhere).
std::string ShmAllreduce::run_small(const uint8_t* in, uint8_t* out, size_t count, DataType t,
                                    bool average, const Idle& idle) {
  const size_t es = element_size(t);
  const uint64_t first = step_;
  Header* mine = header(rank_);
  wait(everyone(&Header::reduced, first), idle);
  mine->call = Call{calls_++, first, count, uint32_t(t), uint32_t(average)};
  std::memcpy(mine->small, in, count * es);
  mine->staged.store(first + 1, std::memory_order_release);
  wait(everyone(&Header::staged, first + 1), idle);
  std::string why = mismatch();
  if (!why.empty()) return why;
  alignas(kLine) uint8_t sum[kSmallBytes];
  reduce_sum_into(sum, header(0)->small, header(1)->small, count, t);
  for (int q = 2; q < n_; ++q) reduce_sum(sum, header(q)->small, count, t);
  if (average) scale_down(sum, count, t, n_);
  mine->reduced.store(first + 1, std::memory_order_release);
  std::memcpy(out, sum, count * es);
  step_ = first + 1;
  return "";
}

std::string ShmAllreduce::run(const uint8_t* in, uint8_t* out, size_t count, DataType t,
                              bool average, const Idle& idle) {
  const size_t es = element_size(t);
  if (count <= kSmallBytes / es) return run_small(in, out, count, t, average, idle);
  const size_t chunk_elems = slice_bytes_ / es * size_t(n_);
  const uint64_t first = step_, chunks = (count + chunk_elems - 1) / chunk_elems;
  Header* mine = header(rank_);
  // Everyone has read this rank's previous call (a small call returns without waiting for that).
  wait(everyone(&Header::reduced, first), idle);
  mine->call = Call{calls_++, first, count, uint32_t(t), uint32_t(average)};

  // Chunk k: elements [k * chunk_elems, +c); slice q of it: [off(q), off(q) + len(q)).
  struct Geometry {
    size_t at, base, rem;
    size_t len(int q) const { return base + (size_t(q) < rem ? 1 : 0); }
    size_t off(int q) const { return size_t(q) * base + std::min(size_t(q), rem); }
  };
  auto geometry = [&](uint64_t k) {
    size_t at = k * chunk_elems, c = std::min(chunk_elems, count - at);
    return Geometry{at, c / size_t(n_), c % size_t(n_)};
  };
  auto stage = [&](uint64_t k) {
    const Geometry g = geometry(k);
    const uint64_t slot = (first + k) & 1;
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && g.len(q))
        std::memcpy(staging(rank_, slot, q), in + (g.at + g.off(q)) * es, g.len(q) * es);
    mine->staged.store(first + k + 1, std::memory_order_release);
  };

  stage(0);
  for (uint64_t k = 0; k < chunks; ++k) {
    const uint64_t step = first + k, slot = step & 1;
    const Geometry g = geometry(k);
    wait(everyone(&Header::staged, step + 1), idle);
    if (k == 0) {
      std::string why = mismatch();
      if (!why.empty()) return why;
    }
    // Reduce into this rank's own output, then copy to the result area: the result area's lines
    // were last read by the other ranks' cores, and vector stores into them would fetch each
    // line for ownership (2.5x slower here); a copy (rep movsb) does not.
    if (const size_t len = g.len(rank_)) {
      uint8_t* my_out = out + (g.at + g.off(rank_)) * es;
      auto part = [&](int q) -> const uint8_t* {
        return q == rank_ ? in + (g.at + g.off(rank_)) * es : staging(q, slot, rank_);
      };
      // Own part first (in place, my_out is it), then the others in rank order.
      const int other = rank_ == 0 ? 1 : 0;
      reduce_sum_into(my_out, part(rank_), part(other), len, t);
      for (int q = other + 1; q < n_; ++q)
        if (q != rank_) reduce_sum(my_out, part(q), len, t);
      if (average) scale_down(my_out, len, t, n_);
      std::memcpy(result(rank_, slot), my_out, len * es);
    }
    mine->reduced.store(step + 1, std::memory_order_release);
    if (k + 1 < chunks) stage(k + 1);
    wait(everyone(&Header::reduced, step + 1), idle);
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && g.len(q))
        std::memcpy(out + (g.at + g.off(q)) * es, result(q, slot), g.len(q) * es);
  }
  step_ = first + chunks;
  return "";
}

}  // namespace troupe::comm
