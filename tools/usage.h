// What the tool says about how to call it: one usage text per command, printed on stdout
// when asked for (exit 0) and on stderr after a mistake in the call (exit 2).
#ifndef DEVBUF_TOOL_USAGE_H
#define DEVBUF_TOOL_USAGE_H

#include <stdbool.h>

// The usage of `command` ("load", "trace", ...), or of the whole tool for NULL or an
// unknown command.
const char *devbuf_tool_usage(const char *command);
// Whether `arg` asks for help (--help or -h).
bool devbuf_tool_wants_help(const char *arg);
// Prints the usage of `command` on stdout; returns 0.
int devbuf_tool_help(const char *command);
// Prints "devbuf <command>: <what>" (printf format, values escaped by the caller) and the
// usage of `command` on stderr; returns 2.
int devbuf_tool_misuse(const char *command, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

// The mistake of an argument the command does not take: "unknown option '--x'" for what
// starts with '-', else "unexpected argument 'x'" followed by `note` (such as " (one FILE
// only)"; NULL for none). Prints it and the usage on stderr; returns 2.
int devbuf_tool_unexpected(const char *command, const char *arg, const char *note);

// Opens the device named on the command line: 0, or 1 (unavailable: the reason printed)
// or 2 (not a device name: the usage printed), as the command's exit code.
typedef struct devbuf_device devbuf_device_t;
int devbuf_tool_open_device(const char *command, const char *spec, devbuf_device_t **out_device);

#endif
