// Copies out of file mappings that may fault. A mapped file that another process truncates
// raises SIGBUS on access to its pages past the new end; devbuf's own reads of mapped
// memory catch that and report IO_ERROR instead of taking the process down. The handler is
// installed on the first guarded copy and passes every SIGBUS it does not own (another
// thread's, another address) to the handler that was there before.
#include "base.h"

#include <setjmp.h>
#include <signal.h>
#include <string.h>
#include <sys/stat.h>

typedef struct guard {
  sigjmp_buf jump;
  const char *low, *high; // the source range being read
} guard;

static _Thread_local guard *volatile current_guard __attribute__((tls_model("initial-exec")));
static struct sigaction previous_action;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static bool installed;

static void on_sigbus(int signal_number, siginfo_t *info, void *context) {
  guard *active = current_guard;
  const char *address = info ? (const char *)info->si_addr : NULL;
  bool fault = info && info->si_code > 0; // a sent signal's si_addr is no address
  if (active && fault && address >= active->low && address < active->high)
    siglongjmp(active->jump, 1);
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction) previous_action.sa_sigaction(signal_number, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal_number);
    return;
  }
  // A signal another process sent (kill, sigqueue) is no fault: nothing runs again. Ignored,
  // it stays ignored; by default it ends the process, as it would have without devbuf (the
  // signal raised here is blocked until this handler returns).
  if (info && !fault) {
    if (previous_action.sa_handler == SIG_IGN) return;
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
    return;
  }
  // A fault: the faulting access runs again and takes the process down as it would have
  // without devbuf (an ignored SIGBUS from a fault cannot be ignored either).
  signal(SIGBUS, SIG_DFL);
}

static void install(void) {
  struct sigaction action;
  memset(&action, 0, sizeof action);
  action.sa_sigaction = on_sigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  installed = sigaction(SIGBUS, &action, &previous_action) == 0;
}

devbuf_status devbuf__guarded_copy(void *dst, const void *src, size_t size, const char *what) {
  if (!size) return DEVBUF_OK;
  pthread_once(&install_once, install);
  if (!installed) {
    memcpy(dst, src, size);
    return DEVBUF_OK;
  }
  guard here = {.low = src, .high = (const char *)src + size};
  guard *outer = current_guard;
  if (sigsetjmp(here.jump, 1)) { // the signal mask comes back with the jump
    current_guard = outer;
    return devbuf__error(DEVBUF_IO_ERROR,
                         "%s: the file mapped at these %zu bytes ends before them (it was "
                         "truncated while mapped)",
                         what, size);
  }
  current_guard = &here;
  atomic_signal_fence(memory_order_seq_cst);
  devbuf__copy_bytes(dst, src, size);
  atomic_signal_fence(memory_order_seq_cst);
  current_guard = outer;
  return DEVBUF_OK;
}

devbuf_status devbuf__guarded_file_copy(void *dst, const devbuf_memory_t *file, size_t offset,
                                        size_t size, const char *what) {
  devbuf_status status = devbuf__guarded_copy(dst, (const char *)file->host + offset, size, what);
  int fd = (int)((intptr_t)file->token - 1);
  struct stat now;
  if (status != DEVBUF_OK || !size || fd < 0 || fstat(fd, &now) != 0 ||
      (uint64_t)now.st_size >= (uint64_t)offset + size)
    return status;
  return devbuf__error(DEVBUF_IO_ERROR,
                       "%s: the file mapped at these %zu bytes (at %zu) now ends at %llu, before "
                       "them (it was truncated while mapped)",
                       what, size, offset, (unsigned long long)now.st_size);
}
