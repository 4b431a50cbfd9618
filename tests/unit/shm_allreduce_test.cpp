// The shared-memory allreduce's segments, without processes: ranks in one process (each maps the
// others' memfds through /proc/self/fd), the checks that refuse a wrong segment, and registered
// buffers (comm/shared_arena.h): their allocator, the in-place path's bits, its choice, and a
// rank that gives a call up while the others read its buffer.
#include "comm/shm_allreduce.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "comm/reduce.h"

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

// The one-pass reduction the shared-memory paths use gives the bits of the stepwise one
// (reduce_sum_into, reduce_sum, scale_down) for every store kind, at any alignment and length.
TEST(ReduceSumParts, EveryStoreKindGivesTheStepwiseBits) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-3, 3);
  const Store kinds[] = {Store::ordinary, Store::streamed},
              copy_kinds[] = {Store::ordinary, Store::streamed, Store::copied_after};
  for (int nparts : {1, 2, 3, 5})
    for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(9), size_t(1003)})
      for (size_t shift : {size_t(0), size_t(3)})
        for (int divisor : {1, 3}) {
          std::vector<std::vector<float>> in(size_t(nparts), std::vector<float>(count + 8));
          for (auto& v : in)
            for (float& f : v) f = value(rng);
          std::vector<float> want(in[0].begin() + long(shift), in[0].begin() + long(shift + count));
          for (int q = 1; q < nparts; ++q)
            reduce_sum(want.data(), in[size_t(q)].data() + shift, count, DataType::f32);
          if (divisor != 1) scale_down(want.data(), count, DataType::f32, divisor);
          const void* parts[8];
          for (int q = 0; q < nparts; ++q) parts[q] = in[size_t(q)].data() + shift;
          for (Store ko : kinds)
            for (Store kc : copy_kinds) {
              std::vector<float> out(count + 8, -1), copy(count + 8, -1);
              // The copy one float further than the output: streamed stores at two alignments.
              reduce_sum_parts(out.data() + shift, ko, copy.data() + shift + 1, kc, parts, nparts,
                               nparts - 1, count, DataType::f32, divisor);
              const std::string what = std::to_string(nparts) + " parts, " + std::to_string(count) +
                                       " floats, shift " + std::to_string(shift);
              const std::vector<float> got(out.begin() + long(shift),
                                           out.begin() + long(shift + count)),
                  copied(copy.begin() + long(shift + 1), copy.begin() + long(shift + 1 + count));
              // (bitwise: as bytes, so that a NaN would differ too)
              auto bits = [](const std::vector<float>& v) {
                return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
              };
              EXPECT_EQ(bits(got), bits(want)) << what;
              EXPECT_EQ(bits(copied), bits(want)) << what;
              EXPECT_EQ(out[shift + count], -1) << what;  // nothing past the end
              EXPECT_EQ(copy[shift + 1 + count], -1) << what;
            }
        }
  // Other types go stepwise, the copy after: the same bits.
  std::vector<double> x{1.5, -2.25, 3e-17}, y{2.5, 4.0, 1.0}, got(3), copy(3), want(3);
  const void* parts[2] = {x.data(), y.data()};
  reduce_sum_parts(got.data(), Store::streamed, copy.data(), Store::streamed, parts, 2, -1, 3,
                   DataType::f64, 2);
  reduce_sum_into(want.data(), x.data(), y.data(), 3, DataType::f64);
  scale_down(want.data(), 3, DataType::f64, 2);
  EXPECT_EQ(got, want);
  EXPECT_EQ(copy, want);
  // In place into the last of three parts (a rank's own, reduced in rank order), longer than
  // the stepwise path's buffer: the parts in order, not the output first.
  std::vector<double> a(5000), b(5000), c(5000), sum(5000);
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = 1e16 * double(i % 3), b[i] = -1e16 * double(i % 3), c[i] = 1.0 + double(i);
  const void* three[3] = {a.data(), b.data(), c.data()};
  for (size_t i = 0; i < a.size(); ++i) sum[i] = (a[i] + b[i]) + c[i];
  reduce_sum_parts(c.data(), Store::ordinary, nullptr, Store::ordinary, three, 3, 2, c.size(),
                   DataType::f64, 1);
  EXPECT_EQ(c, sum);
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

