// Events shared with other processes. The exporter keeps a page of shared memory beside the
// event: each raise and the failure are written there and wake the importers' futex waits.
// An importer's event is an ordinary local event (so host waits, queue waits and failure work
// as ever) that a watcher thread keeps up with the page. The watcher also watches the
// exporting process: when it dies, the event fails instead of leaving its waiters hanging.
#include "queue.h"

#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define TIMELINE_MAGIC    "devbufE1"
#define TIMELINE_BYTES    4096
#define LIVENESS_CHECK_NS 20000000u // how often a watcher asks whether the exporter lives

enum { TIMELINE_LIVE = 0, TIMELINE_FAILED = 1, TIMELINE_ENDED = 2 };

typedef struct shared_timeline {
  char magic[8];
  _Atomic uint64_t value;
  _Atomic uint32_t changes;  // the futex word: counts changes
  _Atomic uint32_t sleepers; // watchers asleep on `changes`
  _Atomic uint32_t state;
  uint32_t failure; // its status, once FAILED (written before `state`)
  int32_t pid;
  char message[256];
} shared_timeline;

typedef struct devbuf__event_share {
  shared_timeline *page;
  bool imported;
  int fd;           // exporter: the page's memory file, duplicated for each export
  int process;      // importer: a pidfd of the exporter (-1: ask by pid)
  atomic_bool stop; // importer: the watcher ends
  // Importer: bumped when something in this process starts to wait on the local event, so
  // that the watcher, which sleeps while nothing does, follows every change again.
  _Atomic uint32_t pokes;
  pthread_t watcher;
} devbuf__event_share;

bool devbuf__event_is_imported(const devbuf_event_t *event) {
  return event->share && event->share->imported;
}

static void page_changed(shared_timeline *page) {
  atomic_fetch_add(&page->changes, 1);
  if (atomic_load(&page->sleepers)) devbuf__shared_wake(&page->changes);
}

void devbuf__event_share_publish(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  if (share->imported) return; // the watcher's own mirroring
  shared_timeline *page = share->page;
  atomic_store(&page->value, atomic_load(&event->value));
  if (event->failure != DEVBUF_OK && atomic_load(&page->state) == TIMELINE_LIVE) {
    page->failure = (uint32_t)event->failure;
    memcpy(page->message, event->message, sizeof page->message);
    atomic_store(&page->state, TIMELINE_FAILED);
  }
  page_changed(page);
}

void devbuf__event_share_end(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  if (share->imported) {
    atomic_store(&share->stop, true);
    devbuf__shared_wake(&share->page->changes);
    devbuf__event_share_follow(event);
    pthread_join(share->watcher, NULL);
    if (share->process >= 0) close(share->process);
  } else {
    uint32_t live = TIMELINE_LIVE;
    atomic_compare_exchange_strong(&share->page->state, &live, TIMELINE_ENDED);
    page_changed(share->page);
    close(share->fd);
  }
  munmap(share->page, TIMELINE_BYTES);
  devbuf__free(share);
}

static bool mirror(devbuf_event_t *event, const shared_timeline *page);

void devbuf__event_share_follow(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  atomic_fetch_add(&share->pokes, 1);
  devbuf__shared_wake(&share->pokes);
}

void devbuf__event_share_sync(devbuf_event_t *event) { mirror(event, event->share->page); }

// The local event's failure, if it has one (the watcher's or a mirror's verdict).
static bool local_failure(devbuf_event_t *event, devbuf_status *out) {
  pthread_mutex_lock(&event->lock);
  devbuf_status failure = event->failure;
  if (failure != DEVBUF_OK) *out = devbuf__error(failure, "%s", event->message);
  pthread_mutex_unlock(&event->lock);
  return failure != DEVBUF_OK;
}

