// Tensors: fp32 (or fp64 in tests), 64-byte-aligned storage, a shape, and views over flat
// buffers. A block's parameters are one flat buffer; each weight is a view into it.
//
// Thread-safety: none. Storage is shared between a tensor and its views (shared_ptr).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::models {

enum class Device : uint8_t { cpu = 0, cuda = 1 };

// Large buffers (4 MiB and up) are asked to be backed by transparent huge pages: the first
// touch of a model's parameters, gradients and moments is one page fault per 2 MiB instead of
// per 4 KiB (320 MB: 0.29 s instead of 1.26 s here), which is most of what a joining worker
// spends building itself, and fewer TLB misses after.
//
// A lazy buffer is mapped but not touched: it reads as zeros and takes no memory until written
// (a pipeline worker builds every block but backs only its stage's). discard() gives a lazy
// buffer's memory back (its contents become zeros again); on others it only zeroes.
template <typename T>
class AlignedBuffer {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;

  explicit AlignedBuffer(size_t n, bool lazy = false) : size_(n) {
    size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    if (bytes == 0) bytes = 64;
    const bool huge = bytes >= 2 * kHugePage;
    if (huge) bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    if (lazy) {
      // (mmap's address is page-aligned; huge pages need 2 MiB alignment: map a little more.)
      size_t extra = huge ? kHugePage : 0;
      void* p =
          mmap(nullptr, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      map_ = p;
      map_bytes_ = bytes + extra;
      auto at = reinterpret_cast<uintptr_t>(p);
      if (huge) at = (at + kHugePage - 1) / kHugePage * kHugePage;
      data_ = reinterpret_cast<T*>(at);
      bytes_ = bytes;
      if (huge) madvise(data_, bytes, MADV_HUGEPAGE);
      return;
    }
    data_ = static_cast<T*>(std::aligned_alloc(huge ? kHugePage : 64, bytes));
    if (!data_) throw std::bad_alloc();
    if (huge) madvise(data_, bytes, MADV_HUGEPAGE);  // advice: fine if it is not taken
    std::memset(data_, 0, bytes);
    bytes_ = bytes;
  }
  ~AlignedBuffer() {
    if (map_)
      munmap(map_, map_bytes_);
    else
      std::free(data_);
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  T* data() { return data_; }
  size_t size() const { return size_; }
  void discard() {
    if (map_)
      madvise(data_, bytes_, MADV_DONTNEED);  // private anonymous: zeros on the next touch
    else
      std::memset(data_, 0, bytes_);
  }

 private:
  T* data_ = nullptr;
  size_t size_, bytes_ = 0;
  void* map_ = nullptr;  // lazy buffers: the mapping
  size_t map_bytes_ = 0;
};

template <typename T>
class TensorT {
 public:
  TensorT() = default;
  explicit TensorT(std::vector<size_t> shape, Device device = Device::cpu)
      : shape_(std::move(shape)), device_(device) {
    if (device != Device::cpu) throw std::invalid_argument("only cpu tensors are allocated here");
    storage_ = std::make_shared<AlignedBuffer<T>>(numel());
  }
  // Zeros that take no memory until written (AlignedBuffer's lazy buffers).
  static TensorT lazy(std::vector<size_t> shape) {
    TensorT t;
    t.shape_ = std::move(shape);
    t.storage_ = std::make_shared<AlignedBuffer<T>>(t.numel(), true);
    return t;
  }
  // Gives the whole storage's memory back (every view of it reads zeros after).
  void discard_storage() {
    if (storage_) storage_->discard();
  }

  // A view of `shape` starting at element `offset` of this tensor's storage.
  TensorT view(size_t offset, std::vector<size_t> shape) const {
    TensorT v;
    v.storage_ = storage_;
    v.offset_ = offset_ + offset;
    v.shape_ = std::move(shape);
    v.device_ = device_;
    if (v.offset_ + v.numel() > storage_->size()) {
      throw std::out_of_range("tensor view past the end of its storage");
    }
    return v;
  }

  T* data() { return storage_ ? storage_->data() + offset_ : nullptr; }
  const T* data() const { return storage_ ? storage_->data() + offset_ : nullptr; }
  const std::vector<size_t>& shape() const { return shape_; }
  size_t dim(size_t i) const { return shape_.at(i); }
  size_t numel() const {
    size_t n = 1;
    for (size_t d : shape_) n *= d;
    return shape_.empty() ? 0 : n;
  }
  Device device() const { return device_; }
  bool defined() const { return storage_ != nullptr; }
  void zero() {
    if (storage_) std::memset(data(), 0, numel() * sizeof(T));
  }

 private:
  std::shared_ptr<AlignedBuffer<T>> storage_;
  size_t offset_ = 0;
  std::vector<size_t> shape_;
  Device device_ = Device::cpu;
};

using Tensor = TensorT<float>;

// While one lives on this thread, model blocks and optimizers built here get lazy parameter,
// gradient and moment buffers (Tensor::lazy: zeros that take no memory until written). A
// pipeline worker builds every block, to know the model, and backs only its own stage's.
class LazyParameters {
 public:
  LazyParameters();
  ~LazyParameters();
  LazyParameters(const LazyParameters&) = delete;
  LazyParameters& operator=(const LazyParameters&) = delete;
  static bool active();
};

}  // namespace troupe::models
