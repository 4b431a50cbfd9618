// How fast can one process copy another's memory on this machine? process_vm_readv (CMA, the
// kernel's single cross-process copy that UCX's rendezvous uses between local processes) next
// to memcpy, 240 MB, warm buffers. The ceiling for a state transfer between two processes.
// Build and run: cc -O2 -o /tmp/cma_copy bench/probes/cma_copy.c && /tmp/cma_copy
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
  const size_t n = (size_t)240 << 20;
  char* src = malloc(n);
  char* dst = malloc(n);
  if (!src || !dst) return 1;
  memset(src, 1, n);
  pid_t child = fork();
  if (child == 0) {  // holds its copy of src until killed
    pause();
    return 0;
  }
  memset(dst, 0, n);
  for (int round = 0; round < 4; ++round) {
    double t0 = now();
    size_t done = 0;
    while (done < n) {
      struct iovec local = {dst + done, n - done}, remote = {src + done, n - done};
      ssize_t k = process_vm_readv(child, &local, 1, &remote, 1, 0);
      if (k <= 0) {
        perror("process_vm_readv");
        break;
      }
      done += (size_t)k;
    }
    double t1 = now();
    memcpy(dst, src, n);
    double t2 = now();
    if (round > 0)  // the first round pays the child's copy-on-write faults
      printf("process_vm_readv %.2f GB/s, memcpy %.2f GB/s (bytes moved per second)\n",
             n / (t1 - t0) / 1e9, n / (t2 - t1) / 1e9);
  }
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  return 0;
}
