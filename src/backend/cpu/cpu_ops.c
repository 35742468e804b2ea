// Operations on the CPU: a queue's worker thread runs them one after another, so each is
// over when it returns and leaves no event behind.
#include "cpu.h"

#include <string.h>

static void *host_bytes(const devbuf__operand *operand) {
  return (char *)operand->memory.host + operand->offset;
}

static void fill(void *data, size_t size, const void *pattern, size_t pattern_size) {
  const unsigned char *bytes = pattern;
  size_t same = 1;
  while (same < pattern_size && bytes[same] == bytes[0]) same++;
  if (same == pattern_size) { // one byte over and over (zeros, most often): one memset
    memset(data, bytes[0], size);
    return;
  }
  memcpy(data, pattern, pattern_size);
  for (size_t done = pattern_size; done < size;) { // double the filled prefix each step
    size_t piece = done < size - done ? done : size - done;
    memcpy((char *)data + done, data, piece);
    done += piece;
  }
}

static devbuf_status call(const devbuf__op *op) {
  devbuf__clear_error(); // so that a kernel failing silently reports no stale text
  devbuf_status status = op->kernel(op->kernel_args);
  if (status == DEVBUF_OK) return status;
  // A number that is no status (a kernel returning its own error codes) would reach every
  // waiter as "UNKNOWN": it counts as a device failure that names it.
  if (strcmp(devbuf_status_name(status), "UNKNOWN") == 0) {
    int number = (int)status;
    if (devbuf_last_error()[0] == '\0')
      return devbuf__error(DEVBUF_DEVICE_FAILURE, "kernel returned %d, which is no devbuf status",
                           number);
    return devbuf__error_cause(DEVBUF_DEVICE_FAILURE,
                               "kernel returned %d, which is no devbuf status", number);
  }
  if (devbuf_last_error()[0] == '\0')
    devbuf__error(status, "kernel returned %s without a message", devbuf_status_name(status));
  return status;
}

devbuf_status devbuf__cpu_enqueue(devbuf_device_t *device, void *queue, const devbuf__op *op,
                                  void **out_event) {
  (void)queue;
  *out_event = NULL;
  const devbuf__operand *operands = op->operands;
  switch (op->kind) {
  case DEVBUF__OP_CALL:
    return call(op);
  case DEVBUF__OP_FILL:
    if (operands[0].size)
      fill(host_bytes(&operands[0]), operands[0].size, op->pattern, op->pattern_size);
    return DEVBUF_OK;
  case DEVBUF__OP_COPY:
    if (!operands[0].size) return DEVBUF_OK;
    if (operands[1].mapped) // a truncated file fails the copy, not the process
      return devbuf__guarded_file_copy(host_bytes(&operands[0]), &operands[1].memory,
                                       operands[1].offset, operands[0].size, "queue_copy");
    devbuf__copy_bytes(host_bytes(&operands[0]), host_bytes(&operands[1]), operands[0].size);
    return DEVBUF_OK;
  case DEVBUF__OP_LAUNCH:
    break;
  }
  return devbuf__error(DEVBUF_UNSUPPORTED, "%s cannot launch device programs", device->spec);
}
