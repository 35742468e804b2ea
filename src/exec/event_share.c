// Events shared with other processes. The exporter keeps a page of shared memory beside the
// event: each raise and the failure are written there and wake the futex waits on it. The
// page is sealed so that importers can only map it to read: no importer can fake the
// exporter's value or failure for the others. An importer's event is an ordinary local event
// (so host waits, queue waits and failure work as ever) that a watcher thread keeps up with
// the page. The watcher also watches the exporting process through a pidfd the exporter sent:
// when the exporter dies, the event fails instead of leaving its waiters hanging. A pid lives
// on across exec, so the exporter also holds a lock on the page's file through a descriptor
// exec closes; the watcher asks after both.
//
// A raise wakes the page's futex only when someone sleeps on it. The sealed page cannot say
// so, so the export carries a second, small memory file that every importer maps to write:
// a waiter counts itself there before it sleeps. The exporter only ever reads that word, and
// a wrong count costs it at most a needless wake; a hostile importer that lowers it costs the
// other importers at most the slice they sleep anyway (LIVENESS_CHECK_NS), never a hang.
#include "queue.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#define TIMELINE_MAGIC    "devbufE2"
#define TIMELINE_BYTES    4096
#define SLEEPERS_BYTES    4096
#define LIVENESS_CHECK_NS 20000000u // how often a watcher asks whether the exporter lives
#define SPIN_CHECKS       2000      // as local waits spin before they sleep

// Importers read the page through a read-only mapping: a 64-bit atomic load must not write.
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "shared events need lock-free 64-bit atomics");

enum { TIMELINE_LIVE = 0, TIMELINE_FAILED = 1, TIMELINE_ENDED = 2 };

// Written by the exporter only.
typedef struct shared_timeline {
  char magic[8];
  _Atomic uint64_t value;
  _Atomic uint32_t changes; // the futex word: counts changes
  _Atomic uint32_t state;
  uint32_t failure; // its status, once FAILED (written before `state`)
  int32_t pid;
  char message[256];
} shared_timeline;

// Written by importers (and anyone they hand the descriptor to): the exporter trusts nothing
// in it but "nobody sleeps" when it reads 0.
typedef struct shared_sleepers {
  _Atomic uint32_t count; // waits asleep (or about to be) on the page's `changes`
} shared_sleepers;

typedef struct devbuf__event_share {
  shared_timeline *page;
  shared_sleepers *sleepers;
  bool imported;
  pid_t owner;      // the process that made this record: a forked child leaves it alone
  unsigned epoch;   // the owner's fork epoch: cheaper to compare than getpid() on each raise
  int fd;           // the page's memory file (exporter: duplicated for each export)
  int sleepers_fd;  // the sleepers' memory file (exporter: duplicated for each export)
  int alive;        // exporter: the page file locked through an open exec closes
  int process;      // importer: a pidfd of the exporter
  pid_t pid;        // importer: the exporter's pid
  atomic_bool stop; // importer: the watcher ends
  // Exporter: the page no longer LIVE. Raises read it here, not on the page: a read of the
  // page's line before the raise's write fetched the line from the spinning importer once
  // for the read and again for the write (docs/processes.md has the round trips).
  atomic_bool page_ended;
  // Importer: bumped when something in this process starts to wait on the local event (so
  // that the watcher, which sleeps while nothing does, follows every change again), when
  // the watcher fails the event, and to stop the watcher.
  _Atomic uint32_t pokes;
  pthread_t watcher;
  struct devbuf__event_share *next_exported; // exporter: under exported_lock
} devbuf__event_share;

// This process's exported events. A forked child must not keep their locked page descriptors
// (`alive`): the lock tells importers that the exporter lives, and a child that outlives an
// exec of its parent would keep it held, so waits for a process that is gone never end.
static pthread_mutex_t exported_lock = PTHREAD_MUTEX_INITIALIZER;
static devbuf__event_share *exported; // through next_exported

