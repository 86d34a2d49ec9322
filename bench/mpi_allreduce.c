/* Baseline for bench/comm_intrahost.py: OpenMPI's MPI_Allreduce (float32, sum, in place) timed
 * the way `chorus bench comm` times its collectives: warm-up, a barrier, then back-to-back timed
 * iterations; the reported time is the slowest rank's mean, and one extra run with rank r
 * contributing values from r is checked against the known answer.
 *
 * Usage: mpirun -np N mpi_allreduce [-w WARMUP] [-n ITERS] BYTES...
 * Prints one JSON object per size on rank 0:
 *   {"op":"all_reduce","size":B,"count":C,"time_s":T,"algbw":G,"busbw":G,"wrong":W,...}
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float pattern(int rank, long index) {
  return (float)((index * 7 + rank * 3) % 11 - 5 + rank);
}

static double measure(float* data, long count, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i)
    MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  const double start = MPI_Wtime();
  for (int i = 0; i < iters; ++i)
    MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  double local = (MPI_Wtime() - start) / iters;
  double slowest = 0;
  MPI_Allreduce(&local, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

static long check(float* data, long count, int rank, int size) {
  for (long i = 0; i < count; ++i) data[i] = pattern(rank, i);
  MPI_Allreduce(MPI_IN_PLACE, data, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  long wrong = 0;
  for (long i = 0; i < count; ++i) {
    float expected = 0;
    for (int r = 0; r < size; ++r) expected += pattern(r, i);
    if (data[i] != expected) ++wrong;
  }
  long total = 0;
  MPI_Allreduce(&wrong, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int warmup = 5, iters = 20;
  for (int a = 1; a < argc; ++a) {
    if (strcmp(argv[a], "-w") == 0 && a + 1 < argc) {
      warmup = atoi(argv[++a]);
      continue;
    }
    if (strcmp(argv[a], "-n") == 0 && a + 1 < argc) {
      iters = atoi(argv[++a]);
      continue;
    }
    const long bytes = atol(argv[a]);
    const long count = bytes / (long)sizeof(float);
    float* data = calloc((size_t)count, sizeof(float));
    if (!data) MPI_Abort(MPI_COMM_WORLD, 1);
    const double time_s = measure(data, count, warmup, iters);
    const long wrong = check(data, count, rank, size);
    const double algbw = (double)(count * (long)sizeof(float)) / time_s / 1e9;
    if (rank == 0)
      printf("{\"op\":\"all_reduce\",\"size\":%ld,\"count\":%ld,\"type\":\"float32\","
             "\"time_s\":%.9g,\"algbw\":%.6g,\"busbw\":%.6g,\"wrong\":%ld,\"backend\":\"mpi\","
             "\"algorithm\":\"MPI_Allreduce\",\"codec\":\"none\"}\n",
             count * (long)sizeof(float), count, time_s, algbw,
             algbw * 2.0 * (size - 1) / size, wrong);
    fflush(stdout);
    free(data);
  }
  MPI_Finalize();
  return 0;
}
