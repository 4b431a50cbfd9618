// Collectives over the UCX backend, expected results in closed form from rank-dependent inputs.
// Sweep: world sizes {1,2,3,5,8} x element counts {0,1,7,1023,65537,3*2^20+5} x in place / out of
// place x every algorithm, with a tiny segment size to force chunking. Ranks are threads here;
// the multi-process tests (comm_process_test) run the same code between processes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <thread>

#include "comm/reduce.h"
#include "tests/harness/world.h"

namespace troupe {
namespace {

using comm::Algorithm;
using comm::DataType;
using comm::ReduceOp;

// Rank r's element i. Small integers: every partial sum is exact in f32 (and bf16/f16 below).
inline double value(int rank, size_t i) { return double(rank + 1) * double(i % 5 + 1); }
inline double expected_sum(int n, size_t i) { return double(i % 5 + 1) * n * (n + 1) / 2.0; }

const size_t kCounts[] = {0, 1, 7, 1023, 65537, 3 * (size_t(1) << 20) + 5};

comm::UcxCommOptions chunky(size_t count) {
  comm::UcxCommOptions o;
  o.timeout = std::chrono::seconds(60);
  // Tiny segments force chunking; for the largest count a moderate one keeps the test short.
  o.segment_bytes = count > 100000 ? 64 * 1024 : 256;
  o.window = 3;
  o.shm_slice_bytes = count > 100000 ? 64 * 1024 : 64;  // the smallest slice: one cache line
  return o;
}

void check_allreduce_f32(comm::UcxCommunicator& c, size_t count, Algorithm algo, bool in_place,
                         ReduceOp op) {
  const int n = c.size(), r = c.rank();
  std::vector<float> in(count), out(count, -1.0f);
  for (size_t i = 0; i < count; ++i) in[i] = float(value(r, i));
  comm::CollectiveOptions o;
  o.algorithm = algo;
  if (in_place) {
    c.allreduce(in.data(), in.data(), count, DataType::f32, op, o);
    out = in;
  } else {
    c.allreduce(in.data(), out.data(), count, DataType::f32, op, o);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(in[i], float(value(r, i))) << "input modified";
  }
  for (size_t i = 0; i < count; ++i) {
    double want = expected_sum(n, i) / (op == ReduceOp::avg ? n : 1);
    ASSERT_NEAR(out[i], want, 1e-6 * want)
        << "rank " << r << " of " << n << ", element " << i << " of " << count;
  }
}

class Sweep : public ::testing::TestWithParam<int> {};

TEST_P(Sweep, AllreduceEveryCountAlgorithmAndPlacement) {
  const int n = GetParam();
  for (size_t count : kCounts) {
    testing::run_world(n, chunky(count), [&](comm::UcxCommunicator& c) {
      // Threads of one process share the host: the shared-memory path must be there to test.
      ASSERT_EQ(c.shared_memory_allreduce(), n > 1);
      for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::shared_memory,
                          Algorithm::automatic}) {
        if (a == Algorithm::recursive_doubling && count > 100000 && n > 3)
          continue;  // slow, same code path
        for (bool in_place : {true, false})
          check_allreduce_f32(c, count, a, in_place, ReduceOp::sum);
      }
      check_allreduce_f32(c, count, Algorithm::automatic, false, ReduceOp::avg);
    });
  }
}

TEST_P(Sweep, BroadcastAllgatherReduceScatterBarrier) {
  const int n = GetParam();
  for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1023), size_t(65537)}) {
    testing::run_world(n, chunky(count), [&](comm::UcxCommunicator& c) {
      const int r = c.rank();
      for (int root = 0; root < n; ++root) {
        std::vector<double> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = r == root ? value(root, i) : -1;
        c.broadcast(buf.data(), count, DataType::f64, root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], value(root, i)) << "root " << root;
      }
      std::vector<float> mine(count), all(count * n, -1);
      for (size_t i = 0; i < count; ++i) mine[i] = float(value(r, i));
      c.allgather(mine.data(), all.data(), count, DataType::f32);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[q * count + i], float(value(q, i)));
      std::vector<float> full(count * n), part(count, -1);
      for (size_t i = 0; i < count * n; ++i) full[i] = float(value(r, i));
      c.reduce_scatter(full.data(), part.data(), count, DataType::f32, ReduceOp::sum);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(part[i], float(expected_sum(n, r * count + i)));
      c.barrier();
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Sweep, ::testing::Values(1, 2, 3, 5, 8));

