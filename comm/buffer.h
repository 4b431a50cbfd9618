// A 64-byte-aligned byte buffer with one owner: the unit the transport moves.
// Cap'n Proto needs 8-byte alignment to read a message in place; UCX active-message data is not
// aligned, so the transport copies every received frame into a Buffer.
//
// Thread-safety: none; a Buffer is moved between threads, never shared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

namespace troupe::comm {

class Buffer {
 public:
  static constexpr size_t kAlignment = 64;

  Buffer() = default;
  explicit Buffer(size_t size) : size_(size) {
    if (size == 0) return;
    size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlignment, rounded)));
    if (!data_) throw std::bad_alloc();
  }
  static Buffer copy_of(const void* src, size_t size) {
    Buffer b(size);
    if (size) std::memcpy(b.data(), src, size);
    return b;
  }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
  size_t size_ = 0;
};

}  // namespace troupe::comm
