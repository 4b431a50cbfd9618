// Tensors: fp32 (or fp64 in tests), a shape, and views over flat buffers, in the memory of one
// device (host memory, 64-byte aligned, or a device's: models/compute.h). A block's parameters
// are one flat buffer; each weight is a view into it.
//
// Thread-safety: none. Storage is shared between a tensor and its views (shared_ptr).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::models {

enum class Device : uint8_t { cpu = 0, cuda = 1 };

class Compute;

// A tensor's memory: an allocation on one device. HostMemory below is the CPU's; a device's
// Compute (models/compute.h) makes its own. Freed by its destructor.
class Memory {
 public:
  virtual ~Memory() = default;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // The Compute whose kernels run on this memory (the one that allocated it).
  Compute& compute() const { return *compute_; }
  // Gives the memory back where it can (lazy host buffers); its contents read as zeros after.
  virtual void discard() = 0;

 protected:
  Memory(void* data, size_t bytes, Device device, Compute& compute)
      : data_(data), bytes_(bytes), device_(device), compute_(&compute) {}
  void* data_;
  size_t bytes_;
  Device device_;
  Compute* compute_;
};

// Host memory, 64-byte aligned and zeroed. Large buffers (4 MiB and up) are asked to be backed
// by transparent huge pages: the first touch of a model's parameters, gradients and moments is
// one page fault per 2 MiB instead of per 4 KiB (320 MB: 0.29 s instead of 1.26 s here), which
// is most of what a joining worker spends building itself, and fewer TLB misses after.
//
// A lazy buffer is mapped but not touched: it reads as zeros and takes no memory until written
// (a pipeline worker builds every block but backs only its stage's). discard() gives a lazy
// buffer's memory back (its contents become zeros again); on others it only zeroes.
class HostMemory final : public Memory {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;
  // (owner: the Compute whose kernels run on it; the CPU's f32 one unless given.)
  HostMemory(size_t bytes, bool lazy, Compute* owner = nullptr);
  ~HostMemory() override;
  HostMemory(const HostMemory&) = delete;
  HostMemory& operator=(const HostMemory&) = delete;
  void discard() override;

 private:
  size_t rounded_;       // the bytes allocated (bytes() rounded up)
  void* map_ = nullptr;  // lazy buffers: the mapping
  size_t map_bytes_ = 0;
};

// What tensors and their views share: the memory, which can be replaced under them (a model's
// parameters moved to a device stay viewed by every weight carved out of them).
class Storage {
 public:
  explicit Storage(std::unique_ptr<Memory> memory) : memory_(std::move(memory)) {}
  void* data() const { return memory_->data(); }
  size_t bytes() const { return memory_->bytes(); }
  Device device() const { return memory_->device(); }
  Compute& compute() const { return memory_->compute(); }
  void discard() { memory_->discard(); }
  // Every tensor viewing this storage views `memory` from now on (of the same size or larger).
  void replace(std::unique_ptr<Memory> memory) {
    if (memory->bytes() < memory_->bytes())
      throw std::invalid_argument("a storage replaced by smaller memory");
    memory_ = std::move(memory);
  }

 private:
  std::unique_ptr<Memory> memory_;
};

template <typename T>
class TensorT {
 public:
  TensorT() = default;
  // Zeros in host memory.
  explicit TensorT(std::vector<size_t> shape) : shape_(std::move(shape)) {
    storage_ = host_storage(numel() * sizeof(T), false);
  }
  // A tensor over `storage` (a device's memory: Compute::tensor), from its start.
  TensorT(std::vector<size_t> shape, std::shared_ptr<Storage> storage)
      : storage_(std::move(storage)), shape_(std::move(shape)) {
    if (numel() * sizeof(T) > storage_->bytes())
      throw std::out_of_range("a tensor larger than its storage");
  }
  // Zeros that take no memory until written (HostMemory's lazy buffers).
  static TensorT lazy(std::vector<size_t> shape) {
    TensorT t;
    t.shape_ = std::move(shape);
    t.storage_ = host_storage(t.numel() * sizeof(T), true);
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
    if ((v.offset_ + v.numel()) * sizeof(T) > storage_->bytes()) {
      throw std::out_of_range("tensor view past the end of its storage");
    }
    return v;
  }

  // The elements, in the memory of device(): only host memory may be read here; a device's is
  // read and written through its Compute.
  T* data() { return storage_ ? static_cast<T*>(storage_->data()) + offset_ : nullptr; }
  const T* data() const {
    return storage_ ? static_cast<const T*>(storage_->data()) + offset_ : nullptr;
  }
  const std::vector<size_t>& shape() const { return shape_; }
  size_t dim(size_t i) const { return shape_.at(i); }
  size_t numel() const {
    size_t n = 1;
    for (size_t d : shape_) n *= d;
    return shape_.empty() ? 0 : n;
  }
  size_t bytes() const { return numel() * sizeof(T); }
  Device device() const { return storage_ ? storage_->device() : Device::cpu; }
  bool defined() const { return storage_ != nullptr; }
  // The storage this tensor views (shared with its views); null when undefined.
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  // Zeroes a host tensor (a device's: Compute::zero).
  void zero() {
    if (!storage_) return;
    if (device() != Device::cpu)
      throw std::logic_error("Tensor::zero on device memory (use its Compute)");
    std::memset(data(), 0, bytes());
  }

 private:
  static std::shared_ptr<Storage> host_storage(size_t bytes, bool lazy) {
    return std::make_shared<Storage>(std::make_unique<HostMemory>(bytes, lazy));
  }
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  std::vector<size_t> shape_;
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
