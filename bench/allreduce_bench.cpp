// `troupe bench allreduce`: time and bus bandwidth (nccl-tests: 2(n-1)/n * bytes / time) of the
// UCX backend's allreduce between real processes on this host, and the single-core memcpy
// bandwidth as the limit. The peers (OpenMPI, PyTorch gloo) run from bench/compare_allreduce.sh
// in the same session.
//
// `troupe bench allreduce-worker` is one rank (started by the benchmark and the failure tests).
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/bench.h"
#include "bench/rendezvous.h"
#include "cli/parse.h"
#include "comm/buffer.h"
#include "comm/reduce.h"
#include "comm/ucx_communicator.h"
#include "coordinator/process.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t unix_ms() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return uint64_t(tv.tv_sec) * 1000 + tv.tv_usec / 1000;
}

// --dtype: f32 or i64 (its option checks the name).
comm::DataType data_type_of(const std::string& dtype) {
  return dtype == "i64" ? comm::DataType::i64 : comm::DataType::f32;
}

size_t parse_size(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {  // (it said "stod")
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    throw std::invalid_argument("bad size '" + s + "' (use 4K, 1M, 64M)");
  }
  std::string unit = s.substr(used);
  double mul = 1;
  if (unit == "K" || unit == "KiB")
    mul = 1024;
  else if (unit == "M" || unit == "MiB")
    mul = 1024.0 * 1024;
  else if (unit == "G" || unit == "GiB")
    mul = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B")
    throw std::invalid_argument("bad size '" + s + "' (use 4K, 1M, 64M)");
  if (!(v * mul >= 1 && v * mul <= 0x1p40))  // (also NaN)
    throw std::invalid_argument("size '" + s + "' is not from 1 byte to 1 TiB");
  return size_t(v * mul);
}

std::vector<size_t> parse_sizes(const std::string& list) {
  std::vector<size_t> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(parse_size(item));
  return out;
}

comm::Algorithm parse_algorithm(const std::string& name) {
  if (name == "auto") return comm::Algorithm::automatic;
  if (name == "ring") return comm::Algorithm::ring;
  if (name == "rd") return comm::Algorithm::recursive_doubling;
  if (name == "shm") return comm::Algorithm::shared_memory;
  throw std::invalid_argument("--algorithm must be auto, ring, rd or shm, not '" + name + "'");
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= 1024 && bytes % 1024 == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

double memcpy_gbps() {
  const size_t n = 256u << 20;
  comm::Buffer a(n), b(n);
  std::memset(a.data(), 1, n);
  std::memset(b.data(), 2, n);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return 2.0 * n / t[2] / 1e9;  // counting reads and writes
}

}  // namespace

namespace {

// A buffer of the caller's (plain host memory) or registered with the communicator (in its
// shared arena: comm/shared_arena.h), zeroed.
class BenchBuffer {
 public:
  BenchBuffer(size_t bytes, comm::SharedArena* arena) : arena_(arena), plain_(arena ? 0 : bytes) {
    data_ = arena ? static_cast<uint8_t*>(arena->allocate(bytes)) : plain_.data();
    if (arena && !data_) throw std::runtime_error("the registered arena is full");
    if (!data_) return;
    std::memset(data_, 0, bytes);
  }
  ~BenchBuffer() {
    if (arena_) arena_->release(data_);
  }
  uint8_t* data() { return data_; }

