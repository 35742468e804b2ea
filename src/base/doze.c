// Sleepers that submissions do not wake (base.h): the list of them, and the nudge that a
// thread about to block on the library's work gives them first.
#include "base.h"

#include <pthread.h>

atomic_uint devbuf__dozers_asleep;
atomic_uint devbuf__blocked_waiters;

static pthread_mutex_t dozers_lock = PTHREAD_MUTEX_INITIALIZER;
static devbuf__dozer *dozers; // every registered one, asleep or not

void devbuf__dozer_add(devbuf__dozer *dozer) {
  pthread_mutex_lock(&dozers_lock);
  dozer->previous = NULL;
  dozer->next = dozers;
  if (dozers) dozers->previous = dozer;
  dozers = dozer;
  pthread_mutex_unlock(&dozers_lock);
}

void devbuf__dozer_remove(devbuf__dozer *dozer) {
  pthread_mutex_lock(&dozers_lock);
  if (dozer->previous)
    dozer->previous->next = dozer->next;
  else if (dozers == dozer)
    dozers = dozer->next;
  if (dozer->next) dozer->next->previous = dozer->previous;
  dozer->previous = dozer->next = NULL;
  pthread_mutex_unlock(&dozers_lock);
}

// The list lock is held while each is nudged: a dozer leaves the list (and may be freed)
// only under it.
void devbuf__nudge_dozers_slow(void) {
  pthread_mutex_lock(&dozers_lock);
  for (devbuf__dozer *dozer = dozers; dozer; dozer = dozer->next) dozer->nudge(dozer);
  pthread_mutex_unlock(&dozers_lock);
}

// A forked child has none of its parent's threads: none of the listed sleepers exist there.
static void dozers_fork_prepare(void) { pthread_mutex_lock(&dozers_lock); }
static void dozers_fork_parent(void) { pthread_mutex_unlock(&dozers_lock); }
static void dozers_fork_child(void) {
  dozers = NULL;
  atomic_store(&devbuf__dozers_asleep, 0);
  atomic_store(&devbuf__blocked_waiters, 0); // only this thread is left, and it waits on nothing
  pthread_mutex_unlock(&dozers_lock);
}
DEVBUF__FORK_HOOK(70, dozers_fork_prepare, dozers_fork_parent, dozers_fork_child)