TEST(SharedArena, AllocatesFirstFitReleasesCoalescedAndZeroesReusedAndDiscardedBuffers) {
  std::string why;
  auto arena = SharedArena::create(4 * SharedArena::kAlign, &why);
  ASSERT_TRUE(arena) << why;
  auto* a = static_cast<uint8_t*>(arena->allocate(100));
  auto* b = static_cast<uint8_t*>(arena->allocate(SharedArena::kAlign + 1));  // two pages
  auto* c = static_cast<uint8_t*>(arena->allocate(1));
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % SharedArena::kAlign, 0u);
  EXPECT_EQ(b, a + SharedArena::kAlign);
  EXPECT_EQ(c, b + 2 * SharedArena::kAlign);
  EXPECT_EQ(arena->allocate(1), nullptr);  // full
  // Offsets: inside one buffer only.
  EXPECT_EQ(arena->offset_of(a, 100), int64_t(SharedArena::kAlign));
  EXPECT_EQ(arena->offset_of(a + 10, SharedArena::kAlign - 10), int64_t(SharedArena::kAlign) + 10);
  EXPECT_EQ(arena->offset_of(a, SharedArena::kAlign + 1), -1);  // runs into b
  int local = 0;
  EXPECT_EQ(arena->offset_of(&local, 4), -1);
  // Released neighbours coalesce: a and b's three pages take one buffer again, zeroed.
  std::memset(a, 7, 100);
  std::memset(b, 7, 2 * SharedArena::kAlign);
  arena->release(b);
  EXPECT_EQ(arena->offset_of(b, 1), -1);  // no longer a buffer
  arena->release(a);
  auto* d = static_cast<uint8_t*>(arena->allocate(3 * SharedArena::kAlign));
  ASSERT_EQ(d, a);
  for (size_t i = 0; i < 3 * SharedArena::kAlign; ++i) ASSERT_EQ(d[i], 0) << i;
  // A discarded buffer stays allocated and reads zeros.
  std::memset(d, 9, 3 * SharedArena::kAlign);
  arena->discard(d);
  EXPECT_EQ(arena->offset_of(d, 1), int64_t(SharedArena::kAlign));
  for (size_t i = 0; i < 3 * SharedArena::kAlign; ++i) ASSERT_EQ(d[i], 0) << i;
  EXPECT_EQ(SharedArena::identity_at(d - SharedArena::kAlign, arena->mapped_bytes()),
            arena->identity());
  EXPECT_EQ(SharedArena::identity_at(d - SharedArena::kAlign, 12345), 0u);
}

// n ranks in one process, each with its own segment and arena.
struct Ranks {
  std::vector<std::unique_ptr<ShmAllreduce>> shm;
  std::vector<std::shared_ptr<SharedArena>> arenas;
  explicit Ranks(int n, size_t arena_bytes) {
    std::vector<int> pids(size_t(n), getpid()), fds;
    std::vector<uint64_t> ids;
    std::vector<ShmAllreduce::ArenaRef> refs;
    for (int r = 0; r < n; ++r) {
      shm.push_back(std::make_unique<ShmAllreduce>(r, n, 64 << 10, uint64_t(100 + r)));
      std::string why;
      arenas.push_back(SharedArena::create(arena_bytes, &why));
      EXPECT_TRUE(arenas.back()) << why;
      fds.push_back(shm.back()->fd());
      ids.push_back(uint64_t(100 + r));
      refs.push_back(
          {arenas.back()->fd(), arenas.back()->mapped_bytes(), arenas.back()->identity()});
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(shm[size_t(r)]->attach(pids, fds, ids), "");
      EXPECT_EQ(shm[size_t(r)]->attach_arenas(arenas[size_t(r)], pids, refs), "");
    }
  }
  // Every rank's in-place call on bufs[r] at once; what each returned (or threw).
  std::vector<std::string> run(std::vector<float*> bufs, size_t count, bool average) {
    std::vector<std::string> out(bufs.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < bufs.size(); ++r)
      threads.emplace_back([&, r] {
        auto* p = reinterpret_cast<uint8_t*>(bufs[r]);
        out[r] = shm[r]->run(p, p, count, DataType::f32, average,
                             [](uint64_t) { std::this_thread::yield(); });
      });
    for (auto& t : threads) t.join();
    return out;
  }
};

