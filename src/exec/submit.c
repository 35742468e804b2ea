// Submission: checks every use, records it in the memory's hazard tracker (collecting the
// work of other queues that the item must wait for), then queues the item, or refuses it
// whole.
#include "queue.h"

#include <string.h>

// Rolls back the records of uses [0, count) of a work item that will not be queued. (The
// submission lock keeps other submissions from having seen them; done is set anyway, so
// that nothing could ever wait for this item.)
static void abandon(devbuf__work *work, size_t count) {
  for (size_t i = 0; i < count; i++) {
    devbuf__hazard *hazard = devbuf__work_use_hazard(&work->uses[i]);
    if (hazard) devbuf__hazard_remove(hazard, &work->uses[i].record);
  }
  atomic_store(&work->fence.done, true);
  devbuf__work_release(work);
}

static devbuf_status check_use(devbuf_queue_t *queue, const devbuf_use_t *use, size_t index) {
  if (!use->buffer) return devbuf__error(DEVBUF_INVALID_ARGUMENT, "use %zu has no buffer", index);
  if (use->access < DEVBUF_ACCESS_READ || use->access > DEVBUF_ACCESS_READ_WRITE)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "use %zu has access %d (expected 1 read, 2 write, 3 both)", index,
                         (int)use->access);
  devbuf__storage *storage = use->buffer->storage;
  if (storage->device != queue->device)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "use %zu: a buffer on %s submitted to a queue on %s", index,
                         storage->device->spec, queue->device->spec);
  if ((use->access & DEVBUF_ACCESS_WRITE) && storage->read_only)
    return devbuf__error(DEVBUF_READ_ONLY, "use %zu writes read-only buffer %llu", index,
                         (unsigned long long)use->buffer->handle_id);
  return devbuf__storage_ensure_allocated_for_work(storage);
}

// Records use `index` of `work`; HOST_ACCESS_OPEN if an open host access races with it.
static devbuf_status track_use(devbuf__work *work, size_t index, const devbuf_use_t *use) {
  devbuf_buffer_t *buffer = use->buffer;
  devbuf__storage *storage = buffer->storage;
  devbuf__record *record = &work->uses[index].record; // its segment and distance are set
  if (work->kind == DEVBUF__WORK_KERNEL || work->kind == DEVBUF__WORK_HOST) {
    devbuf__work_data(work)[index] =
        buffer->size && storage->memory.host ? (char *)storage->memory.host + buffer->offset : NULL;
    devbuf__work_sizes(work)[index] = buffer->size;
  }
  devbuf__work_operands(work)[index] = (devbuf__operand){
      storage->memory, buffer->offset, buffer->size, devbuf__storage_kind_of(storage)->file_backed};
  if (buffer->size == 0) return DEVBUF_OK; // touches no bytes: nothing to order
  record->offset = buffer->offset;
  record->size = buffer->size;
  record->write = (use->access & DEVBUF_ACCESS_WRITE) != 0;
  return devbuf__storage_track_use(storage, record, &work->deps, &work->dep_count,
                                   &work->dep_capacity);
}

