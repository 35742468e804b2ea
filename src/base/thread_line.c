// Which line of the per-thread counters (base.h) the calling thread adds to: one of its own
// while one is free, given back when the thread exits.
#include "base.h"

#include <pthread.h>

_Thread_local unsigned devbuf__thread_line_plus_one __attribute__((tls_model("initial-exec")));

static atomic_uint lines_owned; // bit i: line i has a live owner
static pthread_key_t exit_key;
static pthread_once_t exit_key_once = PTHREAD_ONCE_INIT;
static bool exit_key_made;

// At the thread's exit (a destructor of the thread's keys): the line goes to the next thread
// to ask. Whatever this thread counts from here on, in later destructors, goes to the
// shared line.
static void give_line_back(void *unused) {
  (void)unused;
  unsigned line = devbuf__thread_line_plus_one - 1;
  devbuf__thread_line_plus_one = DEVBUF__SHARED_LINE + 1;
  if (line < DEVBUF__THREAD_LINES)
    atomic_fetch_and_explicit(&lines_owned, ~(1u << line), memory_order_release);
}

static void make_exit_key(void) {
  exit_key_made = pthread_key_create(&exit_key, give_line_back) == 0;
}

// Claims the lowest free line; its earlier owner's counts are seen (acquire).
static unsigned claim_line(void) {
  unsigned owned = atomic_load_explicit(&lines_owned, memory_order_relaxed);
  for (;;) {
    unsigned free_lines = ~owned & ((1u << DEVBUF__THREAD_LINES) - 1);
    if (!free_lines) return DEVBUF__SHARED_LINE;
    unsigned line = (unsigned)__builtin_ctz(free_lines);
    if (atomic_compare_exchange_weak_explicit(&lines_owned, &owned, owned | (1u << line),
                                              memory_order_acquire, memory_order_relaxed))
      return line;
  }
}

unsigned devbuf__thread_line_slow(void) {
  pthread_once(&exit_key_once, make_exit_key);
  unsigned line = DEVBUF__SHARED_LINE;
  // A line without the key's destructor would stay owned after the thread is gone.
  if (exit_key_made && pthread_setspecific(exit_key, &lines_owned) == 0) {
    line = claim_line();
    if (line == DEVBUF__SHARED_LINE) pthread_setspecific(exit_key, NULL);
  }
  devbuf__thread_line_plus_one = line + 1;
  return line;
}

// A forked child has one thread, the one that called fork: the lines of the others are free.
static void keep_own_line_only(void) {
  unsigned line = devbuf__thread_line_plus_one - 1;
  atomic_store(&lines_owned, line < DEVBUF__THREAD_LINES ? 1u << line : 0u);
}

__attribute__((constructor)) static void thread_line_init(void) {
  pthread_atfork(NULL, NULL, keep_own_line_only);
}