TEST(Collectives, HalfPrecisionTypesAndDoubles) {
  for (Algorithm a : {Algorithm::automatic, Algorithm::shared_memory})
    testing::run_world(3, chunky(1000), [&](comm::UcxCommunicator& c) {
      const int n = c.size(), r = c.rank();
      const size_t count = 1000;
      comm::CollectiveOptions o;
      o.algorithm = a;
      std::vector<double> d(count);
      for (size_t i = 0; i < count; ++i) d[i] = value(r, i) / 3.0;
      c.allreduce(d.data(), d.data(), count, DataType::f64, ReduceOp::sum, o);
      for (size_t i = 0; i < count; ++i) ASSERT_NEAR(d[i], expected_sum(n, i) / 3.0, 1e-12);
      std::vector<_Float16> h(count);
      for (size_t i = 0; i < count; ++i) h[i] = _Float16(value(r, i));
      c.allreduce(h.data(), h.data(), count, DataType::f16, ReduceOp::sum, o);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(float(h[i]), float(expected_sum(n, i)));
      std::vector<uint16_t> b(count);
      for (size_t i = 0; i < count; ++i) {
        float f = float(value(r, i));
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        b[i] = uint16_t(bits >> 16);  // exact: small integers
      }
      c.allreduce(b.data(), b.data(), count, DataType::bf16, ReduceOp::avg, o);
      for (size_t i = 0; i < count; ++i) {
        uint32_t bits = uint32_t(b[i]) << 16;
        float f;
        std::memcpy(&f, &bits, 4);
        ASSERT_EQ(f, float(expected_sum(n, i) / n));
      }
    });
}

// 64-bit integer sums (parallel.deterministic): exact, wrapping never, with every algorithm and
// at sizes that take each path; averaging integers is refused.
TEST(Collectives, Int64SumsAreExactAndTheirAverageIsRefused) {
  for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::shared_memory})
    for (size_t count : {size_t(3), size_t(5000)})
      testing::run_world(3, chunky(count), [&](comm::UcxCommunicator& c) {
        comm::CollectiveOptions o;
        o.algorithm = a;
        std::vector<int64_t> v(count);
        const int64_t big = int64_t(1) << 60;
        for (size_t i = 0; i < count; ++i) v[i] = (c.rank() == 1 ? -big : big / 2) + int64_t(i);
        c.allreduce(v.data(), v.data(), count, DataType::i64, ReduceOp::sum, o);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], 3 * int64_t(i)) << i;
        EXPECT_THROW(c.allreduce(v.data(), v.data(), count, DataType::i64, ReduceOp::avg, o),
                     comm::Error);
      });
}

TEST(Collectives, AllRanksEndBitwiseEqualOnInexactData) {
  for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::shared_memory}) {
    std::vector<std::vector<float>> results(5);
    testing::run_world(5, chunky(5000), [&](comm::UcxCommunicator& c) {
      std::vector<float> x(5000);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = std::sin(float(i * 7 + c.rank() * 13)) * 1e-3f + 1.0f / (c.rank() + 3);
      comm::CollectiveOptions o;
      o.algorithm = a;
      c.allreduce(x.data(), x.data(), x.size(), DataType::f32, ReduceOp::sum, o);
      results[c.rank()] = x;
    });
    for (int r = 1; r < 5; ++r)
      ASSERT_EQ(0, std::memcmp(results[0].data(), results[r].data(), 5000 * 4));
  }
}

