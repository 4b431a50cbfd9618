// Fibers for the threads of one block at a time; see cuda_emulation.h.
#include "tests/emulation/cuda_emulation.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#if !defined(__x86_64__)
#error "the CUDA emulation's fibers switch stacks the x86-64 way"
#endif

// Saves the callee-saved registers and the FPU and SSE control words on this stack, stores the
// stack pointer in *from, and resumes the stack `to` saved the same way. (ucontext's swapcontext
// makes a system call each switch for the signal mask: 10x slower for the emulation's millions.)
extern "C" void troupe_emulation_switch(void** from, void* to);
asm(R"(
  .text
  .globl troupe_emulation_switch
  .type troupe_emulation_switch, @function
troupe_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  fnstcw (%rsp)
  stmxcsr 8(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size troupe_emulation_switch, .-troupe_emulation_switch
)");

namespace troupe::emulation {
namespace {

constexpr size_t kStackBytes = size_t(128) << 10;
constexpr int kWarp = 32;

enum class State { ready, at_block, at_warp, done };

struct Fiber {
  void* sp = nullptr;  // its saved stack pointer while it does not run
  char* stack = nullptr;
  State state = State::ready;
  Lane lane;
  int index = 0;                // in the block
  uint64_t block_barriers = 0;  // passed so far: every live thread of the block must agree,
  uint64_t warp_barriers = 0;   // and every lane of the warp (shuffles are warp barriers)
};

struct Block {
  std::vector<Fiber> fibers;
  // Each thread's value in a shuffle, two sets used in turn (by the parity of the warp barriers
  // passed): a lane writes a set again only two barriers later, when everyone has read it.
  std::vector<uint64_t> slots[2];
  std::vector<int> returned;  // per warp: how many of its lanes have returned
  void* scheduler = nullptr;  // the scheduler's stack pointer while a fiber runs
  Fiber* running = nullptr;
  const std::function<void()>* body = nullptr;
  std::vector<float> matrices;  // per warp, kWarpMatrices tiles of 16 x 16 (wmma)
};

thread_local Block* current = nullptr;

// Thread i's stack, kept from launch to launch (allocating and touching 256 of them a launch
// was most of a model test's time); each launching thread has its own.
char* stack_of(size_t i) {
  thread_local std::vector<std::unique_ptr<char[]>> stacks;
  while (stacks.size() <= i) stacks.emplace_back(new char[kStackBytes]);
  return stacks[i].get();
}

[[noreturn]] void fail(const std::string& why) {
  const Fiber* f = current ? current->running : nullptr;
  if (f)
    std::fprintf(stderr, "cuda emulation: %s (block %u,%u,%u, thread %u)\n", why.c_str(),
                 f->lane.block.x, f->lane.block.y, f->lane.block.z, f->lane.thread.x);
  else
    std::fprintf(stderr, "cuda emulation: %s\n", why.c_str());
  std::abort();
}

Fiber& running() {
  if (!current || !current->running) fail("a device function called outside a launch");
  return *current->running;
}

[[noreturn]] void entry() {
  Block& b = *current;
  (*b.body)();
  b.running->state = State::done;
  ++b.returned[size_t(b.running->index) / kWarp];
  troupe_emulation_switch(&b.running->sp, b.scheduler);
  std::abort();  // (never resumed)
}

// A fresh stack whose first switch "returns" into entry(), as if called (16-byte alignment).
void* start_frame(char* stack) {
  auto top = reinterpret_cast<uintptr_t>(stack + kStackBytes) & ~uintptr_t(15);
  auto* words = reinterpret_cast<uint64_t*>(top);
  words[-1] = 0;                                   // entry's return address: none
  words[-2] = reinterpret_cast<uint64_t>(&entry);  // where the switch's ret goes
  for (int r = 3; r <= 8; ++r) words[-r] = 0;      // rbp rbx r12 r13 r14 r15
  uint16_t fpu = 0;
  uint32_t sse = 0;
  asm volatile("fnstcw %0" : "=m"(fpu));
  asm volatile("stmxcsr %0" : "=m"(sse));
  words[-10] = fpu;
  words[-9] = sse;
  return &words[-10];
}

void yield(State s) {
  Fiber& f = running();
  f.state = s;
  troupe_emulation_switch(&f.sp, current->scheduler);
}

// The lanes of f's warp: [first, end).
size_t warp_first(const Fiber& f) { return size_t(f.index) / kWarp * kWarp; }
size_t warp_end(const Block& b, const Fiber& f) {
  return std::min(b.fibers.size(), warp_first(f) + kWarp);
}

// Releases the fibers waiting at a barrier that every live fiber of its group reached, each of
// them at the same one (else they came from different places: divergent code). Returns whether
// any was released.
bool release(Block& b) {
  bool released = false, all_at_block = true, any_at_block = false;
  for (const Fiber& f : b.fibers) {
    if (f.state == State::done) continue;
    all_at_block = all_at_block && f.state == State::at_block;
    any_at_block = any_at_block || f.state == State::at_block;
  }
  if (any_at_block && all_at_block) {
    uint64_t first = 0;
    for (Fiber& f : b.fibers) {
      if (f.state != State::at_block) continue;
      if (first == 0) first = f.block_barriers;
      if (f.block_barriers != first)
        fail("__syncthreads reached from different places (divergent code)");
      f.state = State::ready;
    }
    released = true;
  }
  for (size_t w = 0; w < b.fibers.size(); w += kWarp) {
    const size_t end = std::min(b.fibers.size(), w + kWarp);
    bool all = true, any = false;
    for (size_t l = w; l < end; ++l) {
      if (b.fibers[l].state == State::done) continue;
      all = all && b.fibers[l].state == State::at_warp;
      any = any || b.fibers[l].state == State::at_warp;
    }
    if (!any || !all) continue;
    uint64_t first = 0;
    for (size_t l = w; l < end; ++l) {
      if (b.fibers[l].state != State::at_warp) continue;
      if (first == 0) first = b.fibers[l].warp_barriers;
      if (b.fibers[l].warp_barriers != first)
        fail("lanes of a warp at different warp barriers or shuffles (divergent code)");
      b.fibers[l].state = State::ready;
    }
    released = true;
  }
  return released;
}

[[noreturn]] void deadlock(const Block& b) {
  size_t at_block = 0, at_warp = 0, done = 0;
  for (const Fiber& f : b.fibers) {
    at_block += f.state == State::at_block;
    at_warp += f.state == State::at_warp;
    done += f.state == State::done;
  }
  fail("threads wait at barriers that others never reach: " + std::to_string(at_block) +
       " at __syncthreads, " + std::to_string(at_warp) + " at a warp barrier or shuffle, " +
       std::to_string(done) + " returned");
}

void run_block(Block& b) {
  for (Fiber& f : b.fibers) {
    f.sp = start_frame(f.stack);
    b.returned[size_t(f.index) / kWarp] = 0;
    f.state = State::ready;
    f.block_barriers = f.warp_barriers = 0;
  }
  while (true) {
    for (Fiber& f : b.fibers) {
      if (f.state != State::ready) continue;
      b.running = &f;
      troupe_emulation_switch(&b.scheduler, f.sp);
    }
    b.running = nullptr;
    bool all_done = true;
    for (const Fiber& f : b.fibers) all_done = all_done && f.state == State::done;
    if (all_done) return;
    if (!release(b)) deadlock(b);
  }
}

// A full-warp operation: every lane of the warp must exist and not have returned.
void check_whole_warp(const char* what) {
  const Block& b = *current;
  const Fiber& f = running();
  if (warp_end(b, f) - warp_first(f) != size_t(kWarp))
    fail(std::string(what) + " with a full mask in a warp of fewer than 32 threads");
  if (b.returned[size_t(f.index) / kWarp] == 0) return;
  for (size_t l = warp_first(f); l < warp_end(b, f); ++l)
    if (b.fibers[l].state == State::done)
      fail(std::string(what) + " with a full mask after lane " + std::to_string(l - warp_first(f)) +
           " of the warp returned");
}

void warp_barrier(const char* what) {
  check_whole_warp(what);
  ++running().warp_barriers;
  yield(State::at_warp);
}

}  // namespace

const Lane& lane() { return running().lane; }

void sync_block() {
  ++running().block_barriers;
  yield(State::at_block);
}

void sync_warp() { warp_barrier("__syncwarp"); }

void require(bool ok, const char* what) {
  if (!ok) fail(what);
}

int lane_in_warp() { return running().index % kWarp; }

int warp_parity() { return int(running().warp_barriers % 2); }

float* warp_matrix(int which) {
  if (which < 0 || which >= kWarpMatrices) fail("no such warp matrix");
  return current->matrices.data() +
         (size_t(running().index / kWarp) * kWarpMatrices + size_t(which)) * 256;
}

uint64_t exchange_xor(uint64_t bits, int xor_mask, unsigned member_mask) {
  if (member_mask != 0xffffffffu) fail("a shuffle with a partial mask (not emulated)");
  if (xor_mask < 0 || xor_mask >= kWarp) fail("a shuffle's lane mask out of the warp");
  Block& b = *current;
  Fiber& f = running();
  std::vector<uint64_t>& slots = b.slots[f.warp_barriers % 2];
  slots[size_t(f.index)] = bits;
  warp_barrier("__shfl_xor_sync");  // everyone's value is in
  const size_t from = warp_first(f) + ((size_t(f.index) - warp_first(f)) ^ size_t(xor_mask));
  return slots[from];
}

void run(dim3 grid, dim3 block, const std::function<void()>& body) {
  const size_t threads = size_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64)
    fail("a launch of " + std::to_string(threads) + " threads a block (1..1024)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      grid.x > 0x7fffffffu)
    fail("a launch with grid " + std::to_string(grid.x) + "," + std::to_string(grid.y) + "," +
         std::to_string(grid.z) + " (x 1..2^31-1, y and z 1..65535)");
  if (current) fail("a launch from inside a kernel");
  // One launch at a time in the process: a kernel's __shared__ arrays are statics here, which
  // launches from two host threads (a reducer's and a worker's) would otherwise share.
  static std::mutex launches;
  std::lock_guard<std::mutex> one_at_a_time(launches);
  Block b;
  b.fibers.resize(threads);
  b.slots[0].assign(threads, 0);
  b.slots[1].assign(threads, 0);
  b.returned.assign((threads + kWarp - 1) / kWarp, 0);
  b.matrices.assign(b.returned.size() * kWarpMatrices * 256, 0.f);
  b.body = &body;
  for (size_t i = 0; i < threads; ++i) {
    Fiber& f = b.fibers[i];
    f.stack = stack_of(i);
    f.index = int(i);
    f.lane.thread = {unsigned(i % block.x), unsigned(i / block.x % block.y),
                     unsigned(i / (size_t(block.x) * block.y))};
    f.lane.block_dim = block;
    f.lane.grid_dim = grid;
  }
  current = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        for (Fiber& f : b.fibers) f.lane.block = {x, y, z};
        run_block(b);
      }
  current = nullptr;
}

}  // namespace troupe::emulation