static void exported_fork_prepare(void) { pthread_mutex_lock(&exported_lock); }
static void exported_fork_parent(void) { pthread_mutex_unlock(&exported_lock); }
static void exported_fork_child(void) {
  // dup3 moves the number onto the page file itself, which holds no lock: the child lets go
  // of the locked file, and `alive` stays a close-on-exec descriptor of its own to close.
  for (devbuf__event_share *share = exported; share; share = share->next_exported)
    dup3(share->fd, share->alive, O_CLOEXEC);
  pthread_mutex_unlock(&exported_lock);
}
DEVBUF__FORK_HOOK(85, exported_fork_prepare, exported_fork_parent, exported_fork_child)

// Opens the share's locked page descriptor and lists it in one step under the list's lock:
// a fork waits for both, so no child copies the descriptor unlisted.
static devbuf_status open_alive_listed(devbuf__event_share *share) {
  pthread_mutex_lock(&exported_lock);
  devbuf_status status = devbuf__lock_reopened(share->fd, &share->alive);
  if (status == DEVBUF_OK) {
    share->next_exported = exported;
    exported = share;
  }
  pthread_mutex_unlock(&exported_lock);
  return status;
}

static void exported_remove(devbuf__event_share *share) {
  pthread_mutex_lock(&exported_lock);
  devbuf__event_share **at = &exported;
  while (*at && *at != share) at = &(*at)->next_exported;
  if (*at) *at = share->next_exported;
  pthread_mutex_unlock(&exported_lock);
}

devbuf_status devbuf__event_signallable(const devbuf_event_t *event) {
  if (!devbuf__event_is_imported(event)) return DEVBUF_OK;
  return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                       "the event is imported from process %d: only its exporting process "
                       "signals it",
                       (int)event->share->pid);
}

// Failure and the end are rare: they wake whoever sleeps, whatever the sleepers' word says.
static void page_changed(shared_timeline *page) {
  atomic_fetch_add(&page->changes, 1);
  devbuf__shared_wake(&page->changes);
}

// Raisers race without a lock. Each swaps its value in, and one that swapped out a higher
// value puts it back: the highest value is always on the page or with the raiser that puts it
// back, so the page ends at the highest. Meanwhile it may dip, which no importer sees as a
// fall: each keeps the highest value it read. A swap, not a read and a compare-and-swap: the
// read would fetch the line from the spinning importer before the write took it again (as
// `page_ended` says).
static void page_raise(shared_timeline *page, uint64_t value) {
  for (uint64_t swapped; (swapped = atomic_exchange(&page->value, value)) > value;) value = swapped;
}

static bool publishes(const devbuf__event_share *share) { // not a mirror, nor a forked child's copy
  return !share->imported && share->epoch == devbuf__epoch();
}

void devbuf__event_share_publish(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  if (!publishes(share)) return;
  shared_timeline *page = share->page;
  if (atomic_load(&share->page_ended)) return; // what importers saw last stays
  page_raise(page, atomic_load(&event->value));
  if (event->failure != DEVBUF_OK) {
    atomic_store(&share->page_ended, true);
    page->failure = (uint32_t)event->failure;
    devbuf__join_message(page->message, sizeof page->message, "", event->message);
    atomic_store(&page->state, TIMELINE_FAILED);
  }
  page_changed(page);
}

// The waker's half of the sleepers' protocol (sleep_on_page has the sleeper's): the value is
// stored before the sleepers' word is read, and a sleeper counts itself in before it reads the
// value again (all seq_cst). So either this read sees the sleeper, which is then woken, or the
// sleeper sees the value and does not sleep. With nobody asleep, a raise is one atomic
// operation on the page's line and a read of the sleepers': the change count, another
// operation on that line, moves only for sleepers.
void devbuf__event_share_raised(devbuf__event_share *share, uint64_t value) {
  if (!publishes(share)) return;
  if (atomic_load_explicit(&share->page_ended, memory_order_relaxed)) return;
  shared_timeline *page = share->page;
  page_raise(page, value);
  if (atomic_load(&share->sleepers->count) != 0) page_changed(page);
}

