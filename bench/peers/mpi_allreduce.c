/* OpenMPI peer of `troupe bench allreduce`: MPI_Allreduce (float sum) time and bus bandwidth
 * (nccl-tests: 2(n-1)/n * bytes / time). Same timing method as troupe's: iterations for about
 * 0.3 s, 3 trials, median, averaged over ranks. A peer for comparison only.
 *   mpicc -O2 -o /tmp/troupe_mpi_allreduce bench/peers/mpi_allreduce.c
 *   mpirun --allow-run-as-root --oversubscribe -np 2 /tmp/troupe_mpi_allreduce 4096 1048576 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, world;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  for (int a = 1; a < argc; ++a) {
    size_t bytes = strtoull(argv[a], NULL, 10);
    size_t count = bytes / 4 ? bytes / 4 : 1;
    float* buf = calloc(count, sizeof(float));
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double est = MPI_Wtime() - t0;
    double iters_d = 0.3 / (est > 1e-7 ? est : 1e-7);
    if (iters_d < 1) iters_d = 1;
    if (iters_d > 10000) iters_d = 10000;
    MPI_Bcast(&iters_d, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    int iters = (int)iters_d;
    double trials[3];
    for (int t = 0; t < 3; ++t) {
      MPI_Barrier(MPI_COMM_WORLD);
      double s = MPI_Wtime();
      for (int i = 0; i < iters; ++i)
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double per = (MPI_Wtime() - s) / iters, avg;
      MPI_Allreduce(&per, &avg, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
      trials[t] = avg / world;
    }
    qsort(trials, 3, sizeof(double), cmp);
    if (rank == 0) {
      double busbw = 2.0 * (world - 1) / world * (double)(count * 4) / trials[1] / 1e9;
      printf(
          "{\"bench\":\"allreduce\",\"impl\":\"openmpi\",\"workers\":%d,\"bytes\":%zu,\"time_us\":%"
          ".2f,"
          "\"busbw_gbps\":%.3f,\"iters\":%d}\n",
          world, count * 4, trials[1] * 1e6, busbw, iters);
      fflush(stdout);
    }
    free(buf);
  }
  MPI_Finalize();
  return 0;
}
