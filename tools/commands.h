// The tool's subcommands; each returns the process exit code (0 ok, 1 failure, 2 usage).
#ifndef DEVBUF_TOOL_COMMANDS_H
#define DEVBUF_TOOL_COMMANDS_H

int devbuf_cmd_info(int argc, char **argv);
int devbuf_cmd_bench(int argc, char **argv);
int devbuf_cmd_trace(int argc, char **argv);
int devbuf_cmd_inspect(int argc, char **argv);
int devbuf_cmd_load(int argc, char **argv);
int devbuf_cmd_sample(int argc, char **argv);

#endif
