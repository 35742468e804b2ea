// A queue's wait for an event value, for every backend. On the host it is a blocking wait
// that cancel interrupts (the CPU, CUDA). On a device with gates it is a barrier on the
// device queue (OpenCL: a marker behind a user event) that the first of its openers opens: the
// event reaching the value or failing (an event watch), or cancel. The worker still waits on the
// host until the barrier has passed, so that nothing behind the wait is enqueued before the wait is
// over (cancel then drops it unstarted). Then the worker detaches the gate, so that an opener
// coming later does nothing, and the backend releases it.
#include "queue.h"

struct devbuf__wait_gate {
  pthread_mutex_t lock;
  devbuf__refcount refs; // the worker's and the event watch's
  devbuf_device_t *device;
  void *device_queue;
  void *backend_gate;
  bool attached; // until the worker detaches it
  bool opened;   // the backend's gate is opened once
};
typedef struct devbuf__wait_gate wait_gate;

// Under the gate's lock: the worker may not detach and release it meanwhile.
static void gate_open(wait_gate *gate) {
  pthread_mutex_lock(&gate->lock);
  if (gate->attached && !gate->opened) {
    gate->opened = true;
    gate->device->backend->gate_open(gate->device, gate->device_queue, gate->backend_gate);
  }
  pthread_mutex_unlock(&gate->lock);
}

static void gate_unref(wait_gate *gate) {
  if (!devbuf__ref_drop(&gate->refs)) return;
  pthread_mutex_destroy(&gate->lock);
  devbuf__free(gate);
}

static void gate_reached(void *context, devbuf_status status) {
  (void)status; // the worker reads the event's value and failure once the gate is open
  gate_open(context);
  gate_unref(context);
}

// Once the worker may go on: cancel ends the wait first; otherwise the value has been
// reached, the event has failed, or (without a watch) the host waits for either here.
static devbuf_status outcome(devbuf__work *work) {
  if (atomic_load(&work->cancel))
    return devbuf__error(DEVBUF_CANCELLED, "the wait for event value %llu was cancelled",
                         (unsigned long long)work->value);
  return devbuf__event_wait(work->event, work->value, UINT64_MAX, &work->cancel);
}

// The gate is on the device queue, behind `event`: arms its openers, waits for it to pass,
// detaches it.
static devbuf_status wait_at_gate(devbuf__work *work, wait_gate *gate, void *event) {
  devbuf_device_t *device = gate->device;
  pthread_mutex_init(&gate->lock, NULL);
  devbuf__ref_init(&gate->refs, 2);
  gate->attached = true;
  gate->opened = false;
  devbuf__parking *place = devbuf__work_parking(work); // where cancel looks for the gate
  pthread_mutex_lock(&place->lock);
  work->gate = gate;
  pthread_mutex_unlock(&place->lock);
  if (atomic_load(&work->cancel)) gate_open(gate); // cancel came before the gate was there
  if (devbuf__event_watch_value(work->event, work->value, gate_reached, gate) != DEVBUF_OK) {
    gate_open(gate); // nothing would open it: the host waits instead (outcome)
    gate_unref(gate);
  }
  devbuf__device_done passed = {event, "an event wait", DEVBUF_OK};
  devbuf__wait_begins(); // a dozing CPU queue may hold the signal this waits for
  devbuf_status status = device->backend->complete(device, gate->device_queue, &passed, 1);
  devbuf__wait_ends();
  pthread_mutex_lock(&place->lock);
  work->gate = NULL;
  pthread_mutex_unlock(&place->lock);
  pthread_mutex_lock(&gate->lock);
  if (!gate->opened)
    device->backend->gate_open(device, gate->device_queue, gate->backend_gate); // never left parked
  gate->attached = false;
  pthread_mutex_unlock(&gate->lock);
  device->backend->gate_release(device, gate->device_queue, gate->backend_gate);
  gate_unref(gate);
  return status != DEVBUF_OK ? status : outcome(work);
}

devbuf_status devbuf__wait_item_run(devbuf__work *work, devbuf_device_t *device, void *device_queue,
                                    void **out_event) {
  *out_event = NULL;
  const devbuf__backend *backend = device->backend;
  if (device_queue && backend->gate_enqueue) {
    wait_gate *gate = devbuf__malloc(sizeof *gate); // first: a failure then leaves nothing enqueued
    if (!gate) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for an event wait");
    *gate = (wait_gate){.device = device, .device_queue = device_queue};
    void *event = NULL;
    devbuf_status status = backend->gate_enqueue(device, device_queue, &gate->backend_gate, &event);
    if (status == DEVBUF_OK) {
      *out_event = event;
      return wait_at_gate(work, gate, event);
    }
    devbuf__free(gate);
    if (status != DEVBUF_UNSUPPORTED) return status;
    devbuf__clear_error(); // this device waits on the host
  }
  return devbuf__event_wait(work->event, work->value, UINT64_MAX, &work->cancel);
}

void devbuf__wait_item_cancel(devbuf__work *work) {
  devbuf__event_interrupt(work->event); // a wait on the host checks work->cancel again
  devbuf__parking *place = devbuf__work_parking(work);
  pthread_mutex_lock(&place->lock);
  if (work->gate) gate_open(work->gate);
  pthread_mutex_unlock(&place->lock);
}
