// The hazard tracker: records of in-flight uses, grouped by queue, and conflict checks.
#include "hazard.h"

#include <stdio.h>
#include <stdlib.h>

devbuf__hazard *devbuf__hazard_create(void) {
  devbuf__hazard *hazard = devbuf__calloc(1, sizeof *hazard);
  if (!hazard) return NULL;
  atomic_init(&hazard->lock.held, false);
  devbuf__mutex_init(&hazard->sleep_lock);
  pthread_cond_init(&hazard->progress, NULL);
  return hazard;
}

void devbuf__hazard_destroy(devbuf__hazard *hazard) {
  if (!hazard) return;
  while (hazard->segments) { // no records are left when the tracker goes
    devbuf__segment *next = hazard->segments->next;
    devbuf__free(hazard->segments);
    hazard->segments = next;
  }
  pthread_cond_destroy(&hazard->progress);
  pthread_mutex_destroy(&hazard->sleep_lock);
  devbuf__free(hazard);
}

static bool overlaps(const devbuf__record *record, size_t offset, size_t size) {
  return size && record->offset < offset + size && offset < record->offset + record->size;
}

// The newest record of `list` that overlaps [offset, offset + size), or NULL.
static const devbuf__record *newest_overlap(const devbuf__record_list *list, size_t offset,
                                            size_t size) {
  if (!list->count || list->high <= offset || offset + size <= list->low) return NULL;
  for (const devbuf__record *record = list->newest; record; record = record->older)
    if (overlaps(record, offset, size)) return record;
  return NULL;
}

// Whether a record of `list` that overlaps the range belongs to work that may still run here.
// Host accesses ask this: in a forked child the parent's records never retire, and its
// work counts as done (devbuf__fence_done), so they must not wait for it.
static bool pending_overlap(const devbuf__record_list *list, size_t offset, size_t size) {
  if (!list->count || list->high <= offset || offset + size <= list->low) return false;
  for (const devbuf__record *record = list->newest; record; record = record->older)
    if (overlaps(record, offset, size) && !devbuf__fence_done(devbuf__record_fence(record)))
      return true;
  return false;
}

bool devbuf__hazard_conflicts(const devbuf__hazard *hazard, size_t offset, size_t size,
                              bool write) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next)
    if (pending_overlap(&segment->writes, offset, size) ||
        (write && pending_overlap(&segment->reads, offset, size)))
      return true;
  return false;
}

bool devbuf__hazard_queue_conflicts(const devbuf__hazard *hazard, const devbuf_queue_t *queue,
                                    size_t offset, size_t size, bool write) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next)
    if (segment->queue == queue && (pending_overlap(&segment->writes, offset, size) ||
                                    (write && pending_overlap(&segment->reads, offset, size))))
      return true;
  return false;
}

bool devbuf__hazard_overlaps(const devbuf__hazard *hazard, size_t offset, size_t size) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next)
    if (pending_overlap(&segment->writes, offset, size) ||
        pending_overlap(&segment->reads, offset, size))
      return true;
  return false;
}

void devbuf__hazard_wait_progress(devbuf__hazard *hazard) {
  // The sleep lock is taken before the tracker's lock is given back: a remover, which takes
  // it to broadcast once it holds the tracker's lock, cannot broadcast before this sleeps.
  devbuf__wait_begins(); // takes queues' locks, which no holder keeps while it takes this one
  hazard->waiters++;
  pthread_mutex_lock(&hazard->sleep_lock);
  devbuf__spin_unlock(&hazard->lock);
  pthread_cond_wait(&hazard->progress, &hazard->sleep_lock);
  pthread_mutex_unlock(&hazard->sleep_lock);
  devbuf__spin_lock(&hazard->lock);
  hazard->waiters--;
  devbuf__wait_ends();
}

void devbuf__hazard_wake_locked(devbuf__hazard *hazard) {
  if (!hazard->waiters) return;
  pthread_mutex_lock(&hazard->sleep_lock);
  pthread_cond_broadcast(&hazard->progress);
  pthread_mutex_unlock(&hazard->sleep_lock);
}