 private:
  comm::SharedArena* arena_;
  comm::Buffer plain_;
  uint8_t* data_;
};

// Times each size's allreduce (3 trials of about min_seconds; the median); rank 0 prints JSON
// (with registered buffers: which fraction of the calls read them in place).
void time_sizes(comm::UcxCommunicator& comm, const std::vector<size_t>& sizes, double min_seconds,
                const comm::CollectiveOptions& timed, comm::DataType type,
                comm::SharedArena* arena) {
  const size_t es = comm::element_size(type);
  const int world = comm.size();
  for (size_t bytes : sizes) {
    size_t count = std::max<size_t>(1, bytes / es);
    BenchBuffer buf(count * es, arena);
    auto* f = buf.data();
    const uint64_t registered_before = comm.registered_allreduces();
    uint64_t calls = 0;
    comm.allreduce(f, f, count, type, comm::ReduceOp::sum, timed);  // warm-up
    // Iterations so that one trial takes about min_seconds (agreed: rank 0's estimate).
    comm.barrier();
    auto t0 = Clock::now();
    comm.allreduce(f, f, count, type, comm::ReduceOp::sum, timed);
    double est = std::chrono::duration<double>(Clock::now() - t0).count();
    double iters_d = std::max(1.0, std::min(10000.0, min_seconds / std::max(est, 1e-7)));
    comm.broadcast(&iters_d, 1, comm::DataType::f64, 0);
    int iters = int(iters_d);
    std::vector<double> trials;
    for (int trial = 0; trial < 3; ++trial) {
      comm.barrier();
      auto start = Clock::now();
      for (int i = 0; i < iters; ++i) comm.allreduce(f, f, count, type, comm::ReduceOp::sum, timed);
      calls += uint64_t(iters);
      double per_op = std::chrono::duration<double>(Clock::now() - start).count() / iters;
      comm.allreduce(&per_op, &per_op, 1, comm::DataType::f64, comm::ReduceOp::avg);
      trials.push_back(per_op);
    }
    std::sort(trials.begin(), trials.end());
    double t = trials[1];
    // (The warm-up and the estimate count too: calls + 2.)
    const double in_place =
        double(comm.registered_allreduces() - registered_before) / double(calls + 2);
    if (comm.rank() == 0) {
      double busbw = 2.0 * (world - 1) / world * double(count * es) / t / 1e9;
      std::printf(
          "{\"bench\":\"allreduce\",\"impl\":\"%s\",\"workers\":%d,\"bytes\":%zu,"
          "\"size\":\"%s\",\"dtype\":\"%s\",\"time_us\":%.2f,\"busbw_gbps\":%.3f,\"iters\":%d,"
          "\"registered\":%.2f}\n",
          arena ? "troupe_ucx_registered" : "troupe_ucx", world, count * es,
          human(count * es).c_str(), comm::dtype_name(type), t * 1e6, busbw, iters, in_place);
      std::fflush(stdout);
    }
  }
  comm.barrier();
}

// Multi-process correctness: closed-form results for every count and algorithm (with an arena:
// its in-place calls in registered buffers); 0 or 4.
int check_every_count(comm::UcxCommunicator& comm, comm::SharedArena* arena) {
  const int world = comm.size(), rank = comm.rank();
  const size_t counts[] = {0, 1, 7, 1023, 65537, 3 * (size_t(1) << 20) + 5};
  for (size_t count : counts) {
    for (auto algo : {comm::Algorithm::ring, comm::Algorithm::recursive_doubling,
                      comm::Algorithm::shared_memory}) {
      for (bool in_place : {true, false}) {
        BenchBuffer in_buf(count * sizeof(float), in_place ? arena : nullptr);
        auto* in = reinterpret_cast<float*>(in_buf.data());
        std::vector<float> out(count, -1);
        for (size_t i = 0; i < count; ++i) in[i] = float((rank + 1) * (i % 5 + 1));
        comm::CollectiveOptions o;
        o.algorithm = algo;
        comm.allreduce(in, in_place ? in : out.data(), count, comm::DataType::f32,
                       comm::ReduceOp::sum, o);
        const float* got = in_place ? in : out.data();
        for (size_t i = 0; i < count; ++i) {
          if (got[i] != float((i % 5 + 1) * world * (world + 1) / 2)) {
            std::printf("check failed: count %zu element %zu got %f\n", count, i, got[i]);
            return 4;
          }
        }
      }
    }
  }
  // Leave only when everyone is done: a rank that exits while another still waits for the
  // acknowledgement of its last send would fail that rank with peer_lost.
  comm.barrier();
  std::printf("check ok rank %d shared-memory %d registered %llu %s\n", rank,
              int(comm.shared_memory_allreduce()), (unsigned long long)comm.registered_allreduces(),
              comm.shared_memory_fallback_reason().c_str());
  return 0;
}

// One call of the failure tests' operation on `count` floats (allgather: count per rank;
// sendrecv: to the next rank, from the previous one).
void call_once(comm::Communicator& comm, const std::string& op, float* in, size_t count,
               std::vector<float>& out, const comm::CollectiveOptions& timed) {
  const int n = comm.size(), r = comm.rank();
  if (op == "allreduce")
    comm.allreduce(in, in, count, comm::DataType::f32, comm::ReduceOp::sum, timed);
  else if (op == "broadcast")
    comm.broadcast(in, count, comm::DataType::f32, 0, timed);
  else if (op == "allgather")
    comm.allgather(in, out.data(), count, comm::DataType::f32, timed);
  else  // sendrecv
    comm.sendrecv(in, count * 4, (r + 1) % n, out.data(), count * 4, (r + n - 1) % n, comm::Tag(7),
                  timed);
}

// The survivors' old ranks, in new-rank order, once the test writes DIR/gen2.members (60 s).
std::vector<int> read_members(const std::string& dir) {
  std::vector<int> members;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (members.empty() && Clock::now() < deadline) {
    std::ifstream in(dir + "/gen2.members");
    for (int r; in >> r;) members.push_back(r);
    if (members.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return members;
}

// Generation 2 of the survivors: one allreduce, checked; 0, 3 (no member list) or 4.
int rebuild_and_check(const std::string& dir, int rank, const comm::UcxCommOptions& opt) {
  std::vector<int> members = read_members(dir);
  if (members.empty()) return 3;
  int new_rank = int(std::find(members.begin(), members.end(), rank) - members.begin());
  if (new_rank >= int(members.size())) return 0;  // not a member of the next generation
  auto next = std::make_unique<comm::UcxCommunicator>(2, opt);
  auto addrs = file_rendezvous(dir, "gen2", new_rank, int(members.size()), next->address(),
                               std::chrono::seconds(30));
  next->connect(new_rank, addrs, std::chrono::seconds(30));
  const size_t check = 1 << 20;
  std::vector<float> x(check);
  for (size_t i = 0; i < check; ++i) x[i] = float((new_rank + 1) * (i % 7 + 1));
  next->allreduce(x.data(), x.data(), check, comm::DataType::f32, comm::ReduceOp::sum);
  int n = int(members.size());
  for (size_t i = 0; i < check; ++i) {
    if (x[i] != float((i % 7 + 1) * n * (n + 1) / 2)) {
      std::printf("gen2 wrong at %zu\n", i);
      return 4;
    }
  }
  next->barrier();
  std::printf("gen2 ok world %d rank %d\n", n, new_rank);
  std::fflush(stdout);
  return 0;
}

// Failure tests: `op` until something fails (printing "iter N", then "error CODE at MS: why");
// then rebuild with the survivors the test names and check one allreduce. (arena: `op`'s buffer
// is registered.)
int fail_then_rebuild(std::unique_ptr<comm::UcxCommunicator> comm, const std::string& dir,
                      const std::string& op, size_t count, const comm::UcxCommOptions& opt,
                      const comm::CollectiveOptions& timed, comm::SharedArena* arena) {
  const int rank = comm->rank();
  BenchBuffer in_buf(count * sizeof(float), arena);
  auto* in = reinterpret_cast<float*>(in_buf.data());
  std::vector<float> out(op == "allgather" ? count * comm->size() : count);
  for (int iter = 1;; ++iter) {
    for (size_t i = 0; i < count; i += 4096) in[i] = 1.0f;
    try {
      call_once(*comm, op, in, count, out, timed);
    } catch (const comm::Error& e) {
      std::printf("error %s at %llu: %s\n", comm::errc_name(e.code()),
                  (unsigned long long)unix_ms(), e.what());
      std::fflush(stdout);
      break;
    }
    std::printf("iter %d registered %llu\n", iter,
                (unsigned long long)comm->registered_allreduces());
    std::fflush(stdout);
  }
  comm.reset();  // the broken generation goes away
  return rebuild_and_check(dir, rank, opt);
}

}  // namespace

int run_allreduce_worker(const std::vector<std::string>& words) {
  CLI::App app{"One rank of `troupe bench allreduce` (started by it; also the tests' peer).",
               "troupe bench allreduce-worker"};
  std::string dir, sizes = "4K,1M,64M", mode = "bench", algorithm = "auto", op = "allreduce";
  std::string dtype = "f32", buffers = "user";
  int rank = -1, world = 0;
  int64_t timeout_ms = 30000;
  size_t count = 16 << 20;
  double min_seconds = 0.3;
  comm::UcxCommOptions opt;
  app.add_option("--dir", dir, "the rendezvous directory")->required();
  app.add_option("--rank", rank, "this rank")->required();
  app.add_option("--world", world, "the number of ranks")->required()->check(cli::kPositive);
  app.add_option("--sizes", sizes, "bytes per allreduce, e.g. 4K,1M,64M");
  app.add_option("--mode", mode, "bench; check or loop (the multi-process tests)")
      ->check(CLI::IsMember({"bench", "check", "loop"}));
  app.add_option("--op", op, "loop: the operation")
      ->check(CLI::IsMember({"allreduce", "broadcast", "allgather", "sendrecv"}));
  app.add_option("--count", count, "loop: floats per call");
  app.add_option("--timeout-ms", timeout_ms, "the data plane's failure timeout");
  app.add_option("--min-seconds", min_seconds, "time each size at least this long");
  app.add_option("--segment-bytes", opt.segment_bytes, "ring chunk size");
  app.add_option("--window", opt.window, "ring chunks in flight");
  app.add_option("--shm-slice-bytes", opt.shm_slice_bytes, "shared-memory slice size");
  app.add_option("--algorithm", algorithm, "auto, ring, rd or shm");
  app.add_option("--dtype", dtype, "f32, or i64 (parallel.deterministic's sums)")
      ->check(CLI::IsMember({"f32", "i64"}));
  app.add_option("--buffers", buffers, "user, or registered (in the communicator's arena)")
      ->check(CLI::IsMember({"user", "registered"}));
  if (auto rc = cli::parse(app, words)) return *rc;
  if (rank < 0 || rank >= world) throw std::invalid_argument("--rank must be in [0, --world)");
  opt.timeout = std::chrono::milliseconds(timeout_ms);
  std::shared_ptr<comm::SharedArena> arena;
  if (buffers == "registered") {
    size_t most = std::max<size_t>(16u << 20, count * sizeof(float));  // (check, loop modes)
    for (size_t b : parse_sizes(sizes)) most = std::max(most, b + 64);
    std::string why;
    arena = comm::SharedArena::create(most, &why);
    if (!arena) throw std::runtime_error("registered buffers: " + why);
    opt.registered = arena;
  }
  comm::CollectiveOptions timed;  // the timed (or looped) calls
  timed.algorithm = parse_algorithm(algorithm);
  auto comm = std::make_unique<comm::UcxCommunicator>(1, opt);
  auto addrs = file_rendezvous(dir, "gen1", rank, world, comm->address(), std::chrono::seconds(30));
  comm->connect(rank, addrs, std::chrono::seconds(30));
  if (mode == "check") return check_every_count(*comm, arena.get());
  if (mode == "loop")
    return fail_then_rebuild(std::move(comm), dir, op, count, opt, timed, arena.get());
  time_sizes(*comm, parse_sizes(sizes), min_seconds, timed, data_type_of(dtype), arena.get());
  return 0;
}

namespace {

// A rank 0 line of `world` processes: as it is (JSON), or as a row of the table.
void print_result(const std::string& line, int world, bool json) {
  if (json) {
    std::printf("%s\n", line.c_str());
  } else {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return;  // (not a result)
    std::printf("%8d %8s %12.2f %12.3f\n", world, j.value("size", "").c_str(),
                j.value("time_us", 0.0), j.value("busbw_gbps", 0.0));
  }
  std::fflush(stdout);
}

// One size sweep with `world` rank processes (`troupe bench allreduce-worker` and `args`): their
// results printed as rank 0 reports them. False when a rank failed (its error is on stderr).
bool run_ranks(const std::string& exe, int world, const std::vector<std::string>& args, bool json) {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe-bench-" + std::to_string(getpid()) + "-" + std::to_string(world));
  std::filesystem::create_directories(dir);
  std::vector<std::unique_ptr<coordinator::ChildProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv{exe,
                                  "bench",
                                  "allreduce-worker",
                                  "--dir",
                                  dir.string(),
                                  "--rank",
                                  std::to_string(r),
                                  "--world",
                                  std::to_string(world)};
    argv.insert(argv.end(), args.begin(), args.end());
    ranks.push_back(std::make_unique<coordinator::ChildProcess>(
        coordinator::ChildProcess::Options{argv, "", "", {}}));
  }
  while (auto line = ranks[0]->read_line(std::chrono::seconds(600)))
    print_result(*line, world, json);
  bool ok = true;
  for (int r = 0; r < world; ++r) {
    const std::optional<int> status = ranks[size_t(r)]->wait(std::chrono::seconds(10));
    if (!status || !WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
      std::fprintf(stderr, "troupe bench: rank %d of %d failed (its error is above)\n", r, world);
      ok = false;
    }
  }
  std::filesystem::remove_all(dir);
  return ok;
}

}  // namespace

int run_allreduce_bench(const std::vector<std::string>& words) {
  CLI::App app{
      "Allreduce between processes (ucx) or GPUs (nccl): time and bus bandwidth per "
      "size.",
      "troupe bench allreduce"};
  std::string sizes = "4K,64K,1M,16M,64M,256M", backend = "ucx", algorithm = "auto", dtype = "f32",
              buffers = "user";
  std::string min_seconds = "0.3";
  comm::UcxCommOptions defaults;
  std::string segment = std::to_string(defaults.segment_bytes),
              window = std::to_string(defaults.window),
              slice = std::to_string(defaults.shm_slice_bytes);
  std::vector<int> worlds;
  bool json = false;
  app.add_option("--workers", worlds, "process counts, repeatable (default 2 and 4)")
      ->check(cli::kPositive);
  app.add_option("--sizes", sizes, "bytes per allreduce, e.g. 4K,1M,64M");
  app.add_option("--backend", backend, "ucx or nccl")->check(CLI::IsMember({"ucx", "nccl"}));
  app.add_option("--dtype", dtype, "f32, or i64 (parallel.deterministic's sums)")
      ->check(CLI::IsMember({"f32", "i64"}));
  app.add_option("--algorithm", algorithm, "auto, ring, rd or shm");
  app.add_option("--min-seconds", min_seconds, "time each size at least this long")
      ->check(CLI::Range(0.0, 3600.0));  // (here: the workers' own refusal named them)
  app.add_option("--segment-bytes", segment, "ring chunk size (bytes, or 64K, 1M)");
  app.add_option("--window", window, "ring chunks in flight")->check(cli::kPositive);
  app.add_option("--shm-slice-bytes", slice,
                 "shared-memory slice size (bytes, or 64K, 1M); registered buffers go in the CPU's "
                 "own where it has one (comm::peer_lines)");
  app.add_option("--buffers", buffers,
                 "user (the caller's memory), or registered (in the communicator's arena: read "
                 "in place by the others, as a training job's gradients)")
      ->check(CLI::IsMember({"user", "registered"}));
  app.add_flag("--json", json, "JSON lines");
  if (auto rc = cli::parse(app, words)) return *rc;
  parse_algorithm(algorithm);                     // refused here, before any process starts
  segment = std::to_string(parse_size(segment));  // the workers take bytes: 64K -> 65536
  slice = std::to_string(parse_size(slice));
  const size_t element = comm::element_size(data_type_of(dtype));
  for (size_t b : parse_sizes(sizes))  // (refused here too: -5, 0, 2T; 6 ran as 4 bytes)
    if (b % element != 0)
      throw std::invalid_argument("size " + std::to_string(b) + " is not a whole number of " +
                                  dtype + " elements (" + std::to_string(element) + " bytes)");
  if (backend == "nccl") return run_nccl_allreduce_bench(parse_sizes(sizes), json);
  if (worlds.empty()) worlds = {2, 4};
  std::string exe = coordinator::self_executable();
  double copy = memcpy_gbps();
  const char* lines = comm::peer_lines().name;  // (an unknown TROUPE_PEER_LINES fails here)
  if (json) {
    std::printf(
        "{\"bench\":\"memcpy\",\"impl\":\"memcpy\",\"busbw_gbps\":%.3f,\"note\":\"one core, "
        "reads+writes\",\"peer_lines\":\"%s\"}\n",
        copy, lines);
  } else {
    std::printf("single-core memcpy: %.2f GB/s (reads + writes); shared lines: the %s choice\n",
                copy, lines);
    std::printf("%8s %8s %12s %12s\n", "workers", "size", "time us", "busbw GB/s");
  }
  const std::vector<std::string> args{"--sizes",           sizes,   "--min-seconds", min_seconds,
                                      "--segment-bytes",   segment, "--window",      window,
                                      "--shm-slice-bytes", slice,   "--algorithm",   algorithm,
                                      "--dtype",           dtype,   "--buffers",     buffers};
  bool failed = false;
  for (int world : worlds) failed |= !run_ranks(exe, world, args, json);
  return failed ? 1 : 0;
}

}  // namespace troupe::bench