void devbuf__event_share_follow(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  atomic_fetch_add(&share->pokes, 1);
  devbuf__shared_wake(&share->pokes);
}

void devbuf__event_share_end(devbuf_event_t *event) {
  devbuf__event_share *share = event->share;
  bool own = share->epoch == devbuf__epoch(); // a forked child has no watcher, nor say on the page
  if (share->imported) {
    // Watch callbacks run on the watcher and never drop the event's last reference, so this
    // never runs there.
    if (own) {
      atomic_store(&share->stop, true);
      devbuf__event_share_follow(event);
      pthread_join(share->watcher, NULL);
    }
    close(share->process);
  } else {
    if (own) {
      atomic_store(&share->page_ended, true);
      uint32_t live = TIMELINE_LIVE;
      atomic_compare_exchange_strong(&share->page->state, &live, TIMELINE_ENDED);
      page_changed(share->page);
    }
    exported_remove(share);
    close(share->alive);
  }
  close(share->fd);
  close(share->sleepers_fd);
  munmap(share->page, TIMELINE_BYTES);
  munmap(share->sleepers, SLEEPERS_BYTES);
  devbuf__free(share);
}

// ---- the importer's side ----------------------------------------------------------------

// Brings the local event up to the page; true once the timeline has ended (failed or let go).
static bool mirror(devbuf_event_t *event, const devbuf__event_share *share) {
  const shared_timeline *page = share->page;
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
    snprintf(message, sizeof message, "process %d: %.*s", (int)share->pid,
             (int)sizeof page->message, page->message);
  } else {
    snprintf(message, sizeof message,
             "process %d released the event at %llu: nothing will signal it again", (int)share->pid,
             (unsigned long long)value);
  }
  devbuf__event_fail(event, status, message);
  return true;
}

void devbuf__event_share_sync(devbuf_event_t *event) { mirror(event, event->share); }

// Whether the exporting process still runs as the program that exported: its pidfd has not
// fired and its lock on the page file (dropped at exec) is held.
static bool exporter_alive(const devbuf__event_share *share) {
  return devbuf__process_alive(share->process) && devbuf__lease_held(share->fd);
}

// The exporter is gone: the event fails (after what it said last), and the host waits that
// sleep on the page hear of it. True when the event has ended.
static bool check_exporter(devbuf_event_t *event, devbuf__event_share *share) {
  if (exporter_alive(share)) return false;
  if (mirror(event, share)) return true; // its last words
  char message[160];
  snprintf(message, sizeof message, "process %d, which signals the event, ended at value %llu",
           (int)share->pid, (unsigned long long)atomic_load(&event->value));
  devbuf__event_fail(event, DEVBUF_UNAVAILABLE, message);
  devbuf__event_share_follow(event);
  return true;
}

// The local event's failure, if it has one (the watcher's or a mirror's verdict).
static bool local_failure(devbuf_event_t *event, devbuf_status *out) {
  pthread_mutex_lock(&event->lock);
  devbuf_status failure = event->failure;
  if (failure != DEVBUF_OK) *out = devbuf__error(failure, "%s", event->message);
  pthread_mutex_unlock(&event->lock);
  return failure != DEVBUF_OK;
}

// A host wait on an imported event watches the page itself: one wake from the signaller,
// not two (the watcher's, then its mirror's). It also wakes when the watcher pokes, so the
// exporter's death reaches it as soon as the watcher sees it.
// Whether the timeline has reached `value`, as this process saw it: the local event takes the
// page's value only upwards, so a hostile exporter that lowers the page never makes a value
// already reached look unreached.
static bool reached(devbuf_event_t *event, const shared_timeline *page, uint64_t value) {
  if (devbuf__event_reached(event, value)) return true;
  uint64_t local = atomic_load_explicit(&event->value, memory_order_acquire);
  uint64_t published = atomic_load_explicit(&page->value, memory_order_acquire);
  if (published > local) { // as devbuf__event_raise does for an import, without the call
    while (published > local && !atomic_compare_exchange_weak(&event->value, &local, published)) {
    }
    if (atomic_load(&event->interest) != 0) devbuf__event_raise(event, published);
  }
  return published >= value && value <= atomic_load(&event->failed_at);
}

