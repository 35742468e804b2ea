// The CPU backend's pieces: memory (backend_cpu.c) and operations (cpu_ops.c).
#ifndef DEVBUF_CPU_BACKEND_H
#define DEVBUF_CPU_BACKEND_H

#include "../backend.h"

// Runs `op` on the calling thread, over host memory; the CPU has no driver events.
devbuf_status devbuf__cpu_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                  void **out_event);

#endif