TEST(Collectives, SharedMemorySmallAndLargeCallsInTurnStayInStep) {
  // Small calls go whole through the headers, larger ones in chunks; a rank that finishes one
  // kind early must not overwrite what a slower rank still reads. Ranks run at different paces.
  testing::run_world(3, comm::UcxCommOptions{}, [&](comm::UcxCommunicator& c) {
    ASSERT_TRUE(c.shared_memory_allreduce()) << c.shared_memory_fallback_reason();
    const int n = c.size(), r = c.rank();
    comm::CollectiveOptions shm;
    shm.algorithm = Algorithm::shared_memory;
    std::vector<float> big(20000);
    for (int round = 0; round < 300; ++round) {
      if (r == round % n) std::this_thread::sleep_for(std::chrono::microseconds(50));
      double one = r + 1;
      c.allreduce(&one, &one, 1, DataType::f64, ReduceOp::avg, shm);
      ASSERT_EQ(one, (n + 1) / 2.0) << "round " << round;
      for (size_t i = 0; i < big.size(); ++i) big[i] = float(value(r, i));
      c.allreduce(big.data(), big.data(), big.size(), DataType::f32, ReduceOp::sum, shm);
      for (size_t i = 0; i < big.size(); i += 997)
        ASSERT_EQ(big[i], float(expected_sum(n, i))) << "round " << round;
    }
  });
}

TEST(Collectives, SharedMemoryRefusesCallsThatDiffer) {
  // Another count, or another element type of the same size: every rank fails with
  // invalid_input, naming what differs, instead of mixing the buffers.
  for (int variant : {0, 1}) {
    std::vector<std::string> errors(2);
    testing::run_world(2, comm::UcxCommOptions{}, [&](comm::UcxCommunicator& c) {
      ASSERT_TRUE(c.shared_memory_allreduce()) << c.shared_memory_fallback_reason();
      comm::CollectiveOptions o;
      o.algorithm = Algorithm::shared_memory;
      o.timeout = std::chrono::seconds(10);
      std::vector<double> buf(40000, 1.0);
      size_t count = variant == 0 && c.rank() == 1 ? 30000 : 40000;
      DataType t = variant == 1 && c.rank() == 1 ? DataType::f32 : DataType::f64;
      if (t == DataType::f32) count *= 2;  // the same bytes
      try {
        c.allreduce(buf.data(), buf.data(), count, t, ReduceOp::sum, o);
      } catch (const comm::Error& e) {
        errors[c.rank()] = std::string(comm::errc_name(e.code())) + ": " + e.what();
        EXPECT_EQ(e.code(), comm::Errc::invalid_input) << e.what();
      }
      // Broken for good.
      EXPECT_THROW(c.allreduce(buf.data(), buf.data(), 10, DataType::f64, ReduceOp::sum),
                   comm::Error);
    });
    for (auto& e : errors) EXPECT_NE(e, "") << "variant " << variant;
    EXPECT_NE(errors[0].find(variant == 0 ? "30000" : "f32"), std::string::npos) << errors[0];
  }
}

TEST(Collectives, SharedMemoryIsUsedOnlyWhenEveryRankAgrees) {
  // One rank asks for another slice size: nobody uses it (with the reason, the same everywhere),
  // and allreduce is still correct everywhere. (A rank with shared_memory off altogether also
  // has other UCX transports, which UCX cannot wire up with the others': not testable here.)
  testing::run_world_each(
      3,
      [&](int r) {
        comm::UcxCommOptions o;
        if (r == 2) o.shm_slice_bytes = 4096;
        return o;
      },
      [&](comm::UcxCommunicator& c) {
        EXPECT_FALSE(c.shared_memory_allreduce());
        EXPECT_NE(c.shared_memory_fallback_reason().find("rank 2"), std::string::npos)
            << c.shared_memory_fallback_reason();
        for (Algorithm a : {Algorithm::automatic, Algorithm::shared_memory})
          check_allreduce_f32(c, 100000, a, true, ReduceOp::sum);
      });
}