// The sleeper's half of the protocol (devbuf__event_share_raised has the waker's): counted in
// before the value is read again, so a raise this read misses sees the sleeper, and moves the
// change count and wakes it. `seen` and `published` are the change count and the value the
// caller read before it looked at the value (in that order). Another importer may lower the
// count: the wait then ends with its slice, as it would if the exporter went quiet.
static void sleep_on_page(devbuf__event_share *share, uint32_t seen, uint64_t published,
                          uint32_t poked, uint64_t slice_ns) {
  shared_timeline *page = share->page;
  atomic_fetch_add(&share->sleepers->count, 1);
  if (atomic_load(&page->value) == published && atomic_load(&page->changes) == seen)
    devbuf__shared_wait_either(&page->changes, seen, &share->pokes, poked, slice_ns);
  atomic_fetch_sub(&share->sleepers->count, 1);
}

// The wait once spinning is over: kept out of the spin's function, whose frame then stays small.
__attribute__((noinline)) static devbuf_status wait_sleeping(devbuf_event_t *event, uint64_t value,
                                                             uint64_t timeout_ns) {
  devbuf__event_share *share = event->share;
  const shared_timeline *page = share->page;
  uint64_t start = devbuf__now_ns();
  unsigned waited_slices = 0;
  for (devbuf_status failed;;) {
    uint32_t seen = atomic_load(&page->changes), poked = atomic_load(&share->pokes);
    uint64_t published = atomic_load(&page->value);
    if (reached(event, page, value)) return DEVBUF_OK;
    if (atomic_load(&page->state) != TIMELINE_LIVE)
      mirror(event, share);
    else if (waited_slices++)
      check_exporter(event, share); // the watcher does too, if it runs
    // The failure may have come after the value (mirrored since the look above, here or by
    // the watcher): a value reached before it still counts.
    if (local_failure(event, &failed)) return reached(event, page, value) ? DEVBUF_OK : failed;
    uint64_t waited = devbuf__now_ns() - start;
    if (waited >= timeout_ns)
      return devbuf__error(DEVBUF_TIMEOUT, "event stayed at %llu, below %llu, for %llu ns",
                           (unsigned long long)atomic_load(&event->value),
                           (unsigned long long)value, (unsigned long long)timeout_ns);
    uint64_t slice =
        timeout_ns - waited < LIVENESS_CHECK_NS ? timeout_ns - waited : LIVENESS_CHECK_NS;
    sleep_on_page(share, seen, published, poked, slice);
  }
}

devbuf_status devbuf__event_share_wait(devbuf_event_t *event, uint64_t value, uint64_t timeout_ns) {
  const shared_timeline *page = event->share->page;
  for (int spin = 0; spin < SPIN_CHECKS && timeout_ns; spin++) {
    if (reached(event, page, value)) return DEVBUF_OK;
    devbuf__cpu_pause();
  }
  devbuf__wait_begins(); // what the other process waits for may be queued here
  devbuf_status status = wait_sleeping(event, value, timeout_ns);
  devbuf__wait_ends();
  return status;
}

// Whether something in this process waits on the local event (a queue's watch, a blocked
// wait): only then does the watcher wake for every change.
static bool followed(devbuf_event_t *event) { return atomic_load(&event->interest) != 0; }