// A host wait on an imported event watches the page itself: one wake from the signaller,
// not two (the watcher's, then its mirror's). The watcher fails the local event when the
// exporter dies; the wait sees that within a slice.
devbuf_status devbuf__event_share_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns) {
  shared_timeline *page = event->share->page;
  for (int spin = 0; spin < 2000 && timeout_ns; spin++) {
    if (atomic_load_explicit(&page->value, memory_order_acquire) >= value) return DEVBUF_OK;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  uint64_t start = devbuf__now_ns();
  for (devbuf_status failed;;) {
    uint32_t seen = atomic_load(&page->changes);
    if (atomic_load_explicit(&page->value, memory_order_acquire) >= value) return DEVBUF_OK;
    if (atomic_load(&page->state) != TIMELINE_LIVE) mirror(event, page);
    if (local_failure(event, &failed)) return failed;
    uint64_t waited = devbuf__now_ns() - start;
    if (waited >= timeout_ns)
      return devbuf__error(DEVBUF_TIMEOUT, "event stayed at %llu, below %llu, for %llu ns",
                           (unsigned long long)atomic_load(&page->value), (unsigned long long)value,
                           (unsigned long long)timeout_ns);
    uint64_t slice =
        timeout_ns - waited < LIVENESS_CHECK_NS ? timeout_ns - waited : LIVENESS_CHECK_NS;
    atomic_fetch_add(&page->sleepers, 1);
    devbuf__shared_wait(&page->changes, seen, slice);
    atomic_fetch_sub(&page->sleepers, 1);
  }
}

// ---- export -------------------------------------------------------------------------------

static devbuf_status share_for_export(devbuf_event_t *event, devbuf__event_share **out) {
  pthread_mutex_lock(&event->lock);
  devbuf__event_share *share = event->share;
  pthread_mutex_unlock(&event->lock);
  if (share) {
    *out = share;
    return DEVBUF_OK;
  }
  share = devbuf__calloc(1, sizeof *share);
  if (!share) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to share an event");
  devbuf_status status = devbuf__memory_file_create("devbuf-event", TIMELINE_BYTES, &share->fd);
  if (status != DEVBUF_OK) {
    devbuf__free(share);
    return status;
  }
  share->page = mmap(NULL, TIMELINE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, share->fd, 0);
  if (share->page == MAP_FAILED) {
    close(share->fd);
    devbuf__free(share);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "mapping an event's shared page failed");
  }
  memcpy(share->page->magic, TIMELINE_MAGIC, sizeof share->page->magic);
  share->page->pid = (int32_t)getpid();
  pthread_mutex_lock(&event->lock);
  devbuf__event_share *raced = event->share;
  if (!raced) {
    event->share = share;
    devbuf__event_share_publish(event); // what the event is now
  }
  pthread_mutex_unlock(&event->lock);
  if (raced) { // another thread exported it first
    munmap(share->page, TIMELINE_BYTES);
    close(share->fd);
    devbuf__free(share);
    share = raced;
  }
  *out = share;
  return DEVBUF_OK;
}

devbuf_status devbuf_event_export(devbuf_event_t *event, devbuf_export_t **out_export) {
  if (!event || !out_export)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "event or out_export is NULL");
  *out_export = NULL;
  if (devbuf__event_is_imported(event))
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "the event is imported: export it from the process that signals it");
  devbuf__event_share *share = NULL;
  devbuf_status status = share_for_export(event, &share);
  if (status != DEVBUF_OK) return status;
  int fd = dup(share->fd);
  if (fd < 0) return devbuf__error(DEVBUF_IO_ERROR, "no descriptor for an event export");
  devbuf__export_header header = {.kind = DEVBUF_EXPORT_EVENT, .pid = (int32_t)getpid()};
  memcpy(header.magic, DEVBUF__EXPORT_MAGIC, sizeof header.magic);
  return devbuf__export_new(&header, fd, -1, out_export);
}

// ---- import -------------------------------------------------------------------------------

