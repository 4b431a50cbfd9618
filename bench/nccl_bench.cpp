// `troupe bench allreduce --backend nccl`: NCCL allreduce over this machine's GPUs, ranks as
// threads of one process (one per device). Time, algorithm bandwidth (bytes / time) and bus
// bandwidth (nccl-tests: 2(n-1)/n * bytes / time; 0 for one GPU, where nothing crosses a bus).
#include <cstdio>
#include <thread>

#include "bench/bench.h"
#include "comm/cuda_info.h"
#include "comm/nccl_communicator.h"

#ifdef TROUPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace troupe::bench {

int run_nccl_allreduce_bench(const std::vector<size_t>& sizes, bool json) {
#ifndef TROUPE_HAVE_CUDA
  (void)sizes;
  (void)json;
  std::fprintf(stderr, "this build has no CUDA/NCCL support\n");
  return 1;
#else
  using Clock = std::chrono::steady_clock;
  const int n = comm::cuda_device_count();
  if (n == 0) {
    std::fprintf(stderr, "no CUDA device (%s)\n", comm::cuda_summary().c_str());
    return 1;
  }
  std::string id = comm::nccl_unique_id();
  std::vector<std::vector<double> > times(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::NcclOptions o;
      o.device = r;
      auto c = comm::make_nccl_communicator(1, r, n, id, o);
      for (size_t bytes : sizes) {
        size_t count = std::max<size_t>(1, bytes / 4);
        void* buf = nullptr;
        cudaMalloc(&buf, count * 4);
        cudaMemset(buf, 0, count * 4);
        for (int i = 0; i < 5; ++i)
          c->allreduce(buf, buf, count, comm::DataType::f32, comm::ReduceOp::sum);
        c->barrier();
        int iters = bytes <= (1 << 20) ? 200 : bytes <= (64 << 20) ? 50 : 10;
        auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i)
          c->allreduce(buf, buf, count, comm::DataType::f32, comm::ReduceOp::sum);
        times[r].push_back(std::chrono::duration<double>(Clock::now() - t0).count() / iters);
        cudaFree(buf);
      }
    });
  }
  for (auto& t : threads) t.join();
  if (!json)
    std::printf("%8s %12s %12s %12s %12s\n", "gpus", "bytes", "time us", "algbw GB/s",
                "busbw GB/s");
  for (size_t i = 0; i < sizes.size(); ++i) {
    double t = times[0][i];
    size_t bytes = std::max<size_t>(1, sizes[i] / 4) * 4;
    double algbw = bytes / t / 1e9, busbw = 2.0 * (n - 1) / n * algbw;
    if (json) {
      std::printf(
          "{\"bench\":\"allreduce\",\"impl\":\"troupe_nccl\",\"workers\":%d,\"bytes\":%zu,\"time_"
          "us\":%.2f,"
          "\"algbw_gbps\":%.2f,\"busbw_gbps\":%.2f}\n",
          n, bytes, t * 1e6, algbw, busbw);
    } else {
      std::printf("%8d %12zu %12.2f %12.2f %12.2f\n", n, bytes, t * 1e6, algbw, busbw);
    }
  }
  return 0;
#endif
}

}  // namespace troupe::bench
