#include "comm/nccl_communicator.h"

#include "comm/hex.h"
#include "comm/reduce.h"

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <sched.h>

#include <atomic>
#include <cstring>

namespace troupe::comm {

#ifndef TROUPE_HAVE_CUDA

std::string nccl_unique_id() { TROUPE_FAIL(Errc::io, "this build has no CUDA/NCCL support"); }

std::unique_ptr<Communicator> make_nccl_communicator(uint64_t, int, int, const std::string&,
                                                     const NcclOptions&) {
  TROUPE_FAIL(Errc::io, "this build has no CUDA/NCCL support (configure with TROUPE_WITH_CUDA)");
}

#else

// The one wrapping layer over CUDA's and NCCL's status codes.
#define TROUPE_CUDA_CHECK(expr)                                                 \
  do {                                                                          \
    cudaError_t troupe_err_ = (expr);                                           \
    if (troupe_err_ != cudaSuccess)                                             \
      TROUPE_FAIL(::troupe::comm::Errc::io,                                     \
                  std::string(#expr) + ": " + cudaGetErrorString(troupe_err_)); \
  } while (0)

namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t nccl_type(DataType t) {
  switch (t) {
    case DataType::f32:
      return ncclFloat32;
    case DataType::f64:
      return ncclFloat64;
    case DataType::bf16:
      return ncclBfloat16;
    case DataType::f16:
      return ncclFloat16;
    case DataType::i64:
      return ncclInt64;
  }
  TROUPE_FAIL(Errc::invalid_input, "unknown element type");
}

ncclUniqueId id_from_hex(const std::string& s) {
  ncclUniqueId id;
  auto bytes = from_hex(s);
  if (bytes.size() != sizeof(id.internal))
    TROUPE_FAIL(Errc::invalid_input, "an NCCL unique id has 256 hex digits");
  std::memcpy(id.internal, bytes.data(), bytes.size());
  return id;
}

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(uint64_t gen, int rank, int size, const ncclUniqueId& id, const NcclOptions& o)
      : gen_(gen), rank_(rank), size_(size), opt_(o) {
    TROUPE_CUDA_CHECK(cudaSetDevice(o.device));
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // init and operations return at once; we poll with deadlines
    ncclResult_t r = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      if (comm_) ncclCommAbort(comm_);
      cudaStreamDestroy(stream_);
      TROUPE_FAIL(Errc::io, std::string("ncclCommInitRankConfig: ") + ncclGetErrorString(r));
    }
    const auto start = Clock::now();
    try {
      poll_comm("init", start, start + o.timeout);  // (a failure aborts comm_ first)
    } catch (...) {
      cudaStreamDestroy(stream_);  // no destructor runs for a constructor that throws
      throw;
    }
  }

  ~NcclCommunicator() override {
    if (comm_) {
      // A healthy communicator could be destroyed, but one whose peers died would hang in
      // ncclCommDestroy; abort is always safe.
      ncclCommAbort(comm_);
    }
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t generation() const override { return gen_; }

  void allreduce(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                 const CollectiveOptions& o) override {
    check_reduction(t, op);
    run("allreduce", o, [&] {
      return ncclAllReduce(in ? in : out, out, count, nccl_type(t),
                           op == ReduceOp::avg ? ncclAvg : ncclSum, comm_, stream_);
    });
  }
  void broadcast(void* buf, size_t count, DataType t, int root,
                 const CollectiveOptions& o) override {
    run("broadcast", o,
        [&] { return ncclBroadcast(buf, buf, count, nccl_type(t), root, comm_, stream_); });
  }
  void allgather(const void* in, void* out, size_t count, DataType t,
                 const CollectiveOptions& o) override {
    run("allgather", o,
        [&] { return ncclAllGather(in, out, count, nccl_type(t), comm_, stream_); });
  }
  void reduce_scatter(const void* in, void* out, size_t count, DataType t, ReduceOp op,
                      const CollectiveOptions& o) override {
    check_reduction(t, op);
    run("reduce_scatter", o, [&] {
      return ncclReduceScatter(in, out, count, nccl_type(t),
                               op == ReduceOp::avg ? ncclAvg : ncclSum, comm_, stream_);
    });
  }
  void send(const void* buf, size_t bytes, int peer, Tag, const CollectiveOptions& o) override {
    run("send", o, [&] { return ncclSend(buf, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void recv(void* buf, size_t bytes, int peer, Tag, const CollectiveOptions& o) override {
    run("recv", o, [&] { return ncclRecv(buf, bytes, ncclUint8, peer, comm_, stream_); });
  }
  void send_many(const std::vector<Span>& spans, int peer, Tag,
                 const CollectiveOptions& o) override {
    run("send_many", o, [&] {
      ncclResult_t r = ncclGroupStart();
      for (const Span& s : spans)
        if (r == ncclSuccess) r = ncclSend(s.data, s.bytes, ncclUint8, peer, comm_, stream_);
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  void recv_many(const std::vector<Span>& spans, int peer, Tag,
                 const CollectiveOptions& o) override {
    run("recv_many", o, [&] {
      ncclResult_t r = ncclGroupStart();
      for (const Span& s : spans)
        if (r == ncclSuccess) r = ncclRecv(s.data, s.bytes, ncclUint8, peer, comm_, stream_);
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  void sendrecv(const void* send_buf, size_t send_bytes, int send_peer, void* recv_buf,
                size_t recv_bytes, int recv_peer, Tag, const CollectiveOptions& o) override {
    run("sendrecv", o, [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (send_peer >= 0) r = ncclSend(send_buf, send_bytes, ncclUint8, send_peer, comm_, stream_);
      if (r == ncclSuccess && recv_peer >= 0)
        r = ncclRecv(recv_buf, recv_bytes, ncclUint8, recv_peer, comm_, stream_);
      ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }
  void barrier(const CollectiveOptions& o) override {
    if (!scratch_) TROUPE_CUDA_CHECK(cudaMalloc(&scratch_, sizeof(float)));
    allreduce(scratch_, scratch_, 1, DataType::f32, ReduceOp::sum, o);
  }
  // ncclCommSplit, non-blocking and polled like init; the group shares this communicator's
  // abort flag (an abort of either breaks both).
  std::unique_ptr<Communicator> split(int color, int key, const CollectiveOptions& o) override {
    if (broken_) throw *broken_;
    const auto start = Clock::now();
    auto deadline = start + (o.timeout.count() > 0 ? o.timeout : opt_.timeout);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t child = nullptr;
    ncclResult_t r =
        ncclCommSplit(comm_, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &child, &config);
    if (r != ncclSuccess && r != ncclInProgress)
      fail(Errc::io, std::string("ncclCommSplit: ") + ncclGetErrorString(r));
    poll_comm("split", start, deadline);
    if (color < 0 || !child) return nullptr;
    return std::unique_ptr<Communicator>(new NcclCommunicator(*this, child, start, deadline));
  }
  void abort() override { aborted_->store(true); }

 private:
  // A group made by split(): polls the child until it is ready, then learns its rank and size.
  NcclCommunicator(const NcclCommunicator& parent, ncclComm_t child, Clock::time_point start,
                   Clock::time_point deadline)
      : gen_(parent.gen_), opt_(parent.opt_), comm_(child), aborted_(parent.aborted_) {
    TROUPE_CUDA_CHECK(cudaSetDevice(opt_.device));
    TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    poll_comm("split", start, deadline);
    if (ncclCommUserRank(comm_, &rank_) != ncclSuccess ||
        ncclCommCount(comm_, &size_) != ncclSuccess)
      fail(Errc::io, "split: cannot read the group's rank and size");
  }

  template <typename Enqueue>
  void run(const char* what, const CollectiveOptions& o, Enqueue enqueue) {
    if (broken_) throw *broken_;
    if (aborted_->load()) fail(Errc::aborted, std::string(what) + ": the communicator was aborted");
    // (The calling thread may be another than the one that made it: a reducer's.)
    if (cudaError_t e = cudaSetDevice(opt_.device); e != cudaSuccess)
      fail(Errc::io, std::string(what) + ": cudaSetDevice: " + cudaGetErrorString(e));
    const auto start = Clock::now();
    auto deadline = start + (o.timeout.count() > 0 ? o.timeout : opt_.timeout);
    ncclResult_t r = enqueue();
    if (r != ncclSuccess && r != ncclInProgress)
      fail(Errc::io, std::string(what) + ": " + ncclGetErrorString(r));
    poll_comm(what, start, deadline);
    // Poll the stream: never a blocking synchronise that a dead peer could hang.
    while (true) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(Errc::io, std::string(what) + ": " + cudaGetErrorString(e));
      check(what, start, deadline);
      sched_yield();
    }
  }

  // Waits for the communicator's pending state (init, or an enqueue) to settle.
  void poll_comm(const char* what, Clock::time_point start, Clock::time_point deadline) {
    while (true) {
      ncclResult_t state = ncclInProgress;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess)
        fail(Errc::io, std::string(what) + ": ncclCommGetAsyncError: " + ncclGetErrorString(r));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress)
        fail(Errc::peer_lost, std::string(what) + ": " + ncclGetErrorString(state));
      check(what, start, deadline);
      sched_yield();
    }
  }

  // An abort, NCCL's asynchronous error, the generation abandoned, or the deadline: fail.
  void check(const char* what, Clock::time_point start, Clock::time_point deadline) {
    if (aborted_->load()) fail(Errc::aborted, std::string(what) + ": the communicator was aborted");
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
        state != ncclInProgress) {
      fail(Errc::peer_lost, std::string(what) + ": " + ncclGetErrorString(state));
    }
    const auto now = Clock::now();
    if (opt_.abandoned && now - start > opt_.abandon_after && opt_.abandoned())
      fail(Errc::peer_lost,
           std::string(what) + ": the generation is being ended (a member is gone)");
    if (now > deadline)
      fail(Errc::timed_out, std::string(what) + ": no completion before the deadline");
  }

  [[noreturn]] void fail(Errc code, const std::string& why) {
    if (comm_) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    broken_ = std::make_unique<Error>(code, why + " (NCCL, generation " + std::to_string(gen_) +
                                                ", rank " + std::to_string(rank_) + ")");
    throw *broken_;
  }

  uint64_t gen_;
  int rank_ = 0, size_ = 0;
  NcclOptions opt_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* scratch_ = nullptr;
  std::shared_ptr<std::atomic<bool> > aborted_ = std::make_shared<std::atomic<bool> >(false);
  std::unique_ptr<Error> broken_;
};

}  // namespace

std::string nccl_unique_id() {
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    TROUPE_FAIL(Errc::io, std::string("ncclGetUniqueId: ") + ncclGetErrorString(r));
  return to_hex(id.internal, sizeof(id.internal));
}

std::unique_ptr<Communicator> make_nccl_communicator(uint64_t generation, int rank, int size,
                                                     const std::string& unique_id_hex,
                                                     const NcclOptions& options) {
  if (size <= 0 || rank < 0 || rank >= size) {
    TROUPE_FAIL(Errc::invalid_input,
                "rank " + std::to_string(rank) + " of " + std::to_string(size));
  }
  return std::make_unique<NcclCommunicator>(generation, rank, size, id_from_hex(unique_id_hex),
                                            options);
}

#endif

}  // namespace troupe::comm
