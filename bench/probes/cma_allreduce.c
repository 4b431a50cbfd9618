// Could a single-copy allreduce through the kernel beat the shared-memory one with two processes?
// The route OpenMPI takes between local processes, written out tight: each of two processes
// (one core each) reduces its half of every chunk after pulling the other's input for it with
// process_vm_readv (CMA) into a small buffer of its own, then pulls the other's reduced half
// straight into its buffer. No staging copy and no result area: 3.5 x the bytes of traffic per
// rank instead of the staged path's 4 x, but every pulled byte goes through the kernel (each
// page pinned). In place, f32 sums, the caller's memory (malloc), warm buffers; prints the time
// of one allreduce for each piece size. Compare with `troupe bench allreduce --workers 2` and
// bench/compare_allreduce.sh in the same minutes (docs/performance.md, "CMA").
// Build and run: cc -O3 -march=native -o /tmp/cma_allreduce bench/probes/cma_allreduce.c &&
//                /tmp/cma_allreduce 16777216 65536,262144,1048576,4194304
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct shared {
  _Atomic long reduced[2], done[2], ready[2];
  pid_t pid[2];
  float* buf[2];
};

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  sched_setaffinity(0, sizeof s, &s);
}

// Until the other's counter reaches at_least (both processes spin on their own core).
static void wait_for(_Atomic long* counter, long at_least) {
  while (atomic_load(counter) < at_least) __builtin_ia32_pause();
}

static void pull(pid_t from, void* to, const void* at, size_t bytes) {
  struct iovec local = {to, bytes}, remote = {(void*)at, bytes};
  if (process_vm_readv(from, &local, 1, &remote, 1, 0) != (ssize_t)bytes) {
    perror("process_vm_readv");
    exit(1);
  }
}

// One in-place allreduce of count floats in chunks of two pieces; step counts chunks done.
static void allreduce(struct shared* s, int me, float* buf, float* scratch, size_t count,
                      size_t piece, long* step) {
  const int other = 1 - me;
  for (size_t at = 0; at < count; at += 2 * piece) {
    const size_t len = count - at < 2 * piece ? count - at : 2 * piece;
    const size_t first = (len + 1) / 2, off[2] = {at, at + first}, n[2] = {first, len - first};
    pull(s->pid[other], scratch, s->buf[other] + off[me], n[me] * sizeof(float));
    for (size_t i = 0; i < n[me]; ++i) buf[off[me] + i] += scratch[i];
    atomic_store(&s->reduced[me], ++*step);
    wait_for(&s->reduced[other], *step);
    pull(s->pid[other], buf + off[other], s->buf[other] + off[other], n[other] * sizeof(float));
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s BYTES PIECE_BYTES[,PIECE_BYTES...]\n", argv[0]);
    return 2;
  }
  const size_t count = strtoull(argv[1], 0, 0) / sizeof(float);
  struct shared* s = mmap(0, sizeof *s, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  const pid_t child = fork();
  const int me = child == 0 ? 1 : 0;
  pin(me);
  float* buf = malloc(count * sizeof(float) + 64);
  float* scratch = malloc(4u << 20);
  for (size_t i = 0; i < count; ++i) buf[i] = 1;
  s->buf[me] = buf;
  s->pid[me] = getpid();
  atomic_store(&s->ready[me], 1);
  wait_for(&s->ready[1 - me], 1);
  long step = 0, calls = 0;
  for (char* p = argv[2]; p && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL) {
    const size_t piece = strtoull(p, 0, 0) / sizeof(float);
    if (piece == 0 || piece > (1u << 20)) return 2;
    const int iters = 50;
    double t0 = 0;
    for (int it = 0; it < iters + 5; ++it) {
      if (it == 5) t0 = now();
      allreduce(s, me, buf, scratch, count, piece, &step);
      atomic_store(&s->done[me], ++calls);  // nobody returns while the other still pulls
      wait_for(&s->done[1 - me], calls);
    }
    if (me == 0)
      printf("cma allreduce, 2 processes, %zu bytes, pieces of %zu bytes: %.1f us\n",
             count * sizeof(float), piece * sizeof(float), (now() - t0) / iters * 1e6);
  }
  if (me == 0) waitpid(child, 0, 0);
  return 0;
}