static void *watch_timeline(void *context) {
  devbuf_event_t *event = context;
  devbuf__event_share *share = event->share;
  _Atomic uint32_t *changes = (_Atomic uint32_t *)&share->page->changes;
  for (;;) {
    // The words first: a poke after this load ends the wait below at once.
    uint32_t seen = atomic_load(changes), poked = atomic_load(&share->pokes);
    uint64_t published = atomic_load(&share->page->value);
    if (atomic_load(&share->stop) || mirror(event, share) || check_exporter(event, share)) break;
    if (followed(event))
      sleep_on_page(share, seen, published, poked, LIVENESS_CHECK_NS);
    else // until a wait begins, or to ask after the exporter again
      devbuf__shared_wait(&share->pokes, poked, LIVENESS_CHECK_NS);
  }
  return NULL;
}

// The export's page, mapped to read, if it is a timeline of the process `process` watches.
static devbuf_status map_timeline(const devbuf_export_t *shared, shared_timeline **out_page,
                                  pid_t *out_pid) {
  int fd = shared->fds[DEVBUF__EXPORT_MEMORY], process = shared->fds[DEVBUF__EXPORT_PROCESS];
  devbuf_status status = devbuf__memory_file_check(fd, TIMELINE_BYTES, "an imported event");
  if (status != DEVBUF_OK) return status;
  pid_t pid = shared->header.pid;
  int watched = 0; // -1 once reaped: the watcher then fails the event at once
  if (!devbuf__is_process_watch(process, &watched))
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "an imported event: its second descriptor does not watch the exporting "
                         "process %d (it is no process descriptor)",
                         (int)pid);
  if (watched > 0 && watched != pid)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "an imported event: its second descriptor does not watch the exporting "
                         "process %d (it watches %d)",
                         (int)pid, watched);
  shared_timeline *page = mmap(NULL, TIMELINE_BYTES, PROT_READ, MAP_SHARED, fd, 0);
  if (page == MAP_FAILED) { // short of memory, or a descriptor that cannot be read
    int error = errno;
    return devbuf__error(
        error == ENOMEM || error == EAGAIN ? DEVBUF_OUT_OF_MEMORY : DEVBUF_FORMAT_ERROR,
        "mapping an imported event's page (descriptor %d) to read failed: %s", fd, strerror(error));
  }
  if (memcmp(page->magic, TIMELINE_MAGIC, sizeof page->magic) != 0 || page->pid != pid) {
    bool magic = memcmp(page->magic, TIMELINE_MAGIC, sizeof page->magic) == 0;
    int claimed = (int)page->pid;
    munmap(page, TIMELINE_BYTES);
    if (magic)
      return devbuf__error(DEVBUF_FORMAT_ERROR,
                           "the imported event's page is not a devbuf timeline of process %d (it "
                           "names process %d)",
                           (int)pid, claimed);
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "the imported event's page is not a devbuf timeline of process %d (its "
                         "first bytes are not '%s')",
                         (int)pid, TIMELINE_MAGIC);
  }
  *out_page = page;
  *out_pid = pid;
  return DEVBUF_OK;
}

