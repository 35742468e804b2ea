// The heavy side of the asymmetric barrier (base.h): a membarrier system call, registered
// once per process (and again in a forked child, whose memory map is a new one).
#include "base.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

bool devbuf__light_barrier_suffices;

// DEVBUF_MEMBARRIER=off takes the way of a kernel without the call (the tests run both).
static void register_membarrier(void) {
  const char *wanted = getenv("DEVBUF_MEMBARRIER");
  if (wanted && strcmp(wanted, "off") == 0) {
    devbuf__light_barrier_suffices = false;
    return;
  }
#if defined(__linux__) && defined(SYS_membarrier)
  long commands = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  devbuf__light_barrier_suffices =
      commands > 0 && (commands & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#else
  devbuf__light_barrier_suffices = false;
#endif
}

// Without membarrier, the frequent side's read-modify-write and the seldom side's
// sequentially consistent store and loads (its callers') need nothing more.
void devbuf__heavy_barrier(void) {
#if defined(__linux__) && defined(SYS_membarrier)
  if (devbuf__light_barrier_suffices)
    syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0);
#endif
}

// Before any thread of the library exists, so that the frequent side never sees the choice
// change; a forked child has only the thread that forked.
__attribute__((constructor)) static void barrier_init(void) {
  register_membarrier();
  pthread_atfork(NULL, NULL, register_membarrier);
}