// Validates and records every use, then queues the item (or refuses it whole).
static devbuf_status submit(devbuf_queue_t *queue, devbuf__work *work, const devbuf_use_t *uses) {
  // A failure is checked again under the lock before the item is queued.
  devbuf_status status = atomic_load_explicit(&queue->failed, memory_order_relaxed)
                             ? devbuf_queue_status(queue)
                             : devbuf__queue_check_process(queue, "submit");
  // Backpressure before anything is allocated or recorded for the item.
  if (status == DEVBUF_OK && DEVBUF_UNLIKELY(devbuf__queue_may_be_full(queue)))
    status = devbuf__queue_wait_room(queue);
  for (size_t i = 0; i < work->use_count && status == DEVBUF_OK; i++)
    status = check_use(queue, &uses[i], i);
  if (status != DEVBUF_OK) {
    abandon(work, 0);
    return status;
  }
  // One submission at a time per device, from the first record to the enqueue: then the
  // records of a queue are in queue order, and no two submissions can each find the other's
  // records and wait for each other.
  devbuf_device_t *device = queue->device;
  devbuf__spin_lock(&device->submit_lock);
  if (DEVBUF_UNLIKELY(!devbuf__fifo_room(&queue->fifo_in, &queue->fifo_out))) {
    abandon(work, 0);
    devbuf__spin_unlock(&device->submit_lock);
    return devbuf__error(DEVBUF_OUT_OF_MEMORY,
                         "submit: no host memory for the queue's list of items");
  }
  size_t tracked = 0;
  for (; tracked < work->use_count && status == DEVBUF_OK; tracked++)
    status = track_use(work, tracked, &uses[tracked]);
  if (status != DEVBUF_OK) {
    abandon(work, tracked);
    devbuf__spin_unlock(&device->submit_lock);
    return status;
  }
  if (atomic_load(&queue->failed)) { // failed while we were recording (after that, the worker fails
                                     // the item)
    status = devbuf_queue_status(queue);
    abandon(work, tracked);
    devbuf__spin_unlock(&device->submit_lock);
    return status;
  }
  atomic_store_explicit(&device->work_submitted,
                        atomic_load_explicit(&device->work_submitted, memory_order_relaxed) + 1,
                        memory_order_relaxed); // ordered before the push by its seq_cst store
  atomic_store_explicit(&queue->submitted,
                        atomic_load_explicit(&queue->submitted, memory_order_relaxed) + 1,
                        memory_order_relaxed); // every submitter holds the submission lock
  devbuf__fifo_push(&queue->fifo_in, work);    // the runner may take it from here on
  devbuf__spin_unlock(&device->submit_lock);
  // The time of the first submission to a worker without work, for the finish that may come
  // soon after it (queue.c, note_finish). Then one wake per sleep, and none while the worker
  // dozes (queue.c, wait_for_work). A submission that finds the wake sent pushed before it
  // looked, and the worker clears the flag before each time it reads the FIFO (all
  // sequentially consistent): the worker finds this item when it next looks. The one that
  // sends it takes the lock, so the signal comes once the worker waits.
  bool idle = atomic_load(&queue->worker_idle);
  if ((idle || atomic_load_explicit(&queue->worker_spinning, memory_order_relaxed)) &&
      !atomic_load_explicit(&queue->submitted_to_idle_at, memory_order_relaxed))
    atomic_store_explicit(&queue->submitted_to_idle_at, devbuf__now_ns(), memory_order_relaxed);
  if (idle) {
    if (!atomic_load(&queue->dozing) && !atomic_load(&queue->wake_sent) &&
        !atomic_exchange(&queue->wake_sent, true)) { // a read first: no locked write in a burst
      pthread_mutex_lock(&queue->lock);
      pthread_cond_signal(&queue->work_available);
      pthread_mutex_unlock(&queue->lock);
    }
  }
  return DEVBUF_OK;
}

// Counts past what one item holds (queue.h), refused naming the values.
static devbuf_status check_item_counts(const char *what, size_t use_count, size_t scalars_size) {
  if (use_count > DEVBUF__WORK_MAX_USES)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: %zu uses; one work item takes at most %zu",
                         what, use_count, DEVBUF__WORK_MAX_USES);
  if (scalars_size > DEVBUF__WORK_MAX_SCALARS)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "%s: %zu bytes of scalars; one work item takes at most %zu", what,
                         scalars_size, DEVBUF__WORK_MAX_SCALARS);
  return DEVBUF_OK;
}

// A C function over `uses` with its scalars copied: a CPU kernel, or host work (which any
// queue runs).
static inline devbuf_status submit_function(devbuf_queue_t *queue, devbuf__work_kind kind,
                                            devbuf_cpu_kernel_fn function, const devbuf_use_t *uses,
                                            size_t use_count, const void *scalars,
                                            size_t scalars_size) {
  bool host = kind == DEVBUF__WORK_HOST;
  const char *what = host ? "host_task" : "submit", *role = host ? "task" : "kernel";
  if (!queue || !function || (use_count && !uses) || (scalars_size && !scalars)) {
    const char *missing = !queue      ? "the queue is NULL"
                          : !function ? (host ? "the task is NULL" : "the kernel is NULL")
                          : (use_count && !uses) ? "uses is NULL"
                                                 : "scalars is NULL";
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "%s: %s (%zu uses, %zu scalar bytes)", what,
                         missing, use_count, scalars_size);
  }
  if (!host && !queue->device->backend->runs_c_kernels)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "submit: C kernels run on the CPU; %s %s (devbuf_queue_host_task runs "
                         "host work on any device)",
                         queue->device->spec,
                         queue->device->backend->program_build
                             ? "runs device programs instead (devbuf_queue_launch)"
                             : "runs no kernels");
  devbuf_status counts = check_item_counts(what, use_count, scalars_size);
  if (counts != DEVBUF_OK) return counts;
  devbuf__work *work = devbuf__work_new(queue, kind, use_count, scalars_size);
  if (!work)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a %s with %zu uses", role,
                         use_count);
  work->kernel = function;
  if (scalars_size) memcpy(devbuf__work_scalars(work), scalars, scalars_size);
  return submit(queue, work, uses);
}

