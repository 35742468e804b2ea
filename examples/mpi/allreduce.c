// One data-parallel step on devbuf queues under MPI: each rank computes a gradient on its
// compute queue, the all-reduce runs as host work on a communication queue, and a second
// step on the compute queue consumes the sum. (On the CPU the compute steps are C functions
// too; on a GPU they would be launches.) No synchronize between the steps: the hazard
// tracker orders the all-reduce after the step that writes the gradient and the consumer
// after the all-reduce, across the two queues. Every rank checks its result against the
// serial computation; the exit status says whether all of them agree.
//
// usage: mpirun -np N allreduce [DEVICE] [FLOATS]     (DEVICE: cpu by default)
#include <devbuf.h>
#include <mpi.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The gradient of rank r at element i: (r + 1) * (i % 97), exact in float32.
static float gradient_of(int rank, size_t i) { return (float)((rank + 1) * (int)(i % 97)); }

static devbuf_status compute_gradient(const devbuf_kernel_args_t *args) {
  int rank;
  memcpy(&rank, args->scalars, sizeof rank);
  float *gradient = args->data[0];
  for (size_t i = 0; i < args->sizes[0] / sizeof *gradient; i++) gradient[i] = gradient_of(rank, i);
  return DEVBUF_OK;
}

// Host work: the sum over every rank, in place. It gets the host address of the buffer;
// devbuf's tracker has made sure no kernel writes it meanwhile.
static devbuf_status all_reduce(const devbuf_kernel_args_t *args) {
  int code = MPI_Allreduce(MPI_IN_PLACE, args->data[0], (int)(args->sizes[0] / sizeof(float)),
                           MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  if (code == MPI_SUCCESS) return DEVBUF_OK;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return devbuf_set_error(DEVBUF_IO_ERROR, "MPI_Allreduce of %zu bytes: %s", args->sizes[0], text);
}

static devbuf_status consume(const devbuf_kernel_args_t *args) {
  const float *sum = args->data[0];
  float *out = args->data[1];
  for (size_t i = 0; i < args->sizes[1] / sizeof *out; i++) out[i] = sum[i] * 0.5f;
  return DEVBUF_OK;
}

typedef struct rank_state {
  devbuf_queue_t *compute, *communicate;
  devbuf_buffer_t *gradient, *out;
} rank_state;

// Everything that can fail on one rank alone, before any collective: false (message set).
static bool prepare(devbuf_device_t *device, size_t count, rank_state *state) {
  devbuf_allocator_t *memory = devbuf_device_allocator_for(device, DEVBUF_MEMORY_HOST_VISIBLE);
  return devbuf_queue_create(device, &state->compute) == DEVBUF_OK &&
         devbuf_queue_create(device, &state->communicate) == DEVBUF_OK &&
         devbuf_buffer_allocate(memory, DEVBUF_FLOAT32, &count, 1, 0, &state->gradient) ==
             DEVBUF_OK &&
         devbuf_buffer_allocate(memory, DEVBUF_FLOAT32, &count, 1, 0, &state->out) == DEVBUF_OK;
}

// Runs the step; the number of elements that differ from the serial result, or -1. Both
// queues have finished when it returns, so no MPI call of theirs is still running.
// `fail_rank` (from ALLREDUCE_FAIL_RANK) is a rank whose submission fails, as one that ran
// out of host memory would: the others must not wait for it in the all-reduce.
static long step(rank_state *state, int rank, int ranks, size_t count, int fail_rank) {
  devbuf_use_t write_gradient = {state->gradient, DEVBUF_ACCESS_WRITE};
  devbuf_use_t reduce_gradient = {state->gradient, DEVBUF_ACCESS_READ_WRITE};
  devbuf_use_t read_sum[2] = {{state->gradient, DEVBUF_ACCESS_READ},
                              {state->out, DEVBUF_ACCESS_WRITE}};
  devbuf_event_t *agreed = NULL; // the all-reduce waits for it: every rank submitted
  bool submitted =
      rank != fail_rank && devbuf_event_create(0, &agreed) == DEVBUF_OK &&
      devbuf_queue_host_task(state->compute, compute_gradient, &write_gradient, 1, &rank,
                             sizeof rank) == DEVBUF_OK &&
      devbuf_queue_wait(state->communicate, agreed, 1) == DEVBUF_OK &&
      devbuf_queue_host_task(state->communicate, all_reduce, &reduce_gradient, 1, NULL, 0) ==
          DEVBUF_OK &&
      devbuf_queue_host_task(state->compute, consume, read_sum, 2, NULL, 0) == DEVBUF_OK;
  if (rank == fail_rank) devbuf_set_error(DEVBUF_OUT_OF_MEMORY, "submission failed on purpose");
  // The ranks agree while their all-reduces are held (so only this thread calls MPI now): all
  // of them go, or none does and each drops its own.
  int unsubmitted = !submitted, any_unsubmitted = 0;
  MPI_Allreduce(&unsubmitted, &any_unsubmitted, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_unsubmitted)
    devbuf_queue_cancel(state->communicate);
  else
    devbuf_event_signal(agreed, 1);
  devbuf_event_release(agreed);
  bool finished = devbuf_queue_finish(state->compute) == DEVBUF_OK;
  finished = devbuf_queue_finish(state->communicate) == DEVBUF_OK && finished;
  float *result = !any_unsubmitted && finished ? malloc(count * sizeof *result) : NULL;
  if (!result || devbuf_buffer_copyout(state->out, result, count * sizeof *result) != DEVBUF_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, devbuf_last_error());
    free(result);
    return -1;
  }
  long wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float serial = 0;
    for (int r = 0; r < ranks; r++) serial += gradient_of(r, i);
    wrong += result[i] != serial * 0.5f;
  }
  free(result);
  return wrong;
}

int main(int argc, char **argv) {
  int provided = 0, rank = 0, ranks = 1;
  // The all-reduce runs on a queue's worker thread, not the one that initialised MPI.
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const char *spec = argc > 1 ? argv[1] : "cpu";
  size_t count = argc > 2 ? strtoull(argv[2], NULL, 0) : (size_t)1 << 18;
  long wrong = -1;
  devbuf_device_t *device = NULL;
  rank_state state = {NULL, NULL, NULL, NULL};
  bool ready = false;
  if (provided < MPI_THREAD_SERIALIZED)
    fprintf(stderr, "rank %d: this MPI gives thread level %d; host work needs SERIALIZED\n", rank,
            provided);
  else if (devbuf_device_open(spec, &device) != DEVBUF_OK || !prepare(device, count, &state))
    fprintf(stderr, "rank %d: %s\n", rank, devbuf_last_error());
  else
    ready = true;
  // Every rank joins the step's all-reduce only if every rank can: one that could not
  // would leave the others waiting in it.
  int unready = !ready, any_unready = 0;
  MPI_Allreduce(&unready, &any_unready, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  const char *fail_rank = getenv("ALLREDUCE_FAIL_RANK");
  if (!any_unready) wrong = step(&state, rank, ranks, count, fail_rank ? atoi(fail_rank) : -1);
  devbuf_buffer_release(state.gradient);
  devbuf_buffer_release(state.out);
  devbuf_queue_release(state.compute);
  devbuf_queue_release(state.communicate);
  devbuf_device_release(device);
  int failed = wrong != 0, any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf("%zu floats all-reduced over %d ranks through devbuf queues on %s: %s\n", count, ranks,
           spec, any_failed ? "WRONG" : "every rank matches the serial result");
  if (wrong > 0) fprintf(stderr, "rank %d: %ld of %zu elements differ\n", rank, wrong, count);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
