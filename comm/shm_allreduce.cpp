#include "comm/shm_allreduce.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "comm/reduce.h"

namespace troupe::comm {
namespace {

constexpr size_t kLine = 64;
constexpr int kMaxRanks = 64;  // (UcxCommunicator uses shared memory for at most 64)

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Maps another process's memfd of exactly `bytes` (mapping past a file's end: SIGBUS) through
// /proc/PID/fd/FD (`who` names it in the errors). Null and why when it cannot.
void* map_peer(int pid, int peer_fd, size_t bytes, bool writable, const std::string& who,
               std::string* why) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(peer_fd);
  int fd = peer_fd < 0 ? -1 : open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot open " + who + " " + path + ": " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || size_t(st.st_size) != bytes) {
    close(fd);
    *why = who + " " + path + " is not " + std::to_string(bytes) + " bytes";
    return nullptr;
  }
  const int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
  void* p = mmap(nullptr, bytes, prot, MAP_SHARED | (writable ? MAP_POPULATE : 0), fd, 0);
  const int err = errno;
  close(fd);
  if (p != MAP_FAILED) return p;
  *why = "cannot map " + who + " " + path + ": " + std::strerror(err);
  return nullptr;
}

// Chunk k of a call: elements [at, at + c); slice q of it: [at + off(q), + len(q)).
struct Geometry {
  size_t at, base, rem;
  Geometry(uint64_t k, size_t chunk_elems, size_t count, int n) : at(k * chunk_elems) {
    const size_t c = std::min(chunk_elems, count - at);
    base = c / size_t(n);
    rem = c % size_t(n);
  }
  size_t len(int q) const { return base + (size_t(q) < rem ? 1 : 0); }
  size_t off(int q) const { return size_t(q) * base + std::min(size_t(q), rem); }
};

// The code a rank gives a call up with: an Error's (or the one another rank gave it up with),
// peer_lost for anything else.
Errc why_given_up(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& error) {
    return error.code();
  } catch (const ShmAllreduce::Abandoned& abandoned) {
    return abandoned.code;
  } catch (...) {
    return Errc::peer_lost;
  }
}

}  // namespace

// What a call looks like; every rank publishes its own, and the others compare (all but where
// its buffer is: `registered`, its offset in the rank's arena, or -1).
struct Call {
  uint64_t number, first_step, count;
  uint32_t dtype, average;
  int64_t registered;
  uint64_t registered_slice;  // the slice this rank would read registered buffers in
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
  // Calls (number + 1): published; registered calls also gathered and given up.
  alignas(kLine) std::atomic<uint64_t> announced{0};
  alignas(kLine) std::atomic<uint64_t> gathered{0};
  alignas(kLine) std::atomic<uint64_t> abandoned{0};
  std::atomic<uint32_t> abandoned_code{0};          // the Errc it gave up with (written first)
  alignas(kLine) std::atomic<uint64_t> entered{0};  // the allreduce it entered (entered())
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
  if (fd_ >= 0) close(fd_);  // (the arenas' mappings go with the last holder of arena_maps_)
}

