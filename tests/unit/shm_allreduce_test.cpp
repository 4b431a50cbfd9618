// The shared-memory allreduce's segments, without processes: two ranks in one process (each
// maps the other's memfd through /proc/self/fd) and the checks that refuse a wrong segment.
#include "comm/shm_allreduce.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

namespace troupe::comm {
namespace {

TEST(ShmAllreduce, SliceSizesAreBoundedAndAligned) {
  EXPECT_EQ(ShmAllreduce::slice_for(2, 128 << 10), size_t(128 << 10));
  EXPECT_EQ(ShmAllreduce::slice_for(2, 1), 64u);
  EXPECT_EQ(ShmAllreduce::slice_for(2, 100), 64u);
  // Huge asks (a negative option cast to size_t) shrink to fit the segment bound.
  for (int n : {2, 3, 8, 64}) {
    size_t s = ShmAllreduce::slice_for(n, size_t(-1));
    EXPECT_EQ(s % 64, 0u);
    EXPECT_LE(2 * size_t(n) * s, ShmAllreduce::kMaxSegmentBytes) << n;
  }
}

TEST(ShmAllreduce, TwoRanksInOneProcessReduce) {
  ShmAllreduce a(0, 2, 4096, 11), b(1, 2, 4096, 22);
  ASSERT_GE(a.fd(), 0) << a.why();
  std::vector<int> pids{getpid(), getpid()}, fds{a.fd(), b.fd()};
  std::vector<uint64_t> ids{11, 22};
  ASSERT_EQ(a.attach(pids, fds, ids), "");
  ASSERT_EQ(b.attach(pids, fds, ids), "");
  const size_t count = 10000;  // several chunks of 2 x 1024 floats, the last one partial
  std::vector<float> x(count), y(count), out(count);
  for (size_t i = 0; i < count; ++i) x[i] = float(i), y[i] = float(2 * i);
  auto idle = [](uint64_t) { std::this_thread::yield(); };
  auto both = [&](bool a_average, bool b_average) {
    std::string ea, eb;
    std::thread t([&] {  // rank 1 in place
      eb = b.run(reinterpret_cast<uint8_t*>(y.data()), reinterpret_cast<uint8_t*>(y.data()), count,
                 DataType::f32, b_average, idle);
    });
    ea = a.run(reinterpret_cast<uint8_t*>(x.data()), reinterpret_cast<uint8_t*>(out.data()), count,
               DataType::f32, a_average, idle);
    t.join();
    return std::make_pair(ea, eb);
  };
  auto [ea, eb] = both(false, false);
  ASSERT_EQ(ea, "");
  ASSERT_EQ(eb, "");
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(out[i], float(3 * i)) << i;
    ASSERT_EQ(y[i], float(3 * i)) << i;
    ASSERT_EQ(x[i], float(i)) << "input changed at " << i;
  }
  // One asks for the average, the other for the sum: both see it in the other's header.
  auto [fa, fb] = both(true, false);
  EXPECT_NE(fa.find("rank 1 called allreduce 1"), std::string::npos) << fa;
  EXPECT_NE(fb.find("avg"), std::string::npos) << fb;
}

TEST(ShmAllreduce, AttachRefusesASegmentThatIsNotTheRanks) {
  ShmAllreduce a(0, 2, 4096, 11), b(1, 2, 4096, 22);
  std::vector<int> pids{getpid(), getpid()};
  // Another identity (another process's fd with the same number, in another pid namespace).
  std::string why = a.attach(pids, {a.fd(), b.fd()}, {11, 23});
  EXPECT_NE(why.find("is not the one that rank made"), std::string::npos) << why;
  // A file of another size (mapping past its end would be SIGBUS later).
  std::FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ShmAllreduce c(0, 2, 4096, 11);
  why = c.attach(pids, {c.fd(), fileno(f)}, {11, 22});
  EXPECT_NE(why.find("is not"), std::string::npos) << why;
  std::fclose(f);
  // No such fd.
  ShmAllreduce d(0, 2, 4096, 11);
  why = d.attach(pids, {d.fd(), -1}, {11, 22});
  EXPECT_NE(why.find("cannot open"), std::string::npos) << why;
}

}  // namespace
}  // namespace troupe::comm