// Brings the local event up to the page; true once the timeline has ended (failed or let go).
static bool mirror(devbuf_event_t *event, const shared_timeline *page) {
  uint32_t state = atomic_load(&page->state);
  uint64_t value = atomic_load(&page->value);
  if (value > atomic_load(&event->value)) devbuf__event_raise(event, value);
  if (state == TIMELINE_LIVE) return false;
  char message[400];
  devbuf_status status = DEVBUF_CANCELLED;
  if (state == TIMELINE_FAILED) {
    uint32_t code = page->failure;
    status =
        code > DEVBUF_OK && code <= DEVBUF_CANCELLED ? (devbuf_status)code : DEVBUF_DEVICE_FAILURE;
    snprintf(message, sizeof message, "process %d: %.*s", (int)page->pid, (int)sizeof page->message,
             page->message);
  } else {
    snprintf(message, sizeof message,
             "process %d released the event at %llu: nothing will signal it again", (int)page->pid,
             (unsigned long long)value);
  }
  devbuf__event_fail(event, status, message);
  return true;
}

// Whether something in this process waits on the local event (a queue's watch, a blocked
// wait): only then does the watcher wake for every change.
static bool followed(devbuf_event_t *event) {
  pthread_mutex_lock(&event->lock);
  bool waited_on = event->watches || event->waiters;
  pthread_mutex_unlock(&event->lock);
  return waited_on;
}

static void *watch_timeline(void *context) {
  devbuf_event_t *event = context;
  devbuf__event_share *share = event->share;
  shared_timeline *page = share->page;
  while (!atomic_load(&share->stop)) {
    uint32_t seen = atomic_load(&page->changes), poked = atomic_load(&share->pokes);
    if (mirror(event, page)) break;
    if (!devbuf__process_alive(share->process, page->pid)) {
      if (mirror(event, page)) break; // its last words
      char message[160];
      snprintf(message, sizeof message, "process %d, which signals the event, ended at value %llu",
               (int)page->pid, (unsigned long long)atomic_load(&page->value));
      devbuf__event_fail(event, DEVBUF_UNAVAILABLE, message);
      break;
    }
    if (!followed(event)) { // until a wait begins, or to ask after the exporter again
      devbuf__shared_wait(&share->pokes, poked, LIVENESS_CHECK_NS);
      continue;
    }
    atomic_fetch_add(&page->sleepers, 1);
    devbuf__shared_wait(&page->changes, seen, LIVENESS_CHECK_NS);
    atomic_fetch_sub(&page->sleepers, 1);
  }
  return NULL;
}

devbuf_status devbuf_event_import(devbuf_export_t *shared, devbuf_event_t **out_event) {
  if (!shared || !out_event)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "export or out_event is NULL");
  *out_event = NULL;
  if (shared->header.kind != DEVBUF_EXPORT_EVENT)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "the export is a buffer, not an event");
  int fd = shared->fds[DEVBUF__EXPORT_MEMORY];
  if (fd < 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "this export was imported or sent already: each export is imported once");
  devbuf_status status = devbuf__memory_file_check(fd, TIMELINE_BYTES, "an imported event");
  if (status != DEVBUF_OK) return status;
  shared_timeline *page = mmap(NULL, TIMELINE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "mapping an imported event's page failed");
  if (memcmp(page->magic, TIMELINE_MAGIC, sizeof page->magic) != 0 ||
      page->pid != shared->header.pid) {
    munmap(page, TIMELINE_BYTES);
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "the imported event's page is not a devbuf timeline of process %d",
                         (int)shared->header.pid);
  }
  devbuf__event_share *share = devbuf__calloc(1, sizeof *share);
  devbuf_event_t *event = NULL;
  status = share ? devbuf_event_create(0, &event)
                 : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to import an event");
  if (status == DEVBUF_OK) {
    *share = (devbuf__event_share){.page = page, .imported = true, .fd = -1};
    share->process = page->pid == getpid() ? -1 : devbuf__process_watch(page->pid);
    atomic_init(&share->stop, false);
    event->share = share;
    mirror(event, page); // waits see the value at once
    if (pthread_create(&share->watcher, NULL, watch_timeline, event) != 0) {
      event->share = NULL;
      devbuf_event_release(event);
      if (share->process >= 0) close(share->process);
      status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no thread to watch an imported event");
    }
  }
  if (status != DEVBUF_OK) {
    munmap(page, TIMELINE_BYTES);
    devbuf__free(share);
    return status;
  }
  close(devbuf__export_take_fd(shared, DEVBUF__EXPORT_MEMORY));
  *out_event = event;
  return DEVBUF_OK;
}