devbuf_status devbuf_queue_submit(devbuf_queue_t *queue, devbuf_cpu_kernel_fn kernel,
                                  const devbuf_use_t *uses, size_t use_count, const void *scalars,
                                  size_t scalars_size) {
  return submit_function(queue, DEVBUF__WORK_KERNEL, kernel, uses, use_count, scalars,
                         scalars_size);
}

devbuf_status devbuf_queue_host_task(devbuf_queue_t *queue, devbuf_cpu_kernel_fn task,
                                     const devbuf_use_t *uses, size_t use_count,
                                     const void *scalars, size_t scalars_size) {
  return submit_function(queue, DEVBUF__WORK_HOST, task, uses, use_count, scalars, scalars_size);
}

devbuf_status devbuf_queue_fill(devbuf_queue_t *queue, devbuf_buffer_t *buffer, const void *pattern,
                                size_t pattern_size) {
  if (!queue || !buffer || !pattern || pattern_size == 0)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "fill: queue, buffer and a non-empty pattern are required");
  // Patterns are mostly a power of two long: a mask, not a division.
  size_t misfit = pattern_size & (pattern_size - 1) ? buffer->size % pattern_size
                                                    : buffer->size & (pattern_size - 1);
  if (misfit)
    return devbuf__error(DEVBUF_SIZE_MISMATCH,
                         "fill: a %zu-byte pattern does not divide a %zu-byte buffer", pattern_size,
                         buffer->size);
  devbuf_status counts = check_item_counts("fill", 1, pattern_size);
  if (counts != DEVBUF_OK) return counts;
  devbuf__work *work = devbuf__work_new(queue, DEVBUF__WORK_FILL, 1, pattern_size);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a fill");
  memcpy(devbuf__work_scalars(work), pattern, pattern_size);
  devbuf_use_t use = {buffer, DEVBUF_ACCESS_WRITE};
  return submit(queue, work, &use);
}

devbuf_status devbuf_queue_copy(devbuf_queue_t *queue, devbuf_buffer_t *dst, devbuf_buffer_t *src) {
  if (!queue || !dst || !src)
    return devbuf__null_argument("copy", "queue, dst, src", (const void *[]){queue, dst, src});
  if (dst->size != src->size)
    return devbuf__error(DEVBUF_SIZE_MISMATCH, "copy of a %zu-byte buffer into a %zu-byte buffer",
                         src->size, dst->size);
  // A device copy between overlapping bytes of one memory at two addresses would smear
  // (copy_from stages them).
  if (devbuf__storages_alias(dst->storage, dst->offset, src->storage, src->offset, dst->size))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "copy: the destination (bytes %zu..%zu) and the source (bytes %zu..%zu) "
                         "are one memory through an import and its exporter, overlapping: "
                         "devbuf_buffer_copy_from copies them as memmove",
                         dst->offset, dst->offset + dst->size, src->offset,
                         src->offset + src->size);
  devbuf__work *work = devbuf__work_new(queue, DEVBUF__WORK_COPY, 2, 0);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a copy");
  devbuf_use_t uses[2] = {{dst, DEVBUF_ACCESS_WRITE}, {src, DEVBUF_ACCESS_READ}};
  return submit(queue, work, uses);
}

// The grid: 1 to 3 dimensions of global sizes above 0 whose product fits a size_t, and local
// sizes all 0 (the driver chooses) or each one dividing its global size.
static devbuf_status check_grid(const devbuf_launch_t *launch) {
  if (launch->dims < 1 || launch->dims > 3)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: %u dimensions (1 to 3)", launch->dims);
  size_t items = 1;
  for (unsigned d = 0; d < launch->dims; d++) {
    if (launch->global[d] == 0 || (launch->local[0] != 0) != (launch->local[d] != 0) ||
        (launch->local[d] && launch->global[d] % launch->local[d]))
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "launch: dimension %u: global size %zu, local size %zu (global sizes "
                           "above 0; local sizes all 0, or each one dividing its global size)",
                           d, launch->global[d], launch->local[d]);
    if (devbuf__mul_overflows(items, launch->global[d], &items))
      return devbuf__error(DEVBUF_OVERFLOW,
                           "launch: global sizes %zu x %zu x %zu: more work items than a size_t "
                           "counts",
                           launch->global[0], launch->dims > 1 ? launch->global[1] : (size_t)1,
                           launch->dims > 2 ? launch->global[2] : (size_t)1);
  }
  return DEVBUF_OK;
}

