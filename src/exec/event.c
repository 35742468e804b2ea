// Events: timelines with a growing counter, waits that spin briefly then block, and
// failure that reaches every waiter.
#include "queue.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SPIN_CHECKS 2000 // about a few microseconds before a wait blocks

devbuf_status devbuf_event_create(uint64_t initial, devbuf_event_t **out_event) {
  if (!out_event) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "out_event is NULL");
  devbuf_event_t *event = devbuf__calloc(1, sizeof *event);
  if (!event) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event");
  devbuf__ref_init(&event->refs, 1);
  atomic_init(&event->value, initial);
  atomic_init(&event->failed_at, UINT64_MAX);
  atomic_init(&event->failed, false);
  atomic_init(&event->interest, 0);
  devbuf__mutex_init(&event->lock);
  devbuf__cond_init_monotonic(&event->reached);
  *out_event = event;
  return DEVBUF_OK;
}

devbuf_event_t *devbuf_event_retain(devbuf_event_t *event) {
  if (event) devbuf__ref_retain(&event->refs);
  return event;
}

// Calls the watches of a detached list with `status`.
static void notify(devbuf__event_watch *watches, devbuf_status status) {
  while (watches) {
    devbuf__event_watch *next = watches->next;
    watches->reached(watches->context, status);
    devbuf__free(watches);
    watches = next;
  }
}

devbuf_status devbuf__event_watch_value(devbuf_event_t *event, uint64_t value,
                                        void (*reached)(void *context, devbuf_status status),
                                        void *context) {
  devbuf__event_watch *watch = devbuf__malloc(sizeof *watch);
  if (!watch) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to watch an event");
  *watch = (devbuf__event_watch){value, reached, context, NULL};
  pthread_mutex_lock(&event->lock);
  atomic_fetch_add(&event->interest, 1); // before the value: a raise after it takes the lock
  devbuf_status now = event->failure;
  bool ready = devbuf__event_reached(event, value);
  if (!ready && now == DEVBUF_OK) {
    watch->next = event->watches;
    event->watches = watch;
    watch = NULL;
  } else {
    atomic_fetch_sub(&event->interest, 1);
  }
  pthread_mutex_unlock(&event->lock);
  if (!watch && devbuf__event_is_imported(event)) devbuf__event_share_follow(event);
  if (watch) notify(watch, ready ? DEVBUF_OK : now);
  return DEVBUF_OK;
}

void devbuf_event_release(devbuf_event_t *event) {
  if (!event || !devbuf__ref_drop(&event->refs)) return;
  if (event->share) devbuf__event_share_end(event);
  notify(event->watches, DEVBUF_CANCELLED);
  pthread_cond_destroy(&event->reached);
  pthread_mutex_destroy(&event->lock);
  devbuf__free(event);
}

static void wake_interested(devbuf_event_t *event, uint64_t value);

// Lock-free while nothing in this process blocks on or watches the event: a signal to another
// process (or to a spinning waiter) is then an atomic raise and the exported page's update.
// Raisers race only upwards (compare-and-swap), so two of them never lower the value.
void devbuf__event_raise(devbuf_event_t *event, uint64_t value) {
  // An exported event's page goes first: another process waits for it, while this one's
  // waiters and watches are counted below. The page has a compare-and-swap of its own.
  struct devbuf__event_share *share = atomic_load(&event->share);
  if (share && !event->imported) devbuf__event_share_raised(share, value);
  uint64_t current = atomic_load_explicit(&event->value, memory_order_relaxed);
  while (value > current && !atomic_compare_exchange_weak(&event->value, &current, value)) {
  }
  // A first export may have come meanwhile. It sets `share` and then publishes the value, and
  // this raise stores the value and then reads `share` (all seq_cst): one of them publishes.
  if (!share && DEVBUF_UNLIKELY((share = atomic_load(&event->share)) != NULL))
    devbuf__event_share_raised(share, value);
  // Waits and watches count in before they look at the value.
  if (DEVBUF_UNLIKELY(atomic_load(&event->interest) != 0)) wake_interested(event, value);
}

// Off the lock-free path, so that it stays short.
__attribute__((noinline)) static void wake_interested(devbuf_event_t *event, uint64_t value) {
  devbuf__event_watch *reached = NULL;
  uint32_t called = 0;
  pthread_mutex_lock(&event->lock);
  if (event->waiters) pthread_cond_broadcast(&event->reached);
  for (devbuf__event_watch **link = &event->watches; *link;) {
    devbuf__event_watch *watch = *link;
    if (watch->value <= value) {
      *link = watch->next;
      watch->next = reached;
      reached = watch;
      called++;
    } else {
      link = &watch->next;
    }
  }
  if (called) atomic_fetch_sub(&event->interest, called);
  pthread_mutex_unlock(&event->lock);
  notify(reached, DEVBUF_OK); // outside the lock: a watch may call into a driver
}

void devbuf__event_fail(devbuf_event_t *event, devbuf_status status, const char *message) {
  // Messages come as devbuf_last_error() gives them, "NAME: ...": waits put the name of the
  // status in front again, so it is kept once.
  const char *name = devbuf_status_name(status);
  size_t length = strlen(name);
  if (strncmp(message, name, length) == 0 && message[length] == ':' && message[length + 1] == ' ')
    message += length + 2;
  pthread_mutex_lock(&event->lock);
  if (event->failure == DEVBUF_OK) {
    event->failure = status;
    atomic_store(&event->failed_at, atomic_load(&event->value));
    atomic_store(&event->failed, true);
    devbuf__join_message(event->message, sizeof event->message, "", message);
    if (event->share) devbuf__event_share_publish(event);
  }
  pthread_cond_broadcast(&event->reached);
  devbuf__event_watch *all = event->watches;
  event->watches = NULL;
  uint32_t called = 0;
  for (devbuf__event_watch *watch = all; watch; watch = watch->next) called++;
  if (called) atomic_fetch_sub(&event->interest, called);
  pthread_mutex_unlock(&event->lock);
  notify(all, event->failure);
}

