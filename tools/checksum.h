// A fast 64-bit checksum of bytes, for `devbuf load --verify` and the load benchmark: eight
// independent multiply-accumulate lanes keep up with memory bandwidth. Not cryptographic.
#ifndef DEVBUF_TOOL_CHECKSUM_H
#define DEVBUF_TOOL_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t devbuf_tool_checksum(const void *data, size_t size);

// The ways this build can compute the sum on this CPU, numbered 0 to count - 1, the one
// devbuf_tool_checksum takes last. Every way gives the same sum: the tests check each.
unsigned devbuf_tool_checksum_ways(void);
const char *devbuf_tool_checksum_way_name(unsigned way); // NULL past the count
uint64_t devbuf_tool_checksum_by(unsigned way, const void *data, size_t size);

#endif
