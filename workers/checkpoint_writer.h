// A worker's checkpoint shards, written in the background: training stops only while the state
// is copied into host memory (the caller does that, into `Shard::bytes`, buffers it gets back
// with the result and reuses: a copy into memory already touched); one thread then writes
// each shard to a temporary name, fsyncs it, renames it and fsyncs the directory. At most one
// write is in flight. What was written (files, sizes, checksums, times) is taken back by the
// worker's thread and reported to the coordinator, which writes the manifest once every block of
// the checkpoint is durable (coordinator/checkpoints.h).
//
// Thread-safety: start/wait/take_finished from one thread (the worker's).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/job_protocol.h"

namespace troupe::workers {

using actors::checkpoint_dir_name;  // "step-00000120"
using actors::shard_file_name;      // "block-00003.trpblk"

class CheckpointWriter {
 public:
  struct Shard {
    uint32_t block = 0;
    std::vector<uint8_t> bytes;  // models::save_block_state's
  };
  struct WrittenShard {
    uint32_t block = 0;
    std::string file;
    uint64_t bytes = 0, checksum = 0;
  };
  struct Written {
    uint64_t step = 0;
    std::string directory;
    std::vector<WrittenShard> shards;
    double blocking_seconds = 0, write_seconds = 0;
    std::string error;  // "" or why a file could not be written (nothing is reported complete)
    std::vector<Shard> buffers;  // the staging copies, back to be reused by the next checkpoint
  };

  CheckpointWriter() = default;
  ~CheckpointWriter();  // waits for the write in flight
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  bool busy() const { return thread_.joinable() && !done_.load(std::memory_order_acquire); }
  // Starts writing (after waiting for a write in flight, whose result stays to be taken).
  void start(uint64_t step, std::string directory, std::vector<Shard> shards,
             double blocking_seconds);
  // Blocks until the write in flight (if any) is done.
  void wait();
  // The last write, once it is done (and only once).
  std::optional<Written> take_finished();
  // Called on the writing thread after the first shard is durable (a test's fault injection: a
  // writer caught in the middle). Set before the first start().
  void set_mid_write(std::function<void()> f) { mid_write_ = std::move(f); }

 private:
  void write(std::vector<Shard> shards);

  std::thread thread_;
  std::atomic<bool> done_{false};
  Written result_;
  bool taken_ = true;
  std::function<void()> mid_write_;
};

}  // namespace troupe::workers