TEST(Collectives, PointToPointInOrder) {
  testing::run_world(2, {}, [&](comm::UcxCommunicator& c) {
    std::vector<int> buf(1000);
    for (int round = 0; round < 20; ++round) {
      if (c.rank() == 0) {
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = round * 1000 + int(i);
        c.send(buf.data(), buf.size() * 4, 1, 7);
      } else {
        c.recv(buf.data(), buf.size() * 4, 0, 7);
        for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], round * 1000 + int(i));
      }
    }
  });
}

// Members that pass one operation different sizes over UCX (a program's own loop whose members
// disagree on a count): every rank fails at once with invalid_input, one naming the sizes, not
// with timed_out on messages that never match (UCX warned of unmatched tags, and the job retried
// each generation until its failure timeout).
TEST(Collectives, CallsOfDifferentSizesOverUcxFailNamingThem) {
  for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling}) {
    std::vector<std::string> errors(2);
    const auto t0 = std::chrono::steady_clock::now();
    testing::run_world(2, comm::UcxCommOptions{}, [&](comm::UcxCommunicator& c) {
      comm::CollectiveOptions o;
      o.algorithm = a;
      o.timeout = std::chrono::seconds(20);
      std::vector<float> buf(20000, 1.0f);
      const size_t count = c.rank() == 1 ? 109 : 9;
      try {
        c.allreduce(buf.data(), buf.data(), count, DataType::f32, ReduceOp::sum, o);
      } catch (const comm::Error& e) {
        errors[size_t(c.rank())] = e.what();
        EXPECT_EQ(e.code(), comm::Errc::invalid_input) << e.what();
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    EXPECT_NE(errors[0] + errors[1], "");
    EXPECT_NE((errors[0] + errors[1]).find(" bytes where this member (rank "), std::string::npos)
        << errors[0] << " | " << errors[1];
  }
  // Point to point, the receive posted before the message comes or after (UCX completes it at
  // once, without a request to wait on: it was taken, half its buffer stale).
  for (auto late : {std::chrono::milliseconds(0), std::chrono::milliseconds(300)}) {
    std::string said;
    testing::run_world(2, comm::UcxCommOptions{}, [&](comm::UcxCommunicator& c) {
      std::vector<int> buf(1000);
      try {
        if (c.rank() == 0) c.send(buf.data(), 400, 1, 7);
        std::this_thread::sleep_for(late);
        if (c.rank() == 1) c.recv(buf.data(), 4000, 0, 7);
      } catch (const comm::Error& e) {
        if (c.rank() == 1) said = e.what();
      }
    });
    EXPECT_NE(said.find("a member sent 400 bytes where this member (rank 1) expected 4000"),
              std::string::npos)
        << late.count() << " ms late: " << said;
  }
}

// The same with the automatic choice of path on one host: sizes that send one member through
// shared memory and the other over UCX (recursive doubling), where neither sees the other's
// call. Each fails with invalid_input within a moment, one naming both sizes: they waited for
// their deadline (timed_out, and a job re-formed each generation until its reform limit).
TEST(Collectives, CallsOfDifferentSizesOnDifferentPathsFailNamingThem) {
  for (auto [mine, theirs] : {std::pair{size_t(50), size_t(100)}, {size_t(4000), size_t(2000)}}) {
    std::vector<std::string> errors(2);
    const auto t0 = std::chrono::steady_clock::now();
    testing::run_world(2, comm::UcxCommOptions{}, [&](comm::UcxCommunicator& c) {
      ASSERT_TRUE(c.shared_memory_allreduce()) << c.shared_memory_fallback_reason();
      comm::CollectiveOptions o;
      o.timeout = std::chrono::seconds(20);
      std::vector<float> buf(4000, 1.0f);
      c.allreduce(buf.data(), buf.data(), 7, DataType::f32, ReduceOp::sum, o);  // (in step)
      try {
        c.allreduce(buf.data(), buf.data(), c.rank() == 0 ? mine : theirs, DataType::f32,
                    ReduceOp::sum, o);
      } catch (const comm::Error& e) {
        errors[size_t(c.rank())] = e.what();
        EXPECT_EQ(e.code(), comm::Errc::invalid_input) << e.what();
      }
    });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
    const std::string both = errors[0] + " | " + errors[1];
    EXPECT_NE(errors[0], "") << both;
    EXPECT_NE(errors[1], "") << both;
    const std::string a = std::to_string(mine * 4), b = std::to_string(theirs * 4);
    EXPECT_TRUE(both.find("allreduce with " + a + " bytes, this rank with " + b + " bytes") !=
                    std::string::npos ||
                both.find("allreduce with " + b + " bytes, this rank with " + a + " bytes") !=
                    std::string::npos)
        << both;
  }
}

TEST(Collectives, SendrecvNeighboursExchangeLargeMessagesWithoutDeadlock) {
  // Every rank sends 4 MiB (rendezvous, not eager) to the next and receives from the previous at
  // the same time, as pipeline stages exchange activations and gradients; then one-sided halves.
  testing::run_world(3, {}, [&](comm::UcxCommunicator& c) {
    const int n = c.size(), r = c.rank();
    const size_t count = size_t(1) << 20;
    std::vector<float> out(count), in(count, -1);
    for (int round = 0; round < 3; ++round) {
      for (size_t i = 0; i < count; ++i) out[i] = float(r * 10 + round) + float(i % 7);
      const int to = (r + 1) % n, from = (r + n - 1) % n;
      c.sendrecv(out.data(), count * 4, to, in.data(), count * 4, from, 5);
      for (size_t i = 0; i < count; i += 4099)
        ASSERT_EQ(in[i], float(from * 10 + round) + float(i % 7)) << "round " << round;
    }
    float one = float(r);
    if (r == 0) c.sendrecv(&one, 4, 1, nullptr, 0, -1, 6);
    if (r == 1) {
      c.sendrecv(nullptr, 0, -1, &one, 4, 0, 6);
      ASSERT_EQ(one, 0.0f);
    }
  });
}

TEST(Collectives, SendManyMovesABatchOfBuffersInOrder) {
  // Buffers of different sizes (one eager, two rendezvous) in one batch, twice.
  testing::run_world(2, {}, [&](comm::UcxCommunicator& c) {
    std::vector<std::vector<float>> bufs{std::vector<float>(3), std::vector<float>(1 << 20),
                                         std::vector<float>(300000)};
    for (int round = 0; round < 2; ++round) {
      std::vector<comm::Span> spans;
      for (size_t k = 0; k < bufs.size(); ++k) {
        if (c.rank() == 0)
          for (size_t i = 0; i < bufs[k].size(); ++i)
            bufs[k][i] = float(round * 100 + k * 10) + float(i % 3);
        spans.push_back({bufs[k].data(), bufs[k].size() * sizeof(float)});
      }
      if (c.rank() == 0) {
        c.send_many(spans, 1, 9);
      } else {
        c.recv_many(spans, 0, 9);
        for (size_t k = 0; k < bufs.size(); ++k)
          for (size_t i = 0; i < bufs[k].size(); i += 997)
            ASSERT_EQ(bufs[k][i], float(round * 100 + k * 10) + float(i % 3)) << k << " " << i;
      }
    }
  });
}

// Two ranks as threads of this process, connected; the caller drives them (failure timeout 30 s).
std::vector<std::unique_ptr<comm::UcxCommunicator>> connected_pair() {
  comm::UcxCommOptions o;
  o.timeout = std::chrono::seconds(30);
  std::vector<std::unique_ptr<comm::UcxCommunicator>> c;
  c.push_back(std::make_unique<comm::UcxCommunicator>(1, o));
  c.push_back(std::make_unique<comm::UcxCommunicator>(1, o));
  std::vector<std::string> addrs{c[0]->address(), c[1]->address()};
  std::thread tb([&] { c[1]->connect(1, addrs, std::chrono::seconds(10)); });
  c[0]->connect(0, addrs, std::chrono::seconds(10));
  tb.join();
  return c;
}

TEST(Collectives, AbortFromAnotherThreadFailsPendingAndLaterCalls) {
  auto pair = connected_pair();
  comm::UcxCommunicator& a = *pair[0];
  // Rank 0 waits for a message rank 1 never sends; another thread aborts it.
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.abort();
  });
  int x = 0;
  auto t0 = std::chrono::steady_clock::now();
  try {
    a.recv(&x, 4, 1, 3);
    FAIL() << "recv returned";
  } catch (const comm::Error& e) {
    EXPECT_EQ(e.code(), comm::Errc::aborted) << e.what();
  }
  killer.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));  // < 30 s timeout
  EXPECT_THROW(a.barrier(), comm::Error);
}