// The export's sleepers' word, mapped to write. Its sender can neither shrink the file under
// the mapping (sealed) nor make this process trust what it reads there.
static devbuf_status map_sleepers(const devbuf_export_t *shared, shared_sleepers **out) {
  int fd = shared->fds[DEVBUF__EXPORT_SLEEPERS];
  devbuf_status status = devbuf__memory_file_check(fd, SLEEPERS_BYTES, "an imported event");
  if (status != DEVBUF_OK) return status;
  shared_sleepers *sleepers = mmap(NULL, SLEEPERS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (sleepers == MAP_FAILED)
    return devbuf__error(DEVBUF_FORMAT_ERROR,
                         "an imported event: its sleepers' memory file cannot be mapped to "
                         "write: %s",
                         strerror(errno));
  *out = sleepers;
  return DEVBUF_OK;
}

devbuf_status devbuf_event_import(devbuf_export_t *shared, devbuf_event_t **out_event) {
  if (!shared || !out_event)
    return devbuf__null_argument("", "export, out_event", (const void *[]){shared, out_event});
  if (shared->header.kind != DEVBUF_EXPORT_EVENT)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "the export is a buffer, not an event");
  devbuf_status status = devbuf__export_claim(shared, "devbuf_event_import");
  if (status != DEVBUF_OK) return status;
  shared_timeline *page = NULL;
  shared_sleepers *sleepers = NULL;
  pid_t pid = 0;
  status = map_timeline(shared, &page, &pid);
  if (status == DEVBUF_OK) {
    status = map_sleepers(shared, &sleepers);
    if (status != DEVBUF_OK) munmap(page, TIMELINE_BYTES);
  }
  if (status != DEVBUF_OK) {
    devbuf__export_unclaim(shared);
    return status;
  }
  devbuf__event_share *share = devbuf__calloc(1, sizeof *share);
  devbuf_event_t *event = NULL;
  status = share ? devbuf_event_create(0, &event)
                 : devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to import an event");
  if (status == DEVBUF_OK) {
    *share = (devbuf__event_share){.page = page,
                                   .sleepers = sleepers,
                                   .imported = true,
                                   .owner = getpid(),
                                   .epoch = devbuf__epoch(),
                                   .fd = shared->fds[DEVBUF__EXPORT_MEMORY],
                                   .sleepers_fd = shared->fds[DEVBUF__EXPORT_SLEEPERS],
                                   .alive = -1,
                                   .process = shared->fds[DEVBUF__EXPORT_PROCESS],
                                   .pid = pid};
    atomic_init(&share->stop, false);
    atomic_init(&share->pokes, 0);
    event->share = share;
    event->imported = true;
    mirror(event, share); // waits see the value at once
    if (pthread_create(&share->watcher, NULL, watch_timeline, event) != 0) {
      event->share = NULL;
      event->imported = false;
      devbuf_event_release(event);
      status = devbuf__error(DEVBUF_OUT_OF_MEMORY, "no thread to watch an imported event");
    }
  }
  if (status != DEVBUF_OK) {
    munmap(page, TIMELINE_BYTES);
    munmap(sleepers, SLEEPERS_BYTES);
    devbuf__free(share);
    devbuf__export_unclaim(shared);
    return status;
  }
  devbuf__export_take_fd(shared, DEVBUF__EXPORT_MEMORY); // all the watcher's now
  devbuf__export_take_fd(shared, DEVBUF__EXPORT_PROCESS);
  devbuf__export_take_fd(shared, DEVBUF__EXPORT_SLEEPERS);
  devbuf__export_unclaim(shared);
  *out_event = event;
  return DEVBUF_OK;
}

// ---- the exporter's side ----------------------------------------------------------------

