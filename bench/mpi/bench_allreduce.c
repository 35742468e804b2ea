// All-reduce through devbuf queues against the same MPI_Allreduce called directly on the
// same memory (the devbuf buffer's bytes), side by side in one run (alternating, run by
// run), float32 buffers of 4 KiB to 256 MiB: the ratio is what the queue costs, not where
// the memory lies (malloc'd memory and the caching allocator's segments differ in pages).
// devbuf's side is what a training step does: the all-reduce as host work on a queue, in
// place on a devbuf buffer, waited for with devbuf_queue_finish. Rank 0 prints the medians
// of the times and of the runs' own ratios.
// usage: mpirun -np 2 bench_mpi_allreduce [--quick] [--runs N]
#include <devbuf.h>
#include <mpi.h>

#include "../decimals.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_RUNS 101

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *values, int count) {
  qsort(values, (size_t)count, sizeof *values, by_value);
  return count % 2 ? values[count / 2] : (values[count / 2 - 1] + values[count / 2]) / 2;
}

static devbuf_status all_reduce(const devbuf_kernel_args_t *args) {
  int code = MPI_Allreduce(MPI_IN_PLACE, args->data[0], (int)(args->sizes[0] / sizeof(float)),
                           MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  return code == MPI_SUCCESS ? DEVBUF_OK
                             : devbuf_set_error(DEVBUF_IO_ERROR, "MPI_Allreduce: %d", code);
}

// The slowest rank's time since `start`: both sides measure the whole collective.
static double timed_max(double start) {
  double mine = now_s() - start, slowest = 0;
  MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

int main(int argc, char **argv) {
  int provided = 0, rank = 0, ranks = 1, runs = 7;
  bool quick = false;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) quick = true;
    if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) runs = atoi(argv[++i]);
  }
  if (runs < 1 || runs > MAX_RUNS) runs = 7;
  devbuf_device_t *cpu = NULL;
  devbuf_queue_t *queue = NULL;
  if (provided < MPI_THREAD_SERIALIZED || devbuf_device_open("cpu", &cpu) != DEVBUF_OK ||
      devbuf_queue_create(cpu, &queue) != DEVBUF_OK) {
    fprintf(stderr, "rank %d: %s\n", rank,
            provided < MPI_THREAD_SERIALIZED ? "MPI lacks MPI_THREAD_SERIALIZED"
                                             : devbuf_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  size_t largest = quick ? (size_t)4 << 20 : (size_t)256 << 20;
  if (rank == 0) {
    printf(
        "== all-reduce (sum) of float32 over %d ranks: GB/s of buffer, median of %d runs; devbuf "
        "runs it as host work in a queue; ratio: devbuf's time / raw MPI's in the same run, median "
        "of the runs' ratios ==\n",
        ranks, runs);
    printf("   %9s %12s %12s %8s\n", "size", "raw MPI", "devbuf", "ratio");
  }
  int missed = 0;
  for (size_t bytes = (size_t)4 << 10; bytes <= largest; bytes *= 4) {
    size_t count = bytes / sizeof(float);
    devbuf_buffer_t *buffer = NULL;
    void *plain = NULL; // the buffer's own bytes, for the direct calls between queue runs
    if (devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT32, &count, 1,
                               DEVBUF_BUFFER_ZERO, &buffer) != DEVBUF_OK ||
        devbuf_buffer_unsynchronized_ptr(buffer, &plain, NULL) != DEVBUF_OK) {
      fprintf(stderr, "rank %d: no memory for %zu bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    devbuf_use_t use = {buffer, DEVBUF_ACCESS_READ_WRITE};
    double raw[MAX_RUNS], ours[MAX_RUNS], ratios[MAX_RUNS];
    for (int r = -1; r < runs; r++) { // run -1 warms both up
      double raw_s = 0, ours_s = 0;
      for (int side = 0; side < 2; side++) { // which goes first alternates run by run
        bool queued = (side + (r & 1)) % 2 == 1;
        MPI_Barrier(MPI_COMM_WORLD);
        double start = now_s();
        if (!queued) {
          MPI_Allreduce(MPI_IN_PLACE, plain, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          raw_s = timed_max(start);
          continue;
        }
        if (devbuf_queue_host_task(queue, all_reduce, &use, 1, NULL, 0) != DEVBUF_OK ||
            devbuf_queue_finish(queue) != DEVBUF_OK) {
          fprintf(stderr, "rank %d: %s\n", rank, devbuf_last_error());
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
        ours_s = timed_max(start);
      }
      if (r >= 0) raw[r] = raw_s, ours[r] = ours_s, ratios[r] = ours_s / raw_s;
    }
    // Time ratios: the queue's share of a small collective is its fixed cost per call. The
    // machine's load drifts from run to run more than the queue costs: the ratio quoted is
    // the median of each run's own ratio, its two sides timed back to back.
    double a = median(raw, runs), b = median(ours, runs), ratio = median(ratios, runs);
    double most = bytes < ((size_t)64 << 10) ? 1.3 : bytes < ((size_t)256 << 10) ? 1.1 : 1.03;
    missed += ratio > most;
    if (rank == 0)
      printf("   %7zuKiB %12.3f %12.3f %7.*fx  %s (target <= %.2fx)\n", bytes >> 10,
             (double)bytes / a * 1e-9, (double)bytes / b * 1e-9, bench_decimals(ratio, most), ratio,
             ratio <= most ? "met" : "MISSED", most);
    devbuf_buffer_release(buffer);
  }
  if (rank == 0)
    printf("   %s\n",
           missed ? "the target is MISSED at some sizes" : "the target is met at every size");
  devbuf_queue_release(queue);
  devbuf_device_release(cpu);
  MPI_Finalize();
  return 0;
}