void devbuf__event_interrupt(devbuf_event_t *event) {
  pthread_mutex_lock(&event->lock);
  pthread_cond_broadcast(&event->reached);
  pthread_mutex_unlock(&event->lock);
}

devbuf_status devbuf_event_signal(devbuf_event_t *event, uint64_t value) {
  if (!event) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "event is NULL");
  if (devbuf__event_is_imported(event)) return devbuf__event_signallable(event);
  if (DEVBUF_UNLIKELY(atomic_load(&event->failed))) {
    uint64_t failed_at = atomic_load(&event->failed_at);
    devbuf_status failure = devbuf_event_status(event); // its message, to put after ours
    return devbuf__error_cause(failure,
                               "signalling %llu: the event failed at %llu, and a value signalled "
                               "since counts for nothing",
                               (unsigned long long)value, (unsigned long long)failed_at);
  }
  uint64_t current = atomic_load_explicit(&event->value, memory_order_relaxed);
  if (value < current)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "event value %llu is below the current %llu: timelines only grow",
                         (unsigned long long)value, (unsigned long long)current);
  devbuf__event_raise(event, value);
  return DEVBUF_OK;
}

uint64_t devbuf_event_value(const devbuf_event_t *event) {
  if (!event) return 0;
  if (devbuf__event_is_imported(event)) devbuf__event_share_sync((devbuf_event_t *)event);
  // What was raised after a failure counts for nothing, here as for waits.
  uint64_t value = atomic_load_explicit(&event->value, memory_order_acquire);
  uint64_t failed_at = atomic_load_explicit(&event->failed_at, memory_order_acquire);
  return value < failed_at ? value : failed_at;
}

devbuf_status devbuf_event_status(const devbuf_event_t *event) {
  if (!event) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "event is NULL");
  devbuf_event_t *mutable_event = (devbuf_event_t *)event; // the lock is not part of the value
  if (devbuf__event_is_imported(event)) devbuf__event_share_sync(mutable_event);
  pthread_mutex_lock(&mutable_event->lock);
  devbuf_status status = event->failure;
  if (status != DEVBUF_OK) devbuf__error(status, "%s", event->message);
  pthread_mutex_unlock(&mutable_event->lock);
  return status;
}

devbuf_status devbuf__event_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns,
                                 const atomic_bool *cancel) {
  for (int spin = 0; spin < SPIN_CHECKS && timeout_ns; spin++) {
    if (devbuf__event_reached(event, value)) return DEVBUF_OK;
    devbuf__cpu_pause();
  }
  bool forever = timeout_ns == UINT64_MAX;
  struct timespec deadline = forever ? (struct timespec){0} : devbuf__deadline_after(timeout_ns);
  devbuf_status status = DEVBUF_OK;
  devbuf__wait_begins(); // after the spin: a round trip of events takes no locked addition
  pthread_mutex_lock(&event->lock);
  atomic_fetch_add(&event->interest, 1); // before the value: a raise after it takes the lock
  for (;;) {
    if (devbuf__event_reached(event, value)) break;
    if (event->failure != DEVBUF_OK) {
      status = devbuf__error(event->failure, "%s", event->message);
      break;
    }
    if (cancel && atomic_load(cancel)) {
      status = devbuf__error(DEVBUF_CANCELLED, "the wait for event value %llu was cancelled",
                             (unsigned long long)value);
      break;
    }
    if (event->waiters++ == 0 && devbuf__event_is_imported(event))
      devbuf__event_share_follow(event);
    int result = forever ? pthread_cond_wait(&event->reached, &event->lock)
                         : pthread_cond_timedwait(&event->reached, &event->lock, &deadline);
    event->waiters--;
    if (result == ETIMEDOUT && !devbuf__event_reached(event, value) &&
        event->failure == DEVBUF_OK) {
      status = devbuf__error(DEVBUF_TIMEOUT, "event stayed at %llu, below %llu, for %llu ns",
                             (unsigned long long)atomic_load(&event->value),
                             (unsigned long long)value, (unsigned long long)timeout_ns);
      break;
    }
  }
  atomic_fetch_sub(&event->interest, 1);
  pthread_mutex_unlock(&event->lock);
  devbuf__wait_ends();
  return status;
}

devbuf_status devbuf_event_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns) {
  if (!event) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "event is NULL");
  if (devbuf__event_is_imported(event)) {
    devbuf__settle_before_blocking();
    return devbuf__event_share_wait(event, value, timeout_ns);
  }
  if (devbuf__event_reached(event, value)) return DEVBUF_OK;
  if (timeout_ns == 0) {
    devbuf_status failed = devbuf_event_status(event);
    // A signal and then a failure may land between the look above and this one: a value
    // reached before the failure still counts.
    if (failed != DEVBUF_OK) return devbuf__event_reached(event, value) ? DEVBUF_OK : failed;
    return devbuf__error(DEVBUF_TIMEOUT, "event is at %llu, below %llu",
                         (unsigned long long)atomic_load(&event->value), (unsigned long long)value);
  }
  devbuf__settle_before_blocking();
  return devbuf__event_wait(event, value, timeout_ns, NULL);
}
