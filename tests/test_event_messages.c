// What failed events and refused exports say: a cancelled event's message names its status
// once, and an event export refused for lack of descriptors names the descriptor limit.
#include "check.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_cancelled_event_says_cancelled_once(void) {
  devbuf_device_t *device = NULL;
  devbuf_queue_t *queue = NULL;
  devbuf_event_t *gate = NULL, *done = NULL;
  CHECK_OK(devbuf_device_open("cpu", &device));
  CHECK_OK(devbuf_queue_create(device, &queue));
  CHECK_OK(devbuf_event_create(0, &gate));
  CHECK_OK(devbuf_event_create(0, &done));
  CHECK_OK(devbuf_queue_wait(queue, gate, 1));
  CHECK_OK(devbuf_queue_signal(queue, done, 1));
  CHECK_OK(devbuf_queue_cancel(queue));
  CHECK_STATUS(devbuf_event_wait(done, 1, 1000000000ull), DEVBUF_CANCELLED);
  CHECK_MESSAGE("CANCELLED: the queue was cancelled");
  CHECK(!strstr(devbuf_last_error(), "CANCELLED: CANCELLED"));
  CHECK_STATUS(devbuf_event_status(done), DEVBUF_CANCELLED);
  CHECK(!strstr(devbuf_last_error(), "CANCELLED: CANCELLED"));
  devbuf_event_release(gate);
  devbuf_event_release(done);
  devbuf_queue_release(queue);
  devbuf_device_release(device);
}

// In a child: every descriptor taken, then an event export.
static int export_without_descriptors(void) {
  struct rlimit limit = {64, 64};
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return 10;
  int any = open("/dev/null", O_RDONLY); // standard input may be closed
  if (any < 0) return 14;
  while (dup(any) >= 0) {
  }
  devbuf_event_t *event = NULL;
  if (devbuf_event_create(0, &event) != DEVBUF_OK) return 11;
  devbuf_export_t *shared = NULL;
  devbuf_status status = devbuf_event_export(event, &shared);
  if (status == DEVBUF_OK) return 12;
  if (status == DEVBUF_UNSUPPORTED || !strstr(devbuf_last_error(), "descriptor")) {
    fprintf(stderr, "export answered %s: %s\n", devbuf_status_name(status), devbuf_last_error());
    return 13;
  }
  return 0;
}

static void test_event_export_without_descriptors_names_the_limit(void) {
  fflush(NULL);
  pid_t child = fork();
  if (child == 0) _exit(export_without_descriptors());
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status));
  CHECK_EQ_U(WEXITSTATUS(status), 0);
}

int main(void) {
  RUN(test_cancelled_event_says_cancelled_once);
  RUN(test_event_export_without_descriptors_names_the_limit);
  return CHECK_EXIT();
}