// The registered path gives every rank the bits the staged one gives (the same additions in the
// same order), sum and average, at 2 and 3 ranks and a count no slice divides.
TEST(ShmAllreduce, RegisteredBuffersGiveTheStagedPathsBits) {
  for (int n : {2, 3}) {
    // Above the registered size, in chunks of n slices (two and a half of them; Ranks' staged
    // slices are 64 KiB).
    const size_t slice = peer_lines().registered_slice_bytes ? peer_lines().registered_slice_bytes
                                                             : size_t(64) << 10;
    const size_t count =
        std::max(ShmAllreduce::registered_min_bytes() / 4 * 3, slice / 4 * size_t(n) * 5 / 2) + 13;
    Ranks ranks(n, count * 4);
    EXPECT_EQ(ranks.shm[0]->registered_slice(), slice);
    std::mt19937 gen{uint32_t(n)};
    std::normal_distribution<float> dist(0.f, 1.f);
    for (bool average : {false, true}) {
      std::vector<std::vector<float>> input{size_t(n), std::vector<float>(count)};
      for (auto& v : input)
        for (float& x : v) x = dist(gen) * 1e3f;
      std::vector<std::vector<float>> staged = input;
      std::vector<float*> plain, registered;
      for (int r = 0; r < n; ++r) {
        plain.push_back(staged[size_t(r)].data());
        auto* p = static_cast<float*>(ranks.arenas[size_t(r)]->allocate(count * 4));
        ASSERT_TRUE(p);
        std::memcpy(p, input[size_t(r)].data(), count * 4);
        registered.push_back(p);
      }
      for (const auto& e : ranks.run(plain, count, average)) ASSERT_EQ(e, "");
      for (const auto& e : ranks.run(registered, count, average)) ASSERT_EQ(e, "");
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(ranks.shm[size_t(r)]->registered_calls(), average ? 2u : 1u);
        ASSERT_EQ(std::memcmp(registered[size_t(r)], staged[0].data(), count * 4), 0)
            << "rank " << r << " of " << n << (average ? " avg" : " sum");
        ranks.arenas[size_t(r)]->release(registered[size_t(r)]);
      }
    }
  }
}

// One rank's buffer outside its arena (or a call below registered_min_bytes()): everyone stages.
TEST(ShmAllreduce, OneUnregisteredBufferStagesEveryRank) {
  const size_t count = ShmAllreduce::registered_min_bytes() / 4 + 1;
  Ranks ranks(2, count * 4);
  auto* a = static_cast<float*>(ranks.arenas[0]->allocate(count * 4));
  std::vector<float> b(count);
  for (size_t i = 0; i < count; ++i) a[i] = float(i % 100), b[i] = 1.f;
  for (const auto& e : ranks.run({a, b.data()}, count, false)) ASSERT_EQ(e, "");
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(a[i], float(i % 100) + 1.f) << i;
    ASSERT_EQ(b[i], float(i % 100) + 1.f) << i;
  }
  auto* c = static_cast<float*>(ranks.arenas[1]->allocate(count * 4));
  for (const auto& e : ranks.run({a, c}, 1000, false)) ASSERT_EQ(e, "");  // too small
  EXPECT_EQ(ranks.shm[0]->registered_calls(), 0u);
  EXPECT_EQ(ranks.shm[1]->registered_calls(), 0u);
}

// Rank 1 gives a registered call up (its wait throws) after rank 0 has started reading its
// buffer: rank 0 does not return what it read as a success.
TEST(ShmAllreduce, ARankThatGivesARegisteredCallUpFailsTheOthersCall) {
  const size_t count = ShmAllreduce::registered_min_bytes() / 4;
  Ranks ranks(2, count * 4);
  auto* a = static_cast<float*>(ranks.arenas[0]->allocate(count * 4));
  auto* b = static_cast<float*>(ranks.arenas[1]->allocate(count * 4));
  std::atomic<bool> zero_waits{false}, one_gave_up{false};
  std::string zero_error, one_error;
  // Rank 0 waits (for rank 1's announcement) until rank 1 has given up.
  std::thread zero([&] {
    try {
      auto* p = reinterpret_cast<uint8_t*>(a);
      ranks.shm[0]->run(p, p, count, DataType::f32, false, [&](uint64_t) {
        zero_waits = true;
        while (!one_gave_up) std::this_thread::yield();
      });
    } catch (const ShmAllreduce::Abandoned& e) {
      zero_error = e.what();
    }
  });
  while (!zero_waits) std::this_thread::yield();
  // Rank 1 reduces its slice, then waits for rank 0's: and gives up there.
  try {
    auto* p = reinterpret_cast<uint8_t*>(b);
    ranks.shm[1]->run(p, p, count, DataType::f32, false,
                      [](uint64_t) { throw std::runtime_error("rank 1 aborted"); });
  } catch (const std::runtime_error& e) {
    one_error = e.what();
  }
  one_gave_up = true;
  zero.join();
  EXPECT_EQ(one_error, "rank 1 aborted");
  EXPECT_NE(zero_error.find("peer_lost reported by rank 1, which gave allreduce 0 up"),
            std::string::npos)
      << zero_error;
}

}  // namespace
}  // namespace troupe::comm
