// Device programs: a handle on the backend's cached build (devbuf_program_build).
#include "queue.h"

devbuf_status devbuf_program_build(devbuf_device_t *device, const char *source, const char *options,
                                   devbuf_program_t **out_program) {
  if (!device || !source || !out_program)
    return devbuf__null_argument("program_build", "device, source, out_program",
                                 (const void *[]){device, source, out_program});
  if (!device->backend->program_build)
    return devbuf__error(DEVBUF_UNSUPPORTED,
                         "%s runs no device programs; its kernels are C functions "
                         "(devbuf_queue_submit)",
                         device->spec);
  devbuf_program_t *program = devbuf__calloc(1, sizeof *program);
  if (!program) return devbuf__error(DEVBUF_OUT_OF_MEMORY, "no host memory for a program handle");
  devbuf_status status =
      device->backend->program_build(device, source, options, &program->backend_program);
  if (status != DEVBUF_OK) {
    devbuf__free(program);
    return status;
  }
  devbuf__ref_init(&program->refs, 1);
  program->device = devbuf_device_retain(device);
  *out_program = program;
  return DEVBUF_OK;
}

devbuf_program_t *devbuf_program_retain(devbuf_program_t *program) {
  if (program) devbuf__ref_retain(&program->refs);
  return program;
}

void devbuf_program_release(devbuf_program_t *program) {
  if (!program || !devbuf__ref_drop(&program->refs)) return;
  devbuf_device_t *device = program->device;
  device->backend->program_release(device, program->backend_program);
  devbuf__free(program);
  devbuf_device_release(device);
}
