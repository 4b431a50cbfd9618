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
template <typename T>
class AlignedBuffer {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;

  explicit AlignedBuffer(size_t n) : size_(n) {
    size_t bytes = ((n * sizeof(T) + 63) / 64) * 64;
    if (bytes == 0) bytes = 64;
    if (bytes >= 2 * kHugePage) {
      bytes = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      data_ = static_cast<T*>(std::aligned_alloc(kHugePage, bytes));
      if (data_) madvise(data_, bytes, MADV_HUGEPAGE);  // advice: fine if it is not taken
    } else {
      data_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    }
    if (!data_) throw std::bad_alloc();
    std::memset(data_, 0, bytes);
  }
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  T* data() { return data_; }
  size_t size() const { return size_; }

 private:
  T* data_;
  size_t size_;
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

}  // namespace troupe::models
