// Sizes on the command line and in the tool's text: one parser for every option that takes
// a number of bytes, and the human form the text output prints.
#ifndef DEVBUF_TOOL_SIZES_H
#define DEVBUF_TOOL_SIZES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Reads a size: a decimal whole number with an optional unit, case-insensitive, all binary
// (as memory is counted): B; K, KB, KiB = 2^10; M, MB, MiB = 2^20; G, GB, GiB = 2^30;
// T, TB, TiB = 2^40. "4096", "64KiB", "512MiB", "2M", "1G". NULL and the value in *out, or
// why the text is no size ("is empty", "is negative", "is not a whole number", "has an
// unknown unit", "is more than 2^64 - 1 bytes").
const char *devbuf_tool_parse_size(const char *text, uint64_t *out);

// The value of a size option of `command` (`option`, such as "--memory-limit", took
// `text`; NULL when the call ended first), from `min` to `max` bytes: 0 and the size in
// *out, or 2 after printing the mistake, naming the value, and the usage (the exit code).
int devbuf_tool_size_option(const char *command, const char *option, const char *text, uint64_t min,
                            uint64_t max, uint64_t *out);
// The value of a counting option (`text`: the argument after it, NULL when there is none): a
// whole number of decimal digits, no sign or blank, from `min` to `max`. 0 and *out, or the
// exit code of a usage error naming the option and what was given.
int devbuf_tool_count_option(const char *command, const char *option, const char *text, long min,
                             long max, long *out);

// "1.62 GiB", "512 KiB", "100 bytes" (binary units, three significant figures) into `out`;
// returns `out`.
const char *devbuf_tool_human_size(uint64_t bytes, char *out, size_t capacity);
// "1,737,031,680": the exact count with thousands separators, into `out`; returns `out`.
const char *devbuf_tool_grouped(uint64_t value, char *out, size_t capacity);

#endif