TEST(Collectives, AbortDuringASharedMemoryAllreduceFailsEveryRankFast) {
  // Rank 0 waits in a shared-memory allreduce for rank 1, which comes late; another thread
  // aborts rank 0. Rank 0 fails with aborted; rank 1, arriving after that, hears why from rank
  // 0's notice and fails with the same code, long before the 30 s failure timeout.
  auto pair = connected_pair();
  comm::UcxCommunicator &a = *pair[0], &b = *pair[1];
  ASSERT_TRUE(a.shared_memory_allreduce()) << a.shared_memory_fallback_reason();
  std::vector<float> xa(1 << 20, 1.0f), xb(1 << 20, 2.0f);
  comm::CollectiveOptions shm;
  shm.algorithm = Algorithm::shared_memory;
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    a.abort();
  });
  auto t0 = std::chrono::steady_clock::now();
  try {
    a.allreduce(xa.data(), xa.data(), xa.size(), DataType::f32, ReduceOp::sum, shm);
    FAIL() << "rank 0's allreduce returned";
  } catch (const comm::Error& e) {
    EXPECT_EQ(e.code(), comm::Errc::aborted) << e.what();
  }
  killer.join();
  try {
    b.allreduce(xb.data(), xb.data(), xb.size(), DataType::f32, ReduceOp::sum, shm);
    FAIL() << "rank 1's allreduce returned";
  } catch (const comm::Error& e) {
    EXPECT_EQ(e.code(), comm::Errc::aborted) << e.what();
    EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));  // < 30 s timeout
  for (size_t i = 0; i < xa.size(); i += 4099) ASSERT_EQ(xa[i], 1.0f) << "rank 0's buffer changed";
}

