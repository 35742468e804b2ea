// A fast 64-bit checksum of bytes, for `devbuf load --verify` and the load benchmark: four
// independent multiply-rotate lanes keep up with memory bandwidth. Not cryptographic.
#ifndef DEVBUF_TOOL_CHECKSUM_H
#define DEVBUF_TOOL_CHECKSUM_H

#include <stddef.h>
#include <stdint.h>

uint64_t devbuf_tool_checksum(const void *data, size_t size);

#endif
