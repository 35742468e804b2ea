// Debug validators of the queues (a build with DEVBUF_DEBUG_CHECKS): what the worker takes
// and what it retires agree with the items' own records, and the counters add up. A broken
// invariant aborts with its name, before the damage spreads.
#include "queue.h"

#include <stdio.h>
#include <stdlib.h>

#if DEVBUF_DEBUG_CHECKS
__attribute__((noreturn)) static void broken(const char *what, const devbuf__work *work,
                                             size_t use) {
  fprintf(stderr, "devbuf: queue invariant broken: %s (item of kind %d, use %zu)\n", what,
          work ? (int)work->kind : -1, use);
  abort();
}

void devbuf__queue_validate_taken(const devbuf_queue_t *queue, devbuf__work *const *batch,
                                  size_t count) {
  for (size_t i = 0; i < count; i++) {
    const devbuf__work *work = batch[i];
    if (work->fence.queue != queue) broken("an item in another queue's FIFO", work, 0);
    if (atomic_load(&work->fence.done)) broken("an item taken to run is done already", work, 0);
    if (atomic_load(&work->fence.refs.count) == 0)
      broken("an item taken to run has no reference", work, 0);
    if ((unsigned)work->kind > DEVBUF__WORK_HOST) broken("an item of no known kind", work, 0);
    if (work->status != DEVBUF_OK) broken("an item taken to run has a status already", work, 0);
    for (size_t u = 0; u < work->use_count; u++) {
      const devbuf__work_use *use = &work->uses[u];
      const devbuf__operand *operand = &devbuf__work_operands(work)[u];
      if (!use->record.segment) {
        if (operand->size) broken("a use with bytes is tracked by no record", work, u);
        continue;
      }
      if (devbuf__record_fence(&use->record) != &work->fence)
        broken("a use is tracked by another item's record", work, u);
      if (use->record.offset != operand->offset || use->record.size != operand->size)
        broken("a use's record covers other bytes than its operand", work, u);
    }
  }
  if (atomic_load(&queue->completed) + count > atomic_load(&queue->submitted))
    broken("more items taken and retired than were submitted", NULL, 0);
}

void devbuf__queue_validate_retiring(const devbuf_queue_t *queue, devbuf__work *const *items,
                                     size_t count) {
  for (size_t i = 0; i < count; i++) {
    const devbuf__work *work = items[i];
    if (work->fence.queue != queue) broken("a queue retires another queue's item", work, 0);
    if (atomic_load(&work->fence.done)) broken("an item retires twice", work, 0);
    for (size_t u = 0; u < work->use_count; u++)
      if (work->uses[u].record.segment)
        broken("a retiring item's use still has its record in a tracker", work, u);
    if (work->dep_count && work->status == DEVBUF_OK)
      broken("an item that ran still holds the work it depended on", work, 0);
  }
  if (atomic_load(&queue->completed) + count > atomic_load(&queue->submitted))
    broken("more items retire than were submitted", NULL, 0);
}
#endif