bool devbuf__deps_push(devbuf__dep **deps, uint32_t *count, uint32_t *capacity, devbuf__fence *work,
                       bool order_only) {
  for (uint32_t i = 0; i < *count; i++) {
    if ((*deps)[i].work == work) {
      (*deps)[i].order_only &= order_only; // a data dependency through any use is one
      return true;
    }
  }
  if (*count == *capacity) {
    if (*capacity > UINT32_MAX / 2) return false; // as no memory: each is another queue's work
    uint32_t grown_capacity = *capacity ? 2 * *capacity : 8;
    devbuf__dep *grown = devbuf__malloc(grown_capacity * sizeof *grown);
    if (!grown) return false;
    for (uint32_t i = 0; i < *count; i++) grown[i] = (*deps)[i];
    devbuf__free(*deps);
    *deps = grown;
    *capacity = grown_capacity;
  }
  (*deps)[(*count)++] = (devbuf__dep){devbuf__fence_retain(work), order_only};
  return true;
}

bool devbuf__fences_push(devbuf__fence ***works, size_t *count, size_t *capacity,
                         devbuf__fence *work) {
  for (size_t i = 0; i < *count; i++)
    if ((*works)[i] == work) return true;
  if (*count == *capacity) {
    size_t grown_capacity = *capacity ? 2 * *capacity : 4;
    devbuf__fence **grown = devbuf__malloc(grown_capacity * sizeof *grown);
    if (!grown) return false;
    for (size_t i = 0; i < *count; i++) grown[i] = (*works)[i];
    devbuf__free(*works);
    *works = grown;
    *capacity = grown_capacity;
  }
  (*works)[(*count)++] = devbuf__fence_retain(work);
  return true;
}

bool devbuf__hazard_collect(const devbuf__hazard *hazard, size_t offset, size_t size,
                            devbuf__fence ***works, size_t *count, size_t *capacity) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next) {
    const devbuf__record *newest[2] = {newest_overlap(&segment->writes, offset, size),
                                       newest_overlap(&segment->reads, offset, size)};
    for (int k = 0; k < 2; k++)
      if (newest[k] &&
          !devbuf__fences_push(works, count, capacity, devbuf__record_fence(newest[k])))
        return false;
  }
  return true;
}

// Empty segments stay (the same queue usually comes back, and a segment made and freed for
// every burst of work would cost an allocation each time) until a new queue needs one: it
// takes an empty one over (its queue may be gone; a queue never compares an empty segment's
// records). The list stays as long as the number of queues with work in flight, plus one.
// ---- debug validation (DEVBUF_DEBUG_CHECKS) ---------------------------------------------------

#if DEVBUF_DEBUG_CHECKS
__attribute__((noreturn)) static void broken(const char *what, const devbuf__record *record) {
  fprintf(stderr, "devbuf: hazard tracker invariant broken: %s (record at bytes %zu + %zu)\n", what,
          record ? record->offset : 0, record ? record->size : 0);
  abort();
}

static size_t validate_list(const devbuf__segment *segment, const devbuf__record_list *list,
                            bool write) {
  size_t count = 0;
  const devbuf__record *newer = NULL;
  for (const devbuf__record *r = list->newest; r; newer = r, r = r->older) {
    if (++count > list->count) broken("a record list is longer than its count", r);
    if (r->newer != newer) broken("a record's newer link does not point back", r);
    if (r->segment != segment || r->write != write)
      broken("a record sits in another queue's or kind's list", r);
    if (!r->fence_distance || devbuf__record_fence(r)->queue != segment->queue)
      broken("a record's work is not of its list's queue", r);
    if (r->offset < list->low || r->offset + r->size > list->high ||
        r->offset + r->size < r->offset)
      broken("a record lies outside the range its list covers", r);
  }
  if (count != list->count) broken("a record list is shorter than its count", NULL);
  return count;
}

