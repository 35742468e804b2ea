// Host copies (copyin, copyout, copy_from) at every relative alignment and at
// sizes around the switch to streaming stores: byte-exact, and not one byte written outside
// the destination's range.
#include "check.h"

#include <stdint.h>

#define ROOM  ((size_t)20 << 20)
#define GUARD 256

static devbuf_device_t *device;
static unsigned char *expected;

static void fill_pattern(unsigned char *bytes, size_t size, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    bytes[i] = (unsigned char)x;
  }
}

// The destination region [offset, offset + size) of `got` holds `want`, and the GUARD bytes
// on each side still hold `sentinel`.
static int region_ok(const unsigned char *got, size_t offset, size_t size,
                     const unsigned char *want, unsigned char sentinel) {
  for (size_t i = offset - GUARD; i < offset; i++)
    if (got[i] != sentinel) return 0;
  for (size_t i = offset + size; i < offset + size + GUARD; i++)
    if (got[i] != sentinel) return 0;
  return memcmp(got + offset, want, size) == 0;
}

static devbuf_buffer_t *view_of(devbuf_buffer_t *buffer, size_t offset, size_t size) {
  devbuf_buffer_t *view = NULL;
  CHECK_OK(devbuf_buffer_view(buffer, offset, size, &view));
  return view;
}

static void test_alignments_and_sizes(void) {
  const size_t sizes[] = {1,
                          63,
                          64,
                          65,
                          4095,
                          4096 * 3 + 17,
                          (1u << 20) - 1,
                          (2u << 20) + 5,
                          (4u << 20) - 64,
                          (4u << 20) + 4096 * 4 + 33,
                          (9u << 20) + 100,
                          16u << 20};
  const size_t offsets[] = {GUARD,      GUARD + 1,    GUARD + 16,  GUARD + 63,
                            GUARD + 64, GUARD + 2048, GUARD + 4095};
  size_t room = ROOM;
  devbuf_allocator_t *allocator = devbuf_device_allocator(device);
  devbuf_buffer_t *a = NULL, *b = NULL;
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &room, 1, 0, &a));
  CHECK_OK(devbuf_buffer_allocate(allocator, DEVBUF_UINT8, &room, 1, 0, &b));
  unsigned char *host = malloc(ROOM), *back = malloc(ROOM);
  expected = malloc(ROOM);
  if (!a || !b || !host || !back || !expected) return;
  size_t cases = 0, wrong = 0;
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    for (size_t i = 0; i < sizeof offsets / sizeof *offsets; i++) {
      size_t size = sizes[s], from = offsets[i],
             to = offsets[(i + s + 1) % (sizeof offsets / sizeof *offsets)];
      fill_pattern(expected, size, (uint32_t)(s * 31 + i));
      // copyin: host + from -> a + to
      memset(back, 0xa5, ROOM);
      CHECK_OK(devbuf_buffer_copyin(a, back, ROOM));
      memcpy(host + from, expected, size);
      devbuf_buffer_t *into = view_of(a, to, size);
      CHECK_OK(devbuf_buffer_copyin(into, host + from, size));
      CHECK_OK(devbuf_buffer_copyout(a, back, ROOM));
      wrong += !region_ok(back, to, size, expected, 0xa5);
      // copyout: a + to -> host + from
      memset(host, 0x5a, ROOM);
      CHECK_OK(devbuf_buffer_copyout(into, host + from, size));
      wrong += !region_ok(host, from, size, expected, 0x5a);
      // copy_from: a + to -> b + from
      memset(back, 0x3c, ROOM);
      CHECK_OK(devbuf_buffer_copyin(b, back, ROOM));
      devbuf_buffer_t *onto = view_of(b, from, size);
      CHECK_OK(devbuf_buffer_copy_from(onto, into));
      CHECK_OK(devbuf_buffer_copyout(b, back, ROOM));
      wrong += !region_ok(back, from, size, expected, 0x3c);
      devbuf_buffer_release(onto);
      devbuf_buffer_release(into);
      cases += 3;
    }
  }
  printf("   %zu copies checked\n", cases);
  CHECK_EQ_U(wrong, 0);
  devbuf_buffer_release(a);
  devbuf_buffer_release(b);
  free(host);
  free(back);
  free(expected);
}

// Overlapping views of one storage still behave like memmove at sizes that stream.
static void test_overlap_large(void) {
  size_t size = (12u << 20) + 3;
  devbuf_buffer_t *buffer = NULL;
  CHECK_OK(
      devbuf_buffer_allocate(devbuf_device_allocator(device), DEVBUF_UINT8, &size, 1, 0, &buffer));
  unsigned char *model = malloc(size), *back = malloc(size);
  if (!buffer || !model || !back) return;
  fill_pattern(model, size, 7);
  CHECK_OK(devbuf_buffer_copyin(buffer, model, size));
  size_t shift = 4096 + 17, length = size - shift;
  devbuf_buffer_t *low = view_of(buffer, 0, length), *high = view_of(buffer, shift, length);
  CHECK_OK(devbuf_buffer_copy_from(high, low));
  memmove(model + shift, model, length);
  CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
  CHECK(memcmp(back, model, size) == 0);
  CHECK_OK(devbuf_buffer_copy_from(low, high));
  memmove(model, model + shift, length);
  CHECK_OK(devbuf_buffer_copyout(buffer, back, size));
  CHECK(memcmp(back, model, size) == 0);
  devbuf_buffer_release(low);
  devbuf_buffer_release(high);
  devbuf_buffer_release(buffer);
  free(model);
  free(back);
}

int main(void) {
  if (devbuf_device_open("cpu", &device) != DEVBUF_OK) return 1;
  RUN(test_alignments_and_sizes);
  RUN(test_overlap_large);
  devbuf_device_release(device);
  return CHECK_EXIT();
}