TEST(Collectives, BadArgumentsAreRefused) {
  comm::UcxCommunicator a(1, {});
  EXPECT_THROW(a.connect(3, {a.address()}, std::chrono::seconds(1)), comm::Error);
  EXPECT_THROW(a.connect(0, {"zz"}, std::chrono::seconds(1)), comm::Error);
  EXPECT_THROW(a.connect(0, {"1@host@zz"}, std::chrono::seconds(1)), comm::Error);
}

// Groups: split(color, key) as MPI's. Every rank's group sums only its members' values, with
// every algorithm, while the parent and a second split of the same ranks keep working in
// between (their tags never mix); ranks are ordered by key.
TEST(Groups, SplitByColorSumsWithinEachGroupAndKeepsTheParentUsable) {
  for (int n : {2, 3, 5, 8}) {
    SCOPED_TRACE("world " + std::to_string(n));
    testing::run_world(n, chunky(1023), [&](comm::UcxCommunicator& c) {
      const int r = c.rank();
      auto g = c.split(r % 2, -r);  // two groups, ranked in reverse
      ASSERT_NE(g, nullptr);
      int members = 0, sum_ranks = 0;
      for (int k = r % 2; k < n; k += 2) {
        ++members;
        sum_ranks += k + 1;
      }
      ASSERT_EQ(g->size(), members);
      // Rank in the group: reverse order of world ranks with this color.
      int higher = 0;
      for (int k = r % 2; k < n; k += 2) higher += k > r;
      EXPECT_EQ(g->rank(), higher);
      for (Algorithm a : {Algorithm::ring, Algorithm::recursive_doubling, Algorithm::automatic}) {
        std::vector<float> v(1023, float(r + 1));
        comm::CollectiveOptions o;
        o.algorithm = a;
        g->allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum, o);
        for (float x : v) ASSERT_EQ(x, float(sum_ranks));
        // The parent in between: everyone.
        double one = 1;
        c.allreduce(&one, &one, 1, DataType::f64, ReduceOp::sum);
        ASSERT_EQ(one, double(n));
      }
      // Broadcast from the group's rank 0 (the highest world rank of the color), point to point
      // within the group, and a second split on the same links.
      int root = r;
      g->broadcast(&root, 1, DataType::f32, 0);  // (4 bytes, copied whole)
      EXPECT_EQ(root, (n - 1) - ((n - 1) % 2 != r % 2 ? 1 : 0)) << "the highest of the color";
      if (g->size() > 1) {
        int token = g->rank() == 0 ? 42 : 0;
        if (g->rank() == 0) g->send(&token, 4, 1, 9);
        if (g->rank() == 1) {
          g->recv(&token, 4, 0, 9);
          EXPECT_EQ(token, 42);
        }
      }
      auto all = c.split(0, r);
      ASSERT_EQ(all->size(), n);
      EXPECT_EQ(all->rank(), r);
      double x = r;
      all->allreduce(&x, &x, 1, DataType::f64, ReduceOp::sum);
      EXPECT_EQ(x, n * (n - 1) / 2.0);
      g->barrier();
    });
  }
}