// Every list agrees with its count, links and covered range; the counts add up. Every
// change while few records are in flight, every 64th beyond. Caller holds the lock.
static void debug_validate(devbuf__hazard *hazard) {
  if (hazard->records >= 64 && (++hazard->debug_steps & 63) != 0) return;
  size_t total = 0;
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next) {
    if (segment->hazard != hazard) broken("a segment of another tracker", NULL);
    total += validate_list(segment, &segment->reads, false) +
             validate_list(segment, &segment->writes, true);
    if (segment->reads.count + segment->writes.count)
      for (const devbuf__segment *other = segment->next; other; other = other->next)
        if (other->queue == segment->queue && other->reads.count + other->writes.count)
          broken("two record lists of one queue",
                 segment->reads.newest ? segment->reads.newest : segment->writes.newest);
  }
  if (total != hazard->records) broken("the tracker's record count differs from its lists", NULL);
}
#else
static inline void debug_validate(devbuf__hazard *hazard) { (void)hazard; }
#endif

static devbuf__segment *take_empty_segment(devbuf__hazard *hazard) {
  devbuf__segment **taken = NULL;
  for (devbuf__segment **link = &hazard->segments; *link; link = &(*link)->next)
    if ((*link)->reads.count + (*link)->writes.count == 0) taken = link;
  if (!taken) return NULL;
  devbuf__segment *segment = *taken;
  *taken = segment->next;
  *segment = (devbuf__segment){.hazard = hazard};
  return segment;
}

bool devbuf__hazard_add(devbuf__hazard *hazard, devbuf__record *record, devbuf_queue_t *queue,
                        devbuf__dep **deps, uint32_t *dep_count, uint32_t *dep_capacity) {
  devbuf__segment *own = NULL;
  for (devbuf__segment *segment = hazard->segments; segment; segment = segment->next) {
    if (segment->queue == queue) {
      own = segment; // same queue: already ordered
      continue;
    }
    const devbuf__record *write = newest_overlap(&segment->writes, record->offset, record->size);
    const devbuf__record *read =
        record->write ? newest_overlap(&segment->reads, record->offset, record->size) : NULL;
    if (write &&
        !devbuf__deps_push(deps, dep_count, dep_capacity, devbuf__record_fence(write), false))
      return false;
    if (read &&
        !devbuf__deps_push(deps, dep_count, dep_capacity, devbuf__record_fence(read), false))
      return false;
  }
  if (!own) {
    own = take_empty_segment(hazard);
    if (!own) own = devbuf__calloc(1, sizeof *own);
    if (!own) return false;
    own->hazard = hazard;
    own->queue = queue;
    own->next = hazard->segments;
    hazard->segments = own;
  }
  devbuf__record_list *list = record->write ? &own->writes : &own->reads;
  if (list->count == 0 || record->offset < list->low) list->low = record->offset;
  if (list->count == 0 || record->offset + record->size > list->high)
    list->high = record->offset + record->size;
  record->segment = own;
  record->older = list->newest;
  record->newer = NULL;
  if (list->newest) list->newest->newer = record;
  list->newest = record;
  list->count++;
  hazard->records++;
  debug_validate(hazard);
  return true;
}

void devbuf__hazard_remove_locked(devbuf__hazard *hazard, devbuf__record *record,
                                  void (**out_on_idle)(void *), void **out_idle_ctx) {
  debug_validate(hazard);
  devbuf__segment *segment = record->segment;
  devbuf__record_list *list = record->write ? &segment->writes : &segment->reads;
  if (record->newer)
    record->newer->older = record->older;
  else
    list->newest = record->older;
  if (record->older) record->older->newer = record->newer;
  record->segment = NULL;
  list->count--;
  if (--hazard->records == 0 && hazard->on_idle) {
    *out_on_idle = hazard->on_idle;
    *out_idle_ctx = hazard->idle_ctx;
    hazard->on_idle = NULL;
  }
}

void devbuf__hazard_remove(devbuf__hazard *hazard, devbuf__record *record) {
  void (*on_idle)(void *) = NULL;
  void *idle_ctx = NULL;
  devbuf__spin_lock(&hazard->lock);
  devbuf__hazard_remove_locked(hazard, record, &on_idle, &idle_ctx);
  devbuf__hazard_wake_locked(hazard);
  devbuf__spin_unlock(&hazard->lock);
  if (on_idle) on_idle(idle_ctx); // may destroy the hazard
}
