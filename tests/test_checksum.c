// The tool's checksum (`devbuf load --verify`): every SIMD way this CPU runs agrees with the
// portable one on every length and alignment, so sums compare across machines; every
// single-bit change and every swap of blocks changes the sum.
#include "../tools/checksum.h"
#include "check.h"

#include <stdint.h>

// The same bytes on every run and machine (a linear congruential generator).
static unsigned char *pseudo_random_bytes(size_t size) {
  unsigned char *bytes = malloc(size);
  uint32_t x = 12345;
  for (size_t i = 0; bytes && i < size; i++)
    bytes[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 16);
  return bytes;
}

static void test_paths_agree(void) {
  enum { MAX = 20000 };
  unsigned char *bytes = pseudo_random_bytes(MAX + 64);
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
  free(bytes);
}

// Sums saved by earlier builds (digest lists of `devbuf load --verify`) stay valid: these are
// what the build before the SIMD ways were chosen at run time gave, and every way gives them.
static void test_known_sums(void) {
  static const struct {
    size_t size;
    uint64_t sum;
  } known[] = {
      {0, UINT64_C(0x00927f445818cbad)},    {1, UINT64_C(0xb42bb2b99662e20c)},
      {7, UINT64_C(0x190591c5cd33de4e)},    {8, UINT64_C(0x274ab23d777487ed)},
      {63, UINT64_C(0x6558fa4dcf3c92cc)},   {64, UINT64_C(0x0d3f2ed74b1e8292)},
      {65, UINT64_C(0x9be91275183f72e7)},   {4095, UINT64_C(0x7159aa0ceaa8cf4f)},
      {4096, UINT64_C(0xea664e02b1f6649f)}, {4097, UINT64_C(0xf93cfecc1dec6f96)},
      {8492, UINT64_C(0x23288a83c0dcb747)}, {20000, UINT64_C(0xba9a2721a384ac19)},
  };
  enum { MAX = 20000 };
  unsigned char *bytes = pseudo_random_bytes(MAX + 64);
  for (unsigned way = 0; way < devbuf_tool_checksum_ways(); way++)
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
      CHECK_EQ_U(devbuf_tool_checksum_by(way, bytes + 3, known[i].size), known[i].sum);
  CHECK_EQ_U(devbuf_tool_checksum(bytes + 3, MAX), known[sizeof known / sizeof *known - 1].sum);
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
  RUN(test_known_sums);
  RUN(test_sensitivity);
  return CHECK_EXIT();
}
