// The NCCL backend on a real GPU (ctest label gpu). Without a CUDA device every test skips and
// says why. World size 1: init, allreduce, abort, re-init at the next generation; with two or
// more devices, a two-rank allreduce across devices (ranks as threads).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "comm/cuda_info.h"
#include "comm/nccl_communicator.h"

namespace troupe::comm {
namespace {

#ifdef TROUPE_CUDA_EMULATION  // (the emulated device has no NCCL: tests/emulation)
#define SKIP_WITHOUT_GPU(n) GTEST_SKIP() << "NCCL: on a GPU only (the emulated device has none)"
#else
#define SKIP_WITHOUT_GPU(n)                                                                      \
  if (cuda_device_count() < (n))                                                                 \
  GTEST_SKIP() << "needs " << (n) << " CUDA device(s); this machine has " << cuda_device_count() \
               << " (" << cuda_summary() << ")"
#endif

// Out of place, into a buffer filled with NaN first: an allreduce that writes nothing leaves
// NaN (at world size 1 the sum of the input is the input, so in place it could not fail).
std::vector<float> run_allreduce(Communicator& c, const std::vector<float>& host, ReduceOp op) {
  const size_t bytes = host.size() * sizeof(float);
  float *in = nullptr, *out = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&in), bytes), cudaSuccess);
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&out), bytes), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemset(out, 0xff, bytes), cudaSuccess);  // all ones: a NaN
  c.allreduce(in, out, host.size(), DataType::f32, op);
  std::vector<float> result(host.size());
  EXPECT_EQ(cudaMemcpy(result.data(), out, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaFree(in), cudaSuccess);
  EXPECT_EQ(cudaFree(out), cudaSuccess);
  return result;
}

TEST(Nccl, UniqueIdWorksWithoutAGpu) {
#ifdef TROUPE_CUDA_EMULATION
  GTEST_SKIP() << "NCCL: the real library only (the emulated device has none)";
#endif
  if (!built_with_cuda()) GTEST_SKIP() << "built without CUDA";
  auto a = nccl_unique_id(), b = nccl_unique_id();
  EXPECT_EQ(a.size(), 256u);
  EXPECT_NE(a, b);
}

TEST(Nccl, InitAllreduceAbortReinit) {
  SKIP_WITHOUT_GPU(1);
  auto c = make_nccl_communicator(1, 0, 1, nccl_unique_id());
  std::vector<float> x(1 << 20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i % 13);
  auto y = run_allreduce(*c, x, ReduceOp::sum);
  EXPECT_EQ(y, x);  // one rank: the sum is the input
  c->abort();
  EXPECT_THROW(c->barrier(), Error);
  c.reset();
  // The next generation: a fresh communicator works.
  auto d = make_nccl_communicator(2, 0, 1, nccl_unique_id());
  auto z = run_allreduce(*d, x, ReduceOp::avg);
  EXPECT_EQ(z, x);
}

TEST(Nccl, InitWithAMissingMemberTimesOut) {
  SKIP_WITHOUT_GPU(1);
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(3000);
  auto t0 = std::chrono::steady_clock::now();
  try {
    auto c = make_nccl_communicator(1, 0, 2, nccl_unique_id(), o);  // rank 1 never comes
    FAIL() << "init with a missing member succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::timed_out) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

// The generation is being ended (a member is gone; NCCL may never notice): a wait on the missing
// member fails with peer_lost soon after abandon_after, not at the timeout.
TEST(Nccl, AnAbandonedGenerationEndsTheWaitBeforeItsTimeout) {
  SKIP_WITHOUT_GPU(1);
  NcclOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  std::atomic<bool> over{false};
  o.abandoned = [&] { return over.load(); };
  std::thread ender([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    over = true;
  });
  auto t0 = std::chrono::steady_clock::now();
  try {
    auto c = make_nccl_communicator(1, 0, 2, nccl_unique_id(), o);  // rank 1 never comes
    FAIL() << "init with a missing member succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::peer_lost) << e.what();
  }
  ender.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // A generation abandoned does not touch an operation that completes. (Abandoned only once the
  // communicator exists: an init still running abandon_after past its start would end.)
  std::atomic<bool> ended{false};
  o.abandoned = [&] { return ended.load(); };
  auto c = make_nccl_communicator(2, 0, 1, nccl_unique_id(), o);
  ended = true;
  std::vector<float> x(4096, 2.0f);
  EXPECT_EQ(run_allreduce(*c, x, ReduceOp::sum), x);
}

TEST(Nccl, TwoDevicesAllreduce) {
  SKIP_WITHOUT_GPU(2);
  std::string id = nccl_unique_id();
  std::vector<std::vector<float>> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      NcclOptions o;
      o.device = r;
      auto c = make_nccl_communicator(1, r, 2, id, o);
      std::vector<float> x(4096, float(r + 1));
      results[r] = run_allreduce(*c, x, ReduceOp::sum);
    });
  }
  for (auto& t : threads) t.join();
  for (auto& res : results)
    for (float v : res) ASSERT_EQ(v, 3.0f);
}

}  // namespace
}  // namespace troupe::comm
