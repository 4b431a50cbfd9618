// The UCX backend between real processes: correctness, and failures that fail fast. SIGKILL one
// of 4 ranks in the middle of a 64 MiB allreduce: every survivor's call returns peer_lost within
// the failure timeout. SIGSTOP one: timed_out. Then the survivors build a new communicator of 3
// (the next generation) and an allreduce on it is correct.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/time.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include "comm/host_identity.h"
#include "comm/shm_allreduce.h"
#include "coordinator/process.h"
#include "tests/harness/harness.h"

namespace troupe {
namespace {

using namespace std::chrono_literals;

uint64_t unix_ms() {
  timeval tv;
  gettimeofday(&tv, nullptr);
  return uint64_t(tv.tv_sec) * 1000 + tv.tv_usec / 1000;
}

struct Ranks {
  testing::TempDir dir;
  std::vector<std::unique_ptr<coordinator::ChildProcess>> procs;

  Ranks(int world, std::vector<std::string> extra) {
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> argv{
          testing::troupe_binary(), "bench",   "allreduce-worker",   "--dir", dir.path(), "--rank",
          std::to_string(r),        "--world", std::to_string(world)};
      argv.insert(argv.end(), extra.begin(), extra.end());
      procs.push_back(
          std::make_unique<coordinator::ChildProcess>(coordinator::ChildProcess::Options{
              argv, "", dir.path() + "/rank" + std::to_string(r) + ".log", {}}));
    }
  }
};

TEST(CommProcesses, AllreduceIsCorrectBetweenProcesses) {
  for (int world : {2, 3}) {
    Ranks ranks(world, {"--mode", "check"});
    for (int r = 0; r < world; ++r) {
      auto line = ranks.procs[r]->wait_for_line("check", 120s);
      ASSERT_TRUE(line) << "rank " << r << " of " << world << " gave no result";
      EXPECT_EQ(line->rfind("check ok", 0), 0u) << *line;
      // Processes on one host: the shared-memory allreduce was set up (and checked above).
      EXPECT_NE(line->find("shared-memory 1"), std::string::npos) << *line;
      auto status = ranks.procs[r]->wait(30s);
      ASSERT_TRUE(status);
      EXPECT_EQ(WEXITSTATUS(*status), 0);
    }
  }
}

// In-place calls on buffers in each rank's shared arena (comm/shared_arena.h): the large one read
// in place by the others (the registered path), the smaller ones staged, all correct.
TEST(CommProcesses, AllreduceOfRegisteredBuffersIsCorrectBetweenProcesses) {
  // The check's in-place shared-memory calls of 65537 and 3M + 5 floats: those of at least the
  // registered size (comm::peer_lines: by CPU vendor) are read in place.
  int in_place = 0;
  for (size_t count : {size_t(65537), 3 * (size_t(1) << 20) + 5})
    in_place += count * 4 >= comm::ShmAllreduce::registered_min_bytes();
  ASSERT_GE(in_place, 1);
  const std::string registered = "registered " + std::to_string(in_place) + " ";
  for (int world : {2, 3}) {
    Ranks ranks(world, {"--mode", "check", "--buffers", "registered"});
    for (int r = 0; r < world; ++r) {
      auto line = ranks.procs[r]->wait_for_line("check", 120s);
      ASSERT_TRUE(line) << "rank " << r << " of " << world << " gave no result";
      EXPECT_EQ(line->rfind("check ok", 0), 0u) << *line;
      EXPECT_NE(line->find(registered), std::string::npos) << *line;
      auto status = ranks.procs[r]->wait(30s);
      ASSERT_TRUE(status);
      EXPECT_EQ(WEXITSTATUS(*status), 0);
    }
  }
}

void failure_scenario(int sig, const char* expected_code, std::chrono::milliseconds timeout,
                      const char* algorithm, const char* op = "allreduce", size_t count = 16 << 20,
                      const char* buffers = "user") {
  const int world = 4, victim = 3;
  Ranks ranks(world, {"--mode", "loop", "--count", std::to_string(count), "--timeout-ms",
                      std::to_string(timeout.count()), "--algorithm", algorithm, "--op", op,
                      "--buffers", buffers});
  for (int r = 0; r < world; ++r) {
    auto line = ranks.procs[r]->wait_for_line("iter 2", 60s);
    ASSERT_TRUE(line) << "rank " << r;
    if (std::string(buffers) == "registered") {  // (the victim's buffer read in place)
      EXPECT_NE(line->find("iter 2 registered 2"), std::string::npos) << *line;
    }
  }
  uint64_t t_signal = unix_ms();
  ASSERT_TRUE(ranks.procs[victim]->signal(sig));
  // A SIGKILLed rank is gone once the kernel has torn it down: on a starved host that once took
  // longer than the failure timeout (make test), and timed_out is then the survivors' right word.
  double dead_after_ms = 0;
  if (sig == SIGKILL) {
    ASSERT_TRUE(ranks.procs[victim]->wait(timeout + 10s)) << "the SIGKILLed rank did not end";
    dead_after_ms = double(unix_ms()) - double(t_signal);
  }
  const bool died_late = dead_after_ms > double(timeout.count()) - 500.0;
  for (int r = 0; r < victim; ++r) {
    auto line = ranks.procs[r]->wait_for_line("error", timeout + 10s);
    ASSERT_TRUE(line) << "rank " << r << " did not fail";
    std::istringstream in(*line);
    std::string word, code, at;
    uint64_t when = 0;
    in >> word >> code >> at >> when;
    double ms = double(when) - double(t_signal);
    std::printf("rank %d: %s after %.0f ms (%s)\n", r, code.c_str(), ms, line->c_str());
    if (died_late)
      EXPECT_TRUE(code == expected_code || code == "timed_out") << *line;
    else
      EXPECT_EQ(code, expected_code)
          << *line << " (the victim ended " << dead_after_ms << " ms after the signal)";
    // The deadline acted (room for a loaded machine; the latencies are the benchmark's).
    EXPECT_LT(ms, double(timeout.count()) + 5000.0)
        << "failure timeout " << timeout.count() << " ms";
  }
  {
    std::ofstream members(ranks.dir.path() + "/gen2.members");
    members << "0 1 2\n";
  }
  for (int r = 0; r < victim; ++r) {
    auto line = ranks.procs[r]->wait_for_line("gen2", 60s);
    ASSERT_TRUE(line) << "rank " << r << " did not rebuild";
    EXPECT_EQ(line->rfind("gen2 ok world 3", 0), 0u) << *line;
  }
}

// Both large-buffer algorithms: through shared memory (the default on one host) and the ring
// over UCX (members on other hosts).
TEST(CommProcesses, SigkillOfOneOfFourFailsEverySurvivorWithPeerLostThenThreeRebuild) {
  failure_scenario(SIGKILL, "peer_lost", 3000ms, "shm");
}

TEST(CommProcesses, SigstopOfOneOfFourFailsEverySurvivorWithTimedOutThenThreeRebuild) {
  failure_scenario(SIGSTOP, "timed_out", 2000ms, "shm");
}

// Registered buffers: the survivors were reading the victim's buffer in place (its memory stays
// mapped by them after it dies: no fault, only peer_lost).
TEST(CommProcesses, RegisteredSigkillOfOneOfFourFailsEverySurvivorWithPeerLostThenThreeRebuild) {
  failure_scenario(SIGKILL, "peer_lost", 3000ms, "shm", "allreduce", 16 << 20, "registered");
}

TEST(CommProcesses, RegisteredSigstopOfOneOfFourFailsEverySurvivorWithTimedOutThenThreeRebuild) {
  failure_scenario(SIGSTOP, "timed_out", 2000ms, "shm", "allreduce", 16 << 20, "registered");
}

TEST(CommProcesses, RingSigkillOfOneOfFourFailsEverySurvivorWithPeerLostThenThreeRebuild) {
  failure_scenario(SIGKILL, "peer_lost", 3000ms, "ring");
}

TEST(CommProcesses, RingSigstopOfOneOfFourFailsEverySurvivorWithTimedOutThenThreeRebuild) {
  failure_scenario(SIGSTOP, "timed_out", 2000ms, "ring");
}

// A pause of every member (a paused VM, the whole job stopped) is no member's silence: a wait
// counts the others' silence only while its own process runs. Rank 1 stopped first (rank 0 waits
// for it 300 ms), then rank 0 too, for 3 s past the 2 s timeout; rank 0 woken 100 ms before rank
// 1: it saw 400 ms of silence, and the gap counts 500 ms: nothing fails (it failed with timed_out
// at once).
void pause_of_every_member(const char* algorithm) {
  Ranks ranks(2, {"--mode", "loop", "--count", std::to_string(1 << 20), "--timeout-ms", "2000",
                  "--algorithm", algorithm});
  for (auto& p : ranks.procs) ASSERT_TRUE(p->wait_for_line("iter 2", 60s));
  ASSERT_TRUE(ranks.procs[1]->signal(SIGSTOP));
  std::this_thread::sleep_for(300ms);
  ASSERT_TRUE(ranks.procs[0]->signal(SIGSTOP));
  std::this_thread::sleep_for(3s);
  ASSERT_TRUE(ranks.procs[0]->signal(SIGCONT));
  std::this_thread::sleep_for(100ms);
  ASSERT_TRUE(ranks.procs[1]->signal(SIGCONT));
  // (both ranks' lines read in turn: a rank whose output is not read blocks in its write)
  for (int turn = 0; turn < 30; ++turn) {
    auto error = ranks.procs[turn % 2]->wait_for_line("error", 100ms);
    ASSERT_FALSE(error) << "rank " << turn % 2 << ": " << *error;
  }
  for (auto& p : ranks.procs) EXPECT_TRUE(p->wait_for_line("iter", 10s)) << "it did not go on";
}

TEST(CommProcesses, APauseOfEveryMemberFailsNoSharedMemoryAllreduce) {
  pause_of_every_member("shm");
}

TEST(CommProcesses, APauseOfEveryMemberFailsNoRingAllreduce) { pause_of_every_member("ring"); }

// The other calls fail the same way: broadcast, allgather, sendrecv between neighbours, and the
// shared-memory allreduce's small path (16 floats: one step through the header's small area).
struct Call {
  const char* op;
  const char* algorithm;
  size_t count;
};

class OtherCalls : public ::testing::TestWithParam<std::tuple<Call, int>> {};

TEST_P(OtherCalls, FailEverySurvivorWithTheCodeThenThreeRebuild) {
  auto [call, sig] = GetParam();
  if (sig == SIGKILL)
    failure_scenario(SIGKILL, "peer_lost", 3000ms, call.algorithm, call.op, call.count);
  else
    failure_scenario(SIGSTOP, "timed_out", 2000ms, call.algorithm, call.op, call.count);
}

// How the shared-memory allreduce handles lines shared between cores can be chosen by vendor
// (TROUPE_PEER_LINES; ctest runs the allreduce tests with each): a value that is neither fails
// the benchmark with the reason, nonzero, instead of taking one silently.
TEST(CommProcesses, AnUnknownPeerLinesChoiceFailsTheBenchmarkWithTheReason) {
  testing::TempDir dir;
  const std::string out = dir.path() + "/bench.out";
  coordinator::ChildProcess p({{testing::troupe_binary(), "bench", "allreduce", "--workers", "2",
                                "--sizes", "1M", "--min-seconds", "0.01"},
                               out,
                               out,
                               {"TROUPE_PEER_LINES=zen"}});
  auto st = p.wait(60s);
  ASSERT_TRUE(st);
  EXPECT_EQ(WEXITSTATUS(*st), 1) << testing::text_of(out);
  EXPECT_NE(testing::text_of(out).find("TROUPE_PEER_LINES=zen is neither intel nor amd"),
            std::string::npos)
      << testing::text_of(out);
}

// A link checks whether a co-located member's process is gone by reading /proc/PID/stat; a
// process reaped between the open and the read fails the read with ESRCH. That is "gone", not an
// exception out of the check (it once failed a survivor's worker: "basic_filebuf::underflow error
// reading the file: No such process"). Children exit and are reaped while the check runs.
TEST(CommProcesses, AProcessReapedWhileItIsCheckedIsGoneNotAnError) {
  const auto until = std::chrono::steady_clock::now() + 3s;
  int checked = 0;
  while (std::chrono::steady_clock::now() < until) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(0);
    std::thread reaper([pid] { ::waitpid(pid, nullptr, 0); });
    bool gone = false;
    for (int i = 0; i < 100000 && !gone && !HasFailure(); ++i, ++checked)
      EXPECT_NO_THROW(gone = comm::process_gone(pid));
    reaper.join();
    if (HasFailure()) break;
    EXPECT_TRUE(comm::process_gone(pid));
  }
  EXPECT_FALSE(comm::process_gone(::getpid()));
  std::cerr << checked << " checks\n";
}

INSTANTIATE_TEST_SUITE_P(CommProcesses, OtherCalls,
                         ::testing::Combine(::testing::Values(Call{"broadcast", "auto", 1 << 20},
                                                              Call{"allgather", "auto", 1 << 20},
                                                              Call{"sendrecv", "auto", 4 << 20},
                                                              Call{"allreduce", "shm", 16}),
                                            ::testing::Values(SIGKILL, SIGSTOP)),
                         [](const auto& info) {
                           const Call& c = std::get<0>(info.param);
                           std::string name = std::string(c.op) + (c.count <= 64 ? "Small" : "") +
                                              (std::string(c.algorithm) == "shm" ? "Shm" : "");
                           return name +
                                  (std::get<1>(info.param) == SIGKILL ? "Sigkill" : "Sigstop");
                         });

}  // namespace
}  // namespace troupe
