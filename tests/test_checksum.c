// The tool's checksum (`devbuf load --verify`): every SIMD way this CPU runs agrees with the
// portable one on every length and alignment, so sums compare across machines; every
// single-bit change and every swap of blocks changes the sum.
#include "../tools/checksum.h"
#include "check.h"

#include <stdint.h>

static void test_paths_agree(void) {
  enum { MAX = 20000 };
  unsigned char *bytes = malloc(MAX + 64);
  uint32_t x = 12345;
  for (size_t i = 0; i < MAX + 64; i++)
    bytes[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
  unsigned ways = devbuf_tool_checksum_ways();
  CHECK(ways >= 1);
  CHECK(strcmp(devbuf_tool_checksum_way_name(0), "portable") == 0);
  CHECK(devbuf_tool_checksum_way_name(ways) == NULL);
#if defined(__x86_64__)
  CHECK(ways >= 2); // SSE2 is part of x86-64
#endif
  for (unsigned way = 1; way < ways; way++) {
    size_t mismatches = 0;
    for (size_t size = 0; size < MAX; size += size < 300 ? 1 : 997)
      for (size_t offset = 0; offset < 8; offset += 3)
        mismatches += devbuf_tool_checksum_by(way, bytes + offset, size) !=
                      devbuf_tool_checksum_by(0, bytes + offset, size);
    printf("  %s against portable: %zu mismatches\n", devbuf_tool_checksum_way_name(way),
           mismatches);
    CHECK_EQ_U(mismatches, 0);
  }
  CHECK(devbuf_tool_checksum(bytes, MAX) == devbuf_tool_checksum_by(ways - 1, bytes, MAX));
  free(bytes);
}

static void test_sensitivity(void) {
  enum { SIZE = 4096 + 300 }; // more than one stripe, and a tail
  unsigned char *bytes = calloc(1, SIZE);
  uint64_t zero = devbuf_tool_checksum(bytes, SIZE);
  size_t unchanged = 0;
  for (size_t bit = 0; bit < SIZE * 8; bit++) {
    bytes[bit / 8] ^= (unsigned char)(1u << bit % 8);
    unchanged += devbuf_tool_checksum(bytes, SIZE) == zero;
    bytes[bit / 8] ^= (unsigned char)(1u << bit % 8);
  }
  CHECK_EQ_U(unchanged, 0);
  for (size_t i = 0; i < SIZE; i++) bytes[i] = (unsigned char)(i / 64); // distinct 64-byte blocks
  uint64_t before = devbuf_tool_checksum(bytes, SIZE);
  unsigned char block[64];
  memcpy(block, bytes, 64); // swap the first two blocks
  memcpy(bytes, bytes + 64, 64);
  memcpy(bytes + 64, block, 64);
  CHECK(devbuf_tool_checksum(bytes, SIZE) != before);
  CHECK(devbuf_tool_checksum(bytes, 0) != devbuf_tool_checksum(bytes, 1)); // length counts
  free(bytes);
}

int main(void) {
  RUN(test_paths_agree);
  RUN(test_sensitivity);
  return CHECK_EXIT();
}
