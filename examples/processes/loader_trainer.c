// A loader process feeding a trainer through shared memory, without copies. The trainer
// starts the loader (this program again), which fills batches in two slots of shareable
// memory; an exported event says a batch is ready, another one (the trainer's) that it has
// been consumed, so the loader refills a slot only after the trainer's kernel read it. The
// trainer's queue waits for each batch before its kernel sums it, and checks every sum.
// usage: loader_trainer [BATCHES]   (exit status 0 when every sum is right)
#include <devbuf.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define SLOTS     2
#define FLOATS    (1 << 16)
#define TRY(call) (((call) == DEVBUF_OK) || (fprintf(stderr, "%s\n", devbuf_last_error()), false))

static bool send_event(devbuf_event_t *event, int socket) {
  devbuf_export_t *shared = NULL;
  bool sent = TRY(devbuf_event_export(event, &shared)) && TRY(devbuf_export_send(shared, socket));
  devbuf_export_free(shared);
  return sent;
}

static bool receive_event(int socket, devbuf_event_t **out) {
  devbuf_export_t *shared = NULL;
  bool got = TRY(devbuf_export_receive(socket, &shared)) && TRY(devbuf_event_import(shared, out));
  devbuf_export_free(shared);
  return got;
}

// Batch b holds FLOATS copies of b + 1.
static devbuf_status fill_batch(const devbuf_kernel_args_t *args) {
  float *batch = args->data[0], value = (float)(*(const int *)args->scalars + 1);
  for (size_t i = 0; i < args->sizes[0] / sizeof *batch; i++) batch[i] = value;
  return DEVBUF_OK;
}

static devbuf_status sum_batch(const devbuf_kernel_args_t *args) {
  const float *batch = args->data[0];
  double sum = 0;
  for (size_t i = 0; i < args->sizes[0] / sizeof *batch; i++) sum += batch[i];
  ((double *)args->data[1])[*(const int *)args->scalars] = sum;
  return DEVBUF_OK;
}

static int loader(devbuf_device_t *cpu, int socket, int batches) {
  devbuf_allocator_t *shareable = devbuf_device_allocator_for(cpu, DEVBUF_MEMORY_SHAREABLE);
  devbuf_buffer_t *slots[SLOTS] = {NULL};
  devbuf_event_t *ready = NULL, *consumed = NULL;
  devbuf_queue_t *queue = NULL;
  size_t floats = FLOATS;
  bool ok = TRY(devbuf_event_create(0, &ready)) && send_event(ready, socket) &&
            receive_event(socket, &consumed) && TRY(devbuf_queue_create(cpu, &queue));
  for (int s = 0; ok && s < SLOTS; s++) {
    devbuf_export_t *shared = NULL;
    ok = TRY(devbuf_buffer_allocate(shareable, DEVBUF_FLOAT32, &floats, 1, 0, &slots[s])) &&
         TRY(devbuf_buffer_export(slots[s], &shared)) && TRY(devbuf_export_send(shared, socket));
    devbuf_export_free(shared);
  }
  for (int b = 0; ok && b < batches; b++) {
    devbuf_use_t write = {slots[b % SLOTS], DEVBUF_ACCESS_WRITE};
    // The slot's previous batch must have been read first: the trainer says so.
    ok = (b < SLOTS || TRY(devbuf_queue_wait(queue, consumed, (uint64_t)(b - SLOTS + 1)))) &&
         TRY(devbuf_queue_submit(queue, fill_batch, &write, 1, &b, sizeof b)) &&
         TRY(devbuf_queue_signal(queue, ready, (uint64_t)b + 1));
  }
  ok = ok && TRY(devbuf_queue_finish(queue)) &&
       TRY(devbuf_event_wait(consumed, (uint64_t)batches, UINT64_MAX));
  devbuf_queue_release(queue);
  for (int s = 0; s < SLOTS; s++) devbuf_buffer_release(slots[s]);
  devbuf_event_release(consumed);
  devbuf_event_release(ready);
  return ok ? 0 : 1;
}

static int trainer(devbuf_device_t *cpu, const char *self, int batches) {
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) return 1;
  char fd_text[16], batches_text[16];
  snprintf(fd_text, sizeof fd_text, "%d", sockets[1]);
  snprintf(batches_text, sizeof batches_text, "%d", batches);
  pid_t child = fork();
  if (child == 0) {
    close(sockets[0]);
    execl(self, self, batches_text, "--loader", fd_text, (char *)NULL);
    _exit(127);
  }
  close(sockets[1]);
  devbuf_event_t *ready = NULL, *consumed = NULL;
  devbuf_buffer_t *slots[SLOTS] = {NULL}, *sums = NULL;
  devbuf_queue_t *queue = NULL;
  size_t count = (size_t)batches;
  bool ok = receive_event(sockets[0], &ready) && TRY(devbuf_event_create(0, &consumed)) &&
            send_event(consumed, sockets[0]) && TRY(devbuf_queue_create(cpu, &queue)) &&
            TRY(devbuf_buffer_allocate(devbuf_device_allocator(cpu), DEVBUF_FLOAT64, &count, 1, 0,
                                       &sums));
  for (int s = 0; ok && s < SLOTS; s++) {
    devbuf_export_t *shared = NULL;
    ok = TRY(devbuf_export_receive(sockets[0], &shared)) &&
         TRY(devbuf_buffer_import(cpu, shared, &slots[s]));
    devbuf_export_free(shared);
  }
  for (int b = 0; ok && b < batches; b++) {
    devbuf_use_t uses[2] = {{slots[b % SLOTS], DEVBUF_ACCESS_READ}, {sums, DEVBUF_ACCESS_WRITE}};
    ok = TRY(devbuf_queue_wait(queue, ready, (uint64_t)b + 1)) &&
         TRY(devbuf_queue_submit(queue, sum_batch, uses, 2, &b, sizeof b)) &&
         TRY(devbuf_queue_signal(queue, consumed, (uint64_t)b + 1));
  }
  ok = ok && TRY(devbuf_queue_finish(queue));
  int wrong = 0;
  const double *got = NULL;
  if (ok && TRY(devbuf_buffer_contents(sums, (const void **)&got, NULL))) {
    for (int b = 0; b < batches; b++) wrong += got[b] != (double)FLOATS * (b + 1);
    devbuf_buffer_end_access(sums, got);
  }
  int status = -1;
  waitpid(child, &status, 0);
  ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  printf("%d batches of %d floats from a loader process, summed by the trainer's queue: %s\n",
         batches, FLOATS, ok && !wrong ? "every sum right" : "WRONG");
  close(sockets[0]);
  devbuf_queue_release(queue);
  for (int s = 0; s < SLOTS; s++) devbuf_buffer_release(slots[s]);
  devbuf_buffer_release(sums);
  devbuf_event_release(consumed);
  devbuf_event_release(ready);
  return ok && !wrong ? 0 : 1;
}

int main(int argc, char **argv) {
  int batches = argc > 1 ? atoi(argv[1]) : 64;
  if (batches < 1 || batches > 1 << 20) {
    fprintf(stderr, "usage: %s [BATCHES (1 to 1048576)]\n", argv[0]);
    return 2;
  }
  devbuf_device_t *cpu = NULL;
  if (!TRY(devbuf_device_open("cpu", &cpu))) return 1;
  int status = argc == 4 && strcmp(argv[2], "--loader") == 0 ? loader(cpu, atoi(argv[3]), batches)
                                                             : trainer(cpu, argv[0], batches);
  devbuf_device_release(cpu);
  return status;
}
