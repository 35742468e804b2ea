// What a forked child inherits. Its only thread is the one that called fork, so any lock
// another thread held at that moment would stay held for good: each layer registers a hook
// whose prepare step takes its locks (outermost first, in rank order) and whose parent and
// child steps give them back, so the child starts with every lock free and every structure
// whole. The child also gets a new epoch: work stamped with an older one is its ancestor's,
// and never runs here.
#include "base.h"

#define MAX_HOOKS 8

atomic_uint devbuf__process_epoch;

static const devbuf__fork_hook *hooks[MAX_HOOKS]; // by rank
static int hook_count;
static pthread_mutex_t hooks_lock = PTHREAD_MUTEX_INITIALIZER;

static void prepare(void) {
  pthread_mutex_lock(&hooks_lock);
  for (int i = 0; i < hook_count; i++) hooks[i]->prepare();
}

static void in_parent(void) {
  for (int i = hook_count - 1; i >= 0; i--) hooks[i]->parent();
  pthread_mutex_unlock(&hooks_lock);
}

static void in_child(void) {
  atomic_fetch_add(&devbuf__process_epoch, 1);
  for (int i = hook_count - 1; i >= 0; i--) hooks[i]->child();
  pthread_mutex_init(&hooks_lock, NULL);
}

static void register_handlers(void) { pthread_atfork(prepare, in_parent, in_child); }

void devbuf__fork_hook_add(const devbuf__fork_hook *hook) {
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, register_handlers);
  pthread_mutex_lock(&hooks_lock);
  if (hook_count < MAX_HOOKS) {
    int at = hook_count++;
    for (; at > 0 && hooks[at - 1]->rank > hook->rank; at--) hooks[at] = hooks[at - 1];
    hooks[at] = hook;
  }
  pthread_mutex_unlock(&hooks_lock);
}