devbuf_status devbuf_queue_launch(devbuf_queue_t *queue, devbuf_program_t *program,
                                  const char *name, const devbuf_launch_t *launch,
                                  const devbuf_use_t *uses, size_t use_count,
                                  const devbuf_arg_t *args, size_t arg_count) {
  if (!queue || !program || !name || !launch || (use_count && !uses) || (arg_count && !args))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                         "launch: queue, program, name and launch are required; uses and "
                         "args must be given when their counts are not zero");
  if (program->device != queue->device)
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: a program built for %s on a queue of %s",
                         program->device->spec, queue->device->spec);
  devbuf_status status = DEVBUF_OK;
  status = check_grid(launch);
  if (status != DEVBUF_OK) return status;
  for (size_t i = 0; i < use_count; i++)
    if (uses[i].buffer && uses[i].buffer->offset % queue->device->alignment)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "launch: use %zu is a view at byte %zu; %s passes views to kernels at "
                           "multiples of %zu bytes",
                           i, uses[i].buffer->offset, queue->device->spec,
                           queue->device->alignment);
  if (arg_count > (DEVBUF__WORK_MAX_SCALARS - sizeof *launch) / sizeof(size_t))
    return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: %zu arguments, more than an item holds",
                         arg_count);
  size_t bytes = sizeof *launch + arg_count * sizeof(size_t), name_size = strlen(name) + 1;
  for (size_t i = 0; i < arg_count; i++) {
    if (!args[i].data || !args[i].size)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT, "launch: argument %zu has no bytes", i);
    if (args[i].size > DEVBUF__WORK_MAX_SCALARS - bytes)
      return devbuf__error(DEVBUF_INVALID_ARGUMENT,
                           "launch: argument %zu of %zu bytes takes the arguments past %zu bytes",
                           i, args[i].size, DEVBUF__WORK_MAX_SCALARS);
    bytes += args[i].size;
  }
  status = queue->device->backend->program_check_launch(queue->device, program->backend_program,
                                                        name, launch, use_count, arg_count);
  if (status != DEVBUF_OK) return status;
  devbuf_status counts = check_item_counts("launch", use_count, bytes + name_size);
  if (counts != DEVBUF_OK) return counts;
  devbuf__work *work = devbuf__work_new(queue, DEVBUF__WORK_LAUNCH, use_count, bytes + name_size);
  if (!work)
    return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a launch with %zu uses",
                         use_count);
  devbuf_launch_t *copied = devbuf__work_launch(work);
  *copied = *launch;
  size_t *sizes = (size_t *)(copied + 1);
  char *bytes_at = (char *)(sizes + arg_count);
  for (size_t i = 0; i < arg_count; i++) {
    sizes[i] = args[i].size;
    memcpy(bytes_at, args[i].data, args[i].size);
    bytes_at += args[i].size;
  }
  memcpy(bytes_at, name, name_size);
  work->kernel_name = bytes_at;
  work->arg_count = arg_count;
  work->program = devbuf_program_retain(program);
  return submit(queue, work, uses);
}

static devbuf_status submit_event_op(devbuf_queue_t *queue, devbuf__work_kind kind,
                                     devbuf_event_t *event, uint64_t value) {
  if (!queue || !event)
    return devbuf__null_argument("", "queue, event", (const void *[]){queue, event});
  devbuf__work *work = devbuf__work_new(queue, kind, 0, 0);
  if (!work) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event operation");
  work->event = devbuf_event_retain(event);
  work->value = value;
  return submit(queue, work, NULL);
}

devbuf_status devbuf_queue_signal(devbuf_queue_t *queue, devbuf_event_t *event, uint64_t value) {
  devbuf_status signallable = event ? devbuf__event_signallable(event) : DEVBUF_OK;
  if (signallable != DEVBUF_OK) return signallable;
  return submit_event_op(queue, DEVBUF__WORK_SIGNAL, event, value);
}

devbuf_status devbuf_queue_wait(devbuf_queue_t *queue, devbuf_event_t *event, uint64_t value) {
  return submit_event_op(queue, DEVBUF__WORK_WAIT, event, value);
}
