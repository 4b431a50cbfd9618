#include "comm/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

namespace troupe::comm {
namespace {

constexpr uint64_t kMagic = 0x6172656e61707274;  // "trparena"

// The first page of the mapping.
struct ArenaHeader {
  uint64_t magic, identity, mapped_bytes;
};

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

std::shared_ptr<SharedArena> SharedArena::create(size_t capacity, std::string* why) {
  const size_t mapped = kAlign + round_up(std::max<size_t>(capacity, 1), kAlign);
  int fd = memfd_create("troupe-registered", MFD_CLOEXEC);
  if (fd < 0) {
    *why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  void* p = MAP_FAILED;
  if (ftruncate(fd, off_t(mapped)) == 0)
    p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = "cannot size or map " + std::to_string(mapped) + " bytes: " + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  std::random_device rd;
  uint64_t identity = ((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(getpid())) | 1;
  auto* h = static_cast<ArenaHeader*>(p);
  *h = ArenaHeader{kMagic, identity, mapped};
  return std::shared_ptr<SharedArena>(
      new SharedArena(fd, static_cast<uint8_t*>(p), mapped, identity));
}

SharedArena::SharedArena(int fd, uint8_t* base, size_t mapped, uint64_t identity)
    : fd_(fd), base_(base), mapped_(mapped), identity_(identity) {
  free_[kAlign] = mapped - kAlign;
}

SharedArena::~SharedArena() {
  munmap(base_, mapped_);
  close(fd_);
}

uint64_t SharedArena::identity_at(const void* base, size_t mapped_bytes) {
  const auto* h = static_cast<const ArenaHeader*>(base);
  return h->magic == kMagic && h->mapped_bytes == mapped_bytes ? h->identity : 0;
}

void* SharedArena::allocate(size_t bytes) {
  const size_t want = round_up(std::max<size_t>(bytes, 1), kAlign);
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const size_t at = it->first, left = it->second - want;
    free_.erase(it);
    if (left) free_[at + want] = left;
    used_[at] = want;
    return base_ + at;  // (fresh pages and those release() gave back read zeros)
  }
  return nullptr;
}

void SharedArena::release(void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(size_t(static_cast<uint8_t*>(p) - base_));
  if (u == used_.end()) return;
  size_t at = u->first, len = u->second;
  used_.erase(u);
  give_back(at, len);
  // Coalesce with the free neighbours.
  auto next = free_.lower_bound(at);
  if (next != free_.end() && at + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == at) {
      prev->second += len;
      return;
    }
  }
  free_[at] = len;
}

void SharedArena::discard(void* p) {
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.find(size_t(static_cast<uint8_t*>(p) - base_));
  if (u != used_.end()) give_back(u->first, u->second);
}

void SharedArena::give_back(size_t at, size_t bytes) {
  // The pages go back to the system and read zeros after; nothing is touched (a buffer never
  // written costs nothing). Should the file refuse (it does not on a memfd), they are zeroed.
  if (fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off_t(at), off_t(bytes)) != 0)
    std::memset(base_ + at, 0, bytes);
}

int64_t SharedArena::offset_of(const void* p, size_t bytes) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < base_ + kAlign || b >= base_ + mapped_ || bytes > size_t(base_ + mapped_ - b)) return -1;
  const size_t at = size_t(b - base_);
  std::lock_guard<std::mutex> lock(mu_);
  auto u = used_.upper_bound(at);
  if (u == used_.begin()) return -1;
  --u;
  return at + bytes <= u->first + u->second ? int64_t(at) : -1;
}

}  // namespace troupe::comm