std::string ShmAllreduce::attach(const std::vector<int>& pids, const std::vector<int>& fds,
                                 const std::vector<uint64_t>& identities) {
  if (fd_ < 0) return why_;
  for (int r = 0; r < n_; ++r) {
    if (r == rank_) continue;
    const std::string who = "rank " + std::to_string(r) + "'s segment";
    std::string why;
    void* p = map_peer(pids[size_t(r)], fds[size_t(r)], bytes_, true, who, &why);
    if (!p) return why;
    base_[size_t(r)] = static_cast<uint8_t*>(p);
    // Another process's file with the same pid and fd (another pid namespace) is not it.
    const Header* h = header(r);
    if (h->identity != identities[size_t(r)] || h->rank != r || h->ranks != n_ ||
        h->slice_bytes != int64_t(slice_bytes_) || h->bytes != int64_t(bytes_))
      return who + " is not the one that rank made";
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

void ShmAllreduce::wait_all(std::atomic<uint64_t> Header::*counter, uint64_t at_least,
                            const Idle& idle) {
  auto ready = [&] {
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && (header(q)->*counter).load(std::memory_order_acquire) < at_least)
        return false;
    return true;
  };
  for (uint64_t spins = 1; !ready(); ++spins) {
    cpu_relax();
    if (spins % 32 == 0) idle(spins);
  }
}

// entered: the collective's number in the top 24 bits, its bytes below (one word: a rank that
// reads it while it is rewritten sees one call or the next, never a mix).
constexpr int kEnteredBits = 40;
constexpr uint64_t kEnteredBytes = (uint64_t(1) << kEnteredBits) - 1;

void ShmAllreduce::entered(uint64_t seq, uint64_t bytes) {
  header(rank_)->entered.store(seq << kEnteredBits | std::min(bytes, kEnteredBytes),
                               std::memory_order_release);
}

std::string ShmAllreduce::split() const {
  const uint64_t mine = header(rank_)->entered.load(std::memory_order_acquire);
  for (int q = 0; q < n_; ++q) {
    const uint64_t theirs = header(q)->entered.load(std::memory_order_acquire);
    if (q == rank_ || mine == 0 || (theirs ^ mine) >> kEnteredBits || theirs == mine) continue;
    return "rank " + std::to_string(q) + " called this allreduce with " +
           std::to_string(theirs & kEnteredBytes) + " bytes, this rank with " +
           std::to_string(mine & kEnteredBytes) + " bytes (their sizes sent them different ways)";
  }
  return "";
}

// After everyone published this call: "" or how another rank's call differs from this one's.
std::string ShmAllreduce::mismatch() const {
  const Call& mine = header(rank_)->call;
  auto text = [](const Call& c) {
    // (number: the call's on this communicator, counted from 0: not a training step)
    return "allreduce " + std::to_string(c.number) + " of this generation's communicator with " +
           std::to_string(c.count) + " " + dtype_name(DataType(c.dtype)) +
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
  wait_all(&Header::reduced, first, idle);
  const uint64_t number = calls_++;
  mine->call = Call{number, first, count, uint32_t(t), uint32_t(average), -1, 0};
  mine->announced.store(number + 1, std::memory_order_release);
  std::memcpy(mine->small, in, count * es);
  mine->staged.store(first + 1, std::memory_order_release);
  wait_all(&Header::staged, first + 1, idle);
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
  wait_all(&Header::reduced, first, idle);
  const uint64_t number = calls_++;
  const bool eligible = arena_ && in == out && count * es >= registered_min_bytes();
  const int64_t registered = eligible ? arena_->offset_of(out, count * es) : -1;
  mine->call =
      Call{number, first, count, uint32_t(t), uint32_t(average), registered, registered_slice()};
  mine->announced.store(number + 1, std::memory_order_release);
  if (registered >= 0) {
    wait_all(&Header::announced, number + 1, idle);
    if (all_registered()) {
      std::string why = mismatch();
      if (!why.empty()) return why;
      run_registered(out, count, t, average, idle);
      ++registered_calls_;
      return "";
    }
  }
  auto geometry = [&](uint64_t k) { return Geometry(k, chunk_elems, count, n_); };
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
    wait_all(&Header::staged, step + 1, idle);
    if (k == 0) {
      std::string why = mismatch();
      if (!why.empty()) return why;
    }
    // Reduce into this rank's own output and into the result area (which the others' cores read
    // last and read next): in the same pass, or copied after it, as peer_lines() says. The
    // parts in rank order.
    if (const size_t len = g.len(rank_)) {
      uint8_t* my_out = out + (g.at + g.off(rank_)) * es;
      const uint8_t* parts[kMaxRanks];
      for (int q = 0; q < n_; ++q)
        parts[q] = q == rank_ ? in + (g.at + g.off(rank_)) * es : staging(q, slot, rank_);
      reduce_sum_parts(my_out, Store::ordinary, result(rank_, slot), peer_lines().publish,
                       reinterpret_cast<const void* const*>(parts), n_, rank_, len, t,
                       average ? n_ : 1);
    }
    mine->reduced.store(step + 1, std::memory_order_release);
    if (k + 1 < chunks) stage(k + 1);
    wait_all(&Header::reduced, step + 1, idle);
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && g.len(q))
        copy_from_peer(out + (g.at + g.off(q)) * es, result(q, slot), g.len(q) * es);
  }
  step_ = first + chunks;
  return "";
}

}  // namespace troupe::comm

