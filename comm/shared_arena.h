// Host memory the other processes of this host can map: the buffers a communicator's members
// read from one another in place (registered buffers, as NCCL's ncclCommRegister or PyTorch's
// symmetric memory). A buffer allocated here and registered with a UcxCommunicator
// (UcxCommOptions::registered) is allreduced without a staging copy: each rank reduces its slice
// straight from the others' buffers and gathers the others' slices straight from theirs
// (comm/shm_allreduce.h), 2.5 x the bytes of memory traffic per rank instead of 4.5 x with two
// ranks.
//
// One memfd of a fixed capacity (the others map all of it once, when a communicator forms),
// carved first fit into 4 KiB-aligned buffers. Its first page is a header (an identity the others
// check after mapping). The others map it read-only: no process writes another's buffers.
//
// Thread-safety: allocate and release may be called from any thread; the rest is immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace troupe::comm {

class SharedArena {
 public:
  static constexpr size_t kAlign = 4096;

  // An arena with room for `capacity` bytes of buffers; null (and why) when the system refuses.
  static std::shared_ptr<SharedArena> create(size_t capacity, std::string* why);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  // `bytes` of zeros, kAlign-aligned; null when no gap is large enough. Its pages take memory only
  // once written.
  void* allocate(size_t bytes);
  // Gives back a buffer allocate() returned (null: nothing), and its memory to the system.
  void release(void* p);
  // Gives the memory of a buffer allocate() returned back to the system; it reads zeros after.
  void discard(void* p);

  // Where [p, p + bytes) lies in the mapping: its offset from the start, or -1 when not wholly
  // inside a buffer of this arena.
  int64_t offset_of(const void* p, size_t bytes) const;

  // What the others need to map it and check that they did.
  int fd() const { return fd_; }
  size_t mapped_bytes() const { return mapped_; }
  uint64_t identity() const { return identity_; }
  // The identity a mapping of `mapped_bytes` bytes at `base` says it has (0: not an arena's).
  static uint64_t identity_at(const void* base, size_t mapped_bytes);

 private:
  SharedArena(int fd, uint8_t* base, size_t mapped, uint64_t identity);
  void give_back(size_t at, size_t bytes);  // (mu_ held)
  int fd_;
  uint8_t* base_;
  size_t mapped_;
  uint64_t identity_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced
  std::map<size_t, size_t> used_;  // offset -> bytes
};

}  // namespace troupe::comm