static devbuf_status share_for_export(devbuf_event_t *event, devbuf__event_share **out) {
  pthread_mutex_lock(&event->lock);
  devbuf__event_share *share = event->share;
  pthread_mutex_unlock(&event->lock);
  if (share) {
    *out = share;
    return share->owner == getpid()
               ? DEVBUF_OK
               : devbuf__error(DEVBUF_UNSUPPORTED,
                               "the event was exported by process %d, which this one forked "
                               "from: only that process publishes it",
                               (int)share->owner);
  }
  share = devbuf__calloc(1, sizeof *share);
  if (!share) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory to share an event");
  share->owner = getpid();
  share->epoch = devbuf__epoch();
  share->page = MAP_FAILED;
  share->sleepers = MAP_FAILED;
  share->fd = share->sleepers_fd = share->alive = -1;
  devbuf_status status = devbuf__memory_file_create("devbuf-event", TIMELINE_BYTES, &share->fd);
  if (status == DEVBUF_OK) {
    share->page = mmap(NULL, TIMELINE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, share->fd, 0);
    status = share->page == MAP_FAILED
                 ? devbuf__error(DEVBUF_OUT_OF_MEMORY, "mapping an event's shared page failed")
                 : devbuf__memory_file_seal(share->fd, true); // importers map it to read only
  }
  if (status == DEVBUF_OK) status = open_alive_listed(share);
  if (status == DEVBUF_OK)
    status =
        devbuf__memory_file_create("devbuf-event-sleepers", SLEEPERS_BYTES, &share->sleepers_fd);
  if (status == DEVBUF_OK) {
    share->sleepers =
        mmap(NULL, SLEEPERS_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, share->sleepers_fd, 0);
    // Importers map it to write; sealing the seals keeps any of them from sealing it against
    // the others' writable mappings.
    status = share->sleepers == MAP_FAILED
                 ? devbuf__error(DEVBUF_OUT_OF_MEMORY, "mapping an event's sleepers' word failed")
                 : devbuf__memory_file_seal(share->sleepers_fd, false);
  }
  if (status != DEVBUF_OK) {
    if (share->page != MAP_FAILED) munmap(share->page, TIMELINE_BYTES);
    if (share->sleepers != MAP_FAILED) munmap(share->sleepers, SLEEPERS_BYTES);
    exported_remove(share);
    devbuf__close_fds((int[]){share->fd, share->sleepers_fd, share->alive}, 3);
    devbuf__free(share);
    return status;
  }
  memcpy(share->page->magic, TIMELINE_MAGIC, sizeof share->page->magic);
  share->page->pid = (int32_t)share->owner;
  pthread_mutex_lock(&event->lock);
  devbuf__event_share *raced = event->share;
  if (!raced) {
    // seq_cst, as a lock-free raise's load of `share`: either that raise publishes to the
    // page, or this publish reads its value.
    atomic_store(&event->share, share);
    devbuf__event_share_publish(event); // what the event is now
  }
  pthread_mutex_unlock(&event->lock);
  if (raced) { // another thread exported it first
    munmap(share->page, TIMELINE_BYTES);
    munmap(share->sleepers, SLEEPERS_BYTES);
    exported_remove(share);
    devbuf__close_fds((int[]){share->fd, share->sleepers_fd, share->alive}, 3);
    devbuf__free(share);
    share = raced;
  }
  *out = share;
  return DEVBUF_OK;
}

devbuf_status devbuf_event_export(devbuf_event_t *event, devbuf_export_t **out_export) {
  if (!event || !out_export)
    return devbuf__null_argument("", "event, out_export", (const void *[]){event, out_export});
  if (devbuf__event_is_imported(event))
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "the event is imported: export it from the process that signals it");
  int process = devbuf__process_watch(getpid());
  int why = errno;
  if (process < 0 && (why == EMFILE || why == ENFILE)) {
    struct rlimit limit = {0};
    getrlimit(RLIMIT_NOFILE, &limit);
    return devbuf__error(
        DEVBUF_UNAVAILABLE,
        "no descriptor left for the event's pidfd: %s (this process may open %llu; "
        "close some, or raise RLIMIT_NOFILE)",
        why == EMFILE ? "the process has reached its limit of open descriptors"
                      : "the system's table of open files is full",
        (unsigned long long)limit.rlim_cur);
  }
  if (process < 0)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "no pidfd for this process (%s; Linux 5.3 and later have them): an "
                         "importer could not tell when it ends",
                         strerror(why));
  devbuf__event_share *share = NULL;
  devbuf_status status = share_for_export(event, &share);
  int fd = status == DEVBUF_OK ? fcntl(share->fd, F_DUPFD_CLOEXEC, 0) : -1;
  int sleepers = fd >= 0 ? fcntl(share->sleepers_fd, F_DUPFD_CLOEXEC, 0) : -1;
  if (status == DEVBUF_OK && sleepers < 0)
    status =
        devbuf__error(DEVBUF_IO_ERROR, "no descriptor for an event export: %s", strerror(errno));
  if (status != DEVBUF_OK) {
    devbuf__close_fds((int[]){process, fd}, 2);
    return status;
  }
  devbuf__export_header header = {.kind = DEVBUF_EXPORT_EVENT, .pid = (int32_t)getpid()};
  memcpy(header.magic, DEVBUF__EXPORT_MAGIC, sizeof header.magic);
  return devbuf__export_new(&header, (int[]){fd, process, sleepers}, out_export);
}