namespace troupe::comm {

namespace {

// Other processes' arenas mapped read-only, kept from one communicator to the next: a survivor's
// next generation finds a member's gradients mapped with their page tables filled, instead of
// faulting every page in again in its first step (80 MB of gradients: ~10 ms of a recovery).
// Keyed by the pid and the arena's identity (a new arena, or a pid reused, is another key); an
// attach keeps only the mappings it uses (a lost member's goes with its last holder).
struct KeptArena {
  std::shared_ptr<const void> map;
  uint64_t bytes;
};
std::mutex kept_mu;
std::map<std::pair<int, uint64_t>, KeptArena> kept;

}  // namespace

std::string ShmAllreduce::attach_arenas(std::shared_ptr<const SharedArena> mine,
                                        const std::vector<int>& pids,
                                        const std::vector<ArenaRef>& arenas) {
  arenas_.assign(size_t(n_), nullptr);
  arena_bytes_.assign(size_t(n_), 0);
  arena_maps_.assign(size_t(n_), nullptr);
  std::lock_guard<std::mutex> lock(kept_mu);
  decltype(kept) used;
  for (int r = 0; r < n_; ++r) {
    const ArenaRef& a = arenas[size_t(r)];
    if (r == rank_ || a.fd < 0) continue;
    const auto key = std::make_pair(pids[size_t(r)], a.identity);
    KeptArena k;
    if (auto it = kept.find(key); it != kept.end() && it->second.bytes == a.bytes) k = it->second;
    const std::string who = "rank " + std::to_string(r) + "'s registered buffers";
    if (!k.map) {
      std::string why;
      void* p = map_peer(pids[size_t(r)], a.fd, a.bytes, false, who, &why);
      if (!p) return why;
      const uint64_t bytes = a.bytes;
      k = {std::shared_ptr<const void>(
               p, [bytes](const void* q) { munmap(const_cast<void*>(q), bytes); }),
           bytes};
    }
    if (SharedArena::identity_at(k.map.get(), a.bytes) != a.identity)
      return who + " is not the one that rank made";
    arenas_[size_t(r)] = static_cast<const uint8_t*>(k.map.get());
    arena_bytes_[size_t(r)] = a.bytes;
    arena_maps_[size_t(r)] = k.map;
    used[key] = k;
  }
  kept = std::move(used);
  arena_ = std::move(mine);
  return "";
}

bool ShmAllreduce::all_registered() const {
  for (int q = 0; q < n_; ++q) {
    const Call& c = header(q)->call;
    if (c.registered < 0) return false;
    if (q == rank_) continue;
    const uint64_t end = uint64_t(c.registered) + c.count * element_size(DataType(c.dtype));
    if (!arenas_[size_t(q)] || end > arena_bytes_[size_t(q)]) return false;
  }
  return true;
}

void ShmAllreduce::check_not_abandoned() const {
  std::atomic_thread_fence(std::memory_order_seq_cst);  // after the reads of others' buffers
  const uint64_t number = header(rank_)->call.number;
  for (int q = 0; q < n_; ++q)
    if (q != rank_ && header(q)->abandoned.load(std::memory_order_seq_cst) == number + 1) {
      const Errc code = Errc(header(q)->abandoned_code.load(std::memory_order_relaxed));
      throw Abandoned(code, std::string(errc_name(code)) + " reported by rank " +
                                std::to_string(q) + ", which gave allreduce " +
                                std::to_string(number) + " up while the others read its buffer");
    }
}

size_t ShmAllreduce::registered_slice() const {
  const size_t s = peer_lines().registered_slice_bytes;
  return s ? s : slice_bytes_;
}

void ShmAllreduce::run_registered(uint8_t* out, size_t count, DataType t, bool average,
                                  const Idle& idle) {
  // Every rank the same geometry: the smallest slice any announced (they differ only where
  // TROUPE_PEER_LINES does).
  uint64_t slice = UINT64_MAX;
  for (int q = 0; q < n_; ++q) slice = std::min(slice, header(q)->call.registered_slice);
  const size_t es = element_size(t), chunk_elems = slice / es * size_t(n_);
  const uint64_t first = step_, chunks = (count + chunk_elems - 1) / chunk_elems;
  Header* mine = header(rank_);
  const uint64_t number = mine->call.number;
  auto theirs = [&](int q, size_t elem) {
    return arenas_[size_t(q)] + header(q)->call.registered + elem * es;
  };
  // Slice r of chunk k, in place: the parts in rank order; stored as suits lines the others
  // read last time and read next (peer_lines).
  auto reduce = [&](uint64_t k) {
    const Geometry g(k, chunk_elems, count, n_);
    if (const size_t len = g.len(rank_)) {
      const size_t e = g.at + g.off(rank_);
      uint8_t* my = out + e * es;
      const uint8_t* parts[kMaxRanks];
      for (int q = 0; q < n_; ++q) parts[q] = q == rank_ ? my : theirs(q, e);
      reduce_sum_parts(my, peer_lines().store, nullptr, Store::ordinary,
                       reinterpret_cast<const void* const*>(parts), n_, rank_, len, t,
                       average ? n_ : 1);
    }
    mine->reduced.store(first + k + 1, std::memory_order_release);
  };
  // Waiting on a rank that gave the call up ends at once (its notice may come later).
  const Idle waiting = [&](uint64_t spins) {
    check_not_abandoned();
    idle(spins);
  };
  auto gather = [&](uint64_t k) {
    wait_all(&Header::reduced, first + k + 1, waiting);
    const Geometry g(k, chunk_elems, count, n_);
    for (int q = 0; q < n_; ++q)
      if (q != rank_ && g.len(q))
        copy_from_peer(out + (g.at + g.off(q)) * es, theirs(q, g.at + g.off(q)), g.len(q) * es);
  };
  try {
    for (uint64_t k = 0; k < chunks; ++k) {
      reduce(k);
      if (k > 0) gather(k - 1);
    }
    gather(chunks - 1);
    check_not_abandoned();
    mine->gathered.store(number + 1, std::memory_order_release);
    wait_all(&Header::gathered, number + 1, waiting);
  } catch (...) {
    // Before the caller may reuse this buffer: whoever still reads it will know, and why.
    mine->abandoned_code.store(uint32_t(why_given_up(std::current_exception())),
                               std::memory_order_relaxed);
    mine->abandoned.store(number + 1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    throw;
  }
  step_ = first + chunks;
}

}  // namespace troupe::comm
