// libFuzzer target: exports received from a hostile process. The input is a message (a
// header whose every field comes from the input) sent with 0 to 3 descriptors (a real memory
// file, a lease or a pidfd, a second memory file or a pipe) over a Unix socket. Receiving either
// refuses with every descriptor closed, or yields an export whose import refuses or maps a buffer
// whose every byte can be read, and whose release unmaps it.
#include "../src/core/core.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define MEMORY_BYTES (1u << 16)

static devbuf_device_t *cpu;
static int memory = -1, sleepers = -1, process = -1, pipe_ends[2] = {-1, -1};

static void set_up(void) {
  if (cpu) return;
  if (devbuf_device_open("cpu", &cpu) != DEVBUF_OK ||
      devbuf__memory_file_create("fuzz", MEMORY_BYTES, &memory) != DEVBUF_OK ||
      devbuf__memory_file_create("fuzz-sleepers", 4096, &sleepers) != DEVBUF_OK ||
      (process = devbuf__process_watch(getpid())) < 0 || pipe(pipe_ends) != 0)
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  set_up();
  if (size < 1) return 0;
  uint8_t choice = data[0];
  data++, size--;
  devbuf__export_header header;
  memset(&header, 0, sizeof header);
  memcpy(&header, data, size < sizeof header ? size : sizeof header);
  if (choice & 0x10) memcpy(header.magic, DEVBUF__EXPORT_MAGIC, sizeof header.magic);
  if (choice & 0x20) header.pid = (int32_t)getpid();
  bool as_event = choice & 0x40; // a page that passes for an event's, and a pidfd: the watcher runs
  if (as_event) {
    void *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, memory, 0);
    if (page == MAP_FAILED) abort();
    memcpy(page, "devbufE2", 8);
    memcpy((char *)page + 28, &header.pid, sizeof header.pid); // its pid field
    munmap(page, 4096);
  }
  int hold = -1, watch = -1;
  if (devbuf__lease_create(&hold, &watch) != DEVBUF_OK) abort();
  int fds[3] = {choice & 0x80 ? pipe_ends[0] : memory, as_event ? process : hold,
                choice & 0x08 ? pipe_ends[1] : sleepers};
  size_t fd_count = choice & 3;
  size_t sent = size < sizeof header ? size : sizeof header;
  int sockets[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sockets) != 0) abort();
  if (sent && devbuf__send_with_fds(sockets[0], &header, sent, fds, fd_count, NULL) != DEVBUF_OK)
    abort();
  close(sockets[0]);
  close(hold);
  devbuf_export_t *shared = NULL;
  devbuf_status status = devbuf_export_receive(sockets[1], &shared);
  close(sockets[1]);
  if ((status == DEVBUF_OK) != (shared != NULL)) abort();
  if (shared) {
    devbuf_buffer_t *buffer = NULL;
    devbuf_event_t *event = NULL;
    if (devbuf_export_kind_of(shared) == DEVBUF_EXPORT_BUFFER &&
        devbuf_buffer_import(cpu, shared, &buffer) == DEVBUF_OK) {
      static unsigned char copy[MEMORY_BYTES];
      size_t bytes = devbuf_buffer_size(buffer);
      if (bytes > MEMORY_BYTES || devbuf_buffer_copyout(buffer, copy, bytes) != DEVBUF_OK) {
        fprintf(stderr, "an import of %zu bytes from %u: %s\n", bytes, MEMORY_BYTES,
                devbuf_last_error());
        abort();
      }
      devbuf_buffer_release(buffer);
    } else if (devbuf_export_kind_of(shared) == DEVBUF_EXPORT_EVENT &&
               devbuf_event_import(shared, &event) == DEVBUF_OK) {
      devbuf_event_wait(event, UINT64_MAX, 0);
      devbuf_event_release(event);
    }
    devbuf_export_free(shared);
  }
  // Nothing received may stay open: the lease's watch sees every holder gone.
  if (devbuf__lease_held(watch)) {
    fprintf(stderr, "a received lease stayed open\n");
    abort();
  }
  close(watch);
  return 0;
}