TEST(Groups, ANegativeColorJoinsNoGroupAndGroupOfRanksKeepsTheirOrder) {
  testing::run_world(4, {}, [&](comm::UcxCommunicator& c) {
    auto none = c.split(c.rank() == 3 ? -1 : 0, 0);
    EXPECT_EQ(none == nullptr, c.rank() == 3);
    auto g = c.group({2, 0});
    if (c.rank() == 1 || c.rank() == 3) {
      EXPECT_EQ(g, nullptr);
      return;
    }
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->rank(), c.rank() == 2 ? 0 : 1);
    float v = float(c.rank());
    g->allreduce(&v, &v, 1, DataType::f32, ReduceOp::sum);
    EXPECT_EQ(v, 2.0f);
  });
}

TEST(Groups, AbortingAGroupBreaksItsParent) {
  testing::run_world(2, {}, [&](comm::UcxCommunicator& c) {
    auto g = c.split(0, 0);
    g->barrier();
    if (c.rank() == 0) g->abort();
    try {
      c.barrier();
      if (c.rank() == 0) ADD_FAILURE() << "the parent was not aborted with its group";
    } catch (const comm::Error& e) {
      // rank 0: aborted; rank 1: hears rank 0's notice.
      EXPECT_TRUE(e.code() == comm::Errc::aborted) << e.what();
    }
  });
}

TEST(Tags, AValueThatDoesNotFitIsRefusedNeverMasked) {
  EXPECT_EQ(comm::Tag(comm::Tag::kMax).value(), comm::Tag::kMax);
  try {
    comm::Tag t(0x57a7e);  // the state tag of old, which an 18-bit field would have masked
    ADD_FAILURE() << "made tag " << t.value();
  } catch (const comm::Error& e) {
    EXPECT_EQ(e.code(), comm::Errc::invalid_input);
    EXPECT_NE(std::string(e.what()).find("does not fit in 16 bits"), std::string::npos);
  }
}

}  // namespace
}  // namespace troupe
