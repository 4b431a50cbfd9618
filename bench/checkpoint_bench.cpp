// `troupe bench checkpoint`: what a checkpoint costs, on a state of --params parameters with
// AdamW moments (an MLP of 4096-wide layers: 16.8M parameters a block), next to the limits
// measured in the same run:
//   blocking  training waits while every block's state is copied into host memory
//             (models::save_block_state)             vs memcpy of the same bytes
//   write     the background write (workers::CheckpointWriter: temporary name, fsync, rename)
//             vs `dd if=/dev/zero bs=16M conv=fsync` of the same bytes into the same directory
//   restore   reading the shards and loading them into the blocks
// bench/compare_checkpoint.sh puts torch.save / torch.load of the same state next to it.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "bench/bench.h"
#include "cli/parse.h"
#include "models/model.h"
#include "models/optim.h"
#include "models/state.h"
#include "workers/checkpoint_writer.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The disk's rate for `bytes` written and fsynced, by dd, in seconds.
double dd_seconds(const std::string& dir, size_t bytes) {
  const std::string file = dir + "/dd.tmp";
  const std::string cmd = "dd if=/dev/zero of=" + file +
                          " bs=16M count=" + std::to_string((bytes + (16 << 20) - 1) / (16 << 20)) +
                          " conv=fsync status=none";
  auto t0 = Clock::now();
  const int rc = std::system(cmd.c_str());
  const double s = since(t0);
  std::filesystem::remove(file);
  return rc == 0 ? s : -1;
}

// A directory of its own in `in` (default: /tmp) for the files, the only one removed at the end
// (it removed --dir itself, with whatever the user had there).
struct BenchDir {
  explicit BenchDir(const std::string& in) {
    const std::string where = in.empty() ? std::filesystem::temp_directory_path().string() : in;
    std::filesystem::create_directories(where);
    path = where + "/troupe-ckpt-bench-XXXXXX";
    if (!::mkdtemp(path.data()))
      throw std::runtime_error("--dir " + where +
                               ": cannot make a directory there: " + std::strerror(errno));
  }
  ~BenchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;
  std::string path;
};

}  // namespace

int run_checkpoint_bench(const std::vector<std::string>& words) {
  CLI::App app{"What a checkpoint costs: blocking copy, background write, restore.",
               "troupe bench checkpoint"};
  double params = 100e6;
  std::string dir;
  bool json = false;
  app.add_option("--params", params,
                 "parameters (rounded up to whole 4096 x 4096 layers: 16.8M each)")
      ->check(cli::kPositive);
  app.add_option("--dir", dir,
                 "where to write: a directory of its own is made in DIR and removed at the end "
                 "(default: in /tmp)");
  app.add_flag("--json", json, "one JSON line");
  if (auto rc = cli::parse(app, words)) return *rc;
  const size_t width = 4096, blocks = std::max<size_t>(
                                 1, size_t(std::ceil(params / double(width * width + width))));
  models::ModelSpec spec;
  spec.kind = "mlp";
  spec.mlp_sizes.assign(blocks + 1, width);
  models::Model model(spec);
  model.init(1);
  const std::vector<size_t> counts = model.block_param_counts();
  models::OptimizerSpec os;  // adamw: two moments a parameter
  models::Optimizer opt(os, counts);
  for (size_t b = 0; b < model.num_blocks(); ++b) {  // moments with values (touched memory)
    std::memcpy(opt.m(b).data(), model.block(b).params().data(), counts[b] * 4);
    std::memcpy(opt.v(b).data(), model.block(b).params().data(), counts[b] * 4);
  }
  const BenchDir own(dir);
  dir = own.path;

  // Blocking: the copies a checkpoint takes at the step boundary. The first one allocates its
  // staging buffers (page faults); every later one copies into them, as a worker does.
  std::vector<workers::CheckpointWriter::Shard> shards(model.num_blocks());
  auto stage = [&] {
    auto t = Clock::now();
    for (uint32_t b = 0; b < model.num_blocks(); ++b) {
      shards[b].block = b;
      models::save_block_state_into(shards[b].bytes, model.block(b), b, opt, {10, 0});
    }
    return since(t);
  };
  const double first_blocking = stage();
  const double blocking = stage();
  size_t bytes = 0;
  for (const auto& s : shards) bytes += s.bytes.size();
  // The memcpy of the same bytes, into memory already touched (as the second stage()).
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  auto t0 = Clock::now();
  std::memcpy(dst.data(), src.data(), bytes);
  const double copy = since(t0);
  std::vector<char>().swap(src);
  std::vector<char>().swap(dst);
  // The background write.
  workers::CheckpointWriter writer;
  t0 = Clock::now();
  writer.start(10, dir + "/step-00000010", std::move(shards), blocking);
  writer.wait();
  const double write = since(t0);
  auto done = writer.take_finished();
  const double disk = dd_seconds(dir, bytes);
  // Restore: read each shard into a model just built (its memory not yet touched, as a worker
  // starting from a checkpoint has it), from the page cache (torch.load's peer reads the same).
  models::Model fresh(spec);
  models::Optimizer fresh_opt(os, counts);
  t0 = Clock::now();
  for (uint32_t b = 0; b < fresh.num_blocks(); ++b) {
    models::load_block_state_file(dir + "/step-00000010/" + workers::shard_file_name(b),
                                  fresh.block(b), b, fresh_opt);
  }
  const double restore = since(t0);
  const double gb = double(bytes) / 1e9;
  if (json) {
    std::printf(
        "{\"bench\":\"checkpoint\",\"impl\":\"troupe\",\"params\":%zu,\"bytes\":%zu,"
        "\"first_blocking_s\":%.4f,\"blocking_s\":%.4f,\"memcpy_s\":%.4f,\"write_s\":%.4f,\"dd_"
        "fsync_s\":%.4f,"
        "\"restore_s\":%.4f,\"error\":\"%s\"}\n",
        model.param_count(), bytes, first_blocking, blocking, copy, write, disk, restore,
        done ? done->error.c_str() : "");
  } else {
    std::printf("state: %zu parameters with AdamW moments, %.2f GB in %zu shards\n",
                model.param_count(), gb, size_t(model.num_blocks()));
    std::printf("  blocking copy %.3f s (memcpy %.3f s: %.2fx; the first, allocating: %.3f s)\n",
                blocking, copy, blocking / copy, first_blocking);
    std::printf("  write %.3f s, %.2f GB/s (dd with fsync %.3f s: %.2fx)\n", write, gb / write,
                disk, write / disk);
    std::printf("  restore %.3f s, %.2f GB/s\n", restore, gb / restore);
  }
  return 0;
}

}  // namespace troupe::bench
