// The hazard tracker: records of in-flight uses, grouped by queue, and conflict checks.
#include "hazard.h"

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
static const devbuf__record *newest_overlap(const devbuf__record_list *list, size_t offset, size_t size) {
  if (!list->count || list->high <= offset || offset + size <= list->low) return NULL;
  for (const devbuf__record *record = list->newest; record; record = record->older)
    if (overlaps(record, offset, size)) return record;
  return NULL;
}

bool devbuf__hazard_conflicts(const devbuf__hazard *hazard, size_t offset, size_t size, bool write) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next)
    if (newest_overlap(&segment->writes, offset, size) || (write && newest_overlap(&segment->reads, offset, size)))
      return true;
  return false;
}

bool devbuf__hazard_overlaps(const devbuf__hazard *hazard, size_t offset, size_t size) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next)
    if (newest_overlap(&segment->writes, offset, size) || newest_overlap(&segment->reads, offset, size)) return true;
  return false;
}

void devbuf__hazard_wait_progress(devbuf__hazard *hazard) {
  // The sleep lock is taken before the tracker's lock is given back: a remover, which takes
  // it to broadcast once it holds the tracker's lock, cannot broadcast before this sleeps.
  hazard->waiters++;
  pthread_mutex_lock(&hazard->sleep_lock);
  devbuf__spin_unlock(&hazard->lock);
  pthread_cond_wait(&hazard->progress, &hazard->sleep_lock);
  pthread_mutex_unlock(&hazard->sleep_lock);
  devbuf__spin_lock(&hazard->lock);
  hazard->waiters--;
}

void devbuf__hazard_wake_locked(devbuf__hazard *hazard) {
  if (!hazard->waiters) return;
  pthread_mutex_lock(&hazard->sleep_lock);
  pthread_cond_broadcast(&hazard->progress);
  pthread_mutex_unlock(&hazard->sleep_lock);
}

bool devbuf__deps_push(devbuf__dep **deps, size_t *count, size_t *capacity, devbuf__fence *work, bool order_only) {
  for (size_t i = 0; i < *count; i++) {
    if ((*deps)[i].work == work) {
      (*deps)[i].order_only &= order_only; // a data dependency through any use is one
      return true;
    }
  }
  if (*count == *capacity) {
    size_t grown_capacity = *capacity ? 2 * *capacity : 8;
    devbuf__dep *grown = devbuf__malloc(grown_capacity * sizeof *grown);
    if (!grown) return false;
    for (size_t i = 0; i < *count; i++) grown[i] = (*deps)[i];
    devbuf__free(*deps);
    *deps = grown;
    *capacity = grown_capacity;
  }
  (*deps)[(*count)++] = (devbuf__dep){devbuf__fence_retain(work), order_only};
  return true;
}

bool devbuf__hazard_collect(const devbuf__hazard *hazard, size_t offset, size_t size, devbuf__fence ***works,
                            size_t *count, size_t *capacity) {
  for (const devbuf__segment *segment = hazard->segments; segment; segment = segment->next) {
    const devbuf__record *newest[2] = {newest_overlap(&segment->writes, offset, size),
                                       newest_overlap(&segment->reads, offset, size)};
    for (int k = 0; k < 2; k++) {
      if (!newest[k]) continue;
      devbuf__fence *work = newest[k]->work;
      bool known = false;
      for (size_t i = 0; i < *count && !known; i++) known = (*works)[i] == work;
      if (known) continue;
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
    }
  }
  return true;
}

// Empty segments stay (the same queue usually comes back, and a segment made and freed for
// every burst of work would cost an allocation each time) until a new queue needs one: it
// takes an empty one over (its queue may be gone; a queue never compares an empty segment's
// records). The list stays as long as the number of queues with work in flight, plus one.
static devbuf__segment *take_empty_segment(devbuf__hazard *hazard) {
  devbuf__segment **taken = NULL;
  for (devbuf__segment **link = &hazard->segments; *link; link = &(*link)->next)
    if ((*link)->reads.count + (*link)->writes.count == 0) taken = link;
  if (!taken) return NULL;
  devbuf__segment *segment = *taken;
  *taken = segment->next;
  *segment = (devbuf__segment){.queue = NULL};
  return segment;
}

bool devbuf__hazard_add(devbuf__hazard *hazard, devbuf__record *record, devbuf_queue_t *queue, devbuf__dep **deps,
                        size_t *dep_count, size_t *dep_capacity) {
  devbuf__segment *own = NULL;
  for (devbuf__segment *segment = hazard->segments; segment; segment = segment->next) {
    if (segment->queue == queue) {
      own = segment; // same queue: already ordered
      continue;
    }
    const devbuf__record *write = newest_overlap(&segment->writes, record->offset, record->size);
    const devbuf__record *read = record->write ? newest_overlap(&segment->reads, record->offset, record->size) : NULL;
    if (write && !devbuf__deps_push(deps, dep_count, dep_capacity, write->work, false)) return false;
    if (read && !devbuf__deps_push(deps, dep_count, dep_capacity, read->work, false)) return false;
  }
  if (!own) {
    own = take_empty_segment(hazard);
    if (!own) own = devbuf__calloc(1, sizeof *own);
    if (!own) return false;
    own->queue = queue;
    own->next = hazard->segments;
    hazard->segments = own;
  }
  devbuf__record_list *list = record->write ? &own->writes : &own->reads;
  if (list->count == 0 || record->offset < list->low) list->low = record->offset;
  if (list->count == 0 || record->offset + record->size > list->high) list->high = record->offset + record->size;
  record->segment = own;
  record->older = list->newest;
  record->newer = NULL;
  if (list->newest) list->newest->newer = record;
  list->newest = record;
  list->count++;
  hazard->records++;
  return true;
}

void devbuf__hazard_remove_locked(devbuf__hazard *hazard, devbuf__record *record, void (**out_on_idle)(void *),
                                  void **out_idle_ctx) {
  devbuf__segment *segment = record->segment;
  devbuf__record_list *list = record->write ? &segment->writes : &segment->reads;
  if (record->newer)
    record->newer->older = record->older;
  else
    list->newest = record->older;
  if (record->older) record->older->newer = record->newer;
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
