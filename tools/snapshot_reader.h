// PyTorch memory snapshots (torch.cuda.memory._dump_snapshot pickles) read in C: the tree
// pickle_reader.h makes becomes the allocation trace tools/snapshot_to_trace.py writes with
// `--times --frames N` (docs/traces.md; the rules of tests/data/traces/README.md), and the
// figures of what PyTorch's caching allocator (CCA) did in the run, as that README defines
// them. `devbuf trace replay|view RUN.pickle` converts into a temporary file and reads it.
//
// Where a snapshot's field has a type no snapshot writes (a float address, a list as a
// size), the conversion refuses with a message instead of guessing what Python would print.
// Its work is bounded by the input's size: DEVBUF_SNAPSHOT_STEPS_PER_BYTE lookups and
// DEVBUF_SNAPSHOT_OUTPUT_PER_BYTE bytes of trace per input byte (plus a floor each).
#ifndef DEVBUF_TOOL_SNAPSHOT_READER_H
#define DEVBUF_TOOL_SNAPSHOT_READER_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define DEVBUF_SNAPSHOT_STEPS_PER_BYTE  256
#define DEVBUF_SNAPSHOT_STEPS_FLOOR     ((uint64_t)1 << 26)
#define DEVBUF_SNAPSHOT_OUTPUT_PER_BYTE 32
#define DEVBUF_SNAPSHOT_OUTPUT_FLOOR    ((uint64_t)64 << 20)
#define DEVBUF_SNAPSHOT_DEFAULT_FRAMES  8 // Python frames kept per allocation

// What the snapshot says CCA did (tests/data/traces/README.md, figures.json's fields).
typedef struct devbuf_snapshot_figures {
  uint64_t events;             // the device's recorded events (dictionaries)
  uint64_t allocs, frees;      // `a` lines (those live at the start included), `f` lines
  uint64_t live_at_start;      // `# p` lines
  uint64_t segments_at_start;  // `# s` lines
  int64_t reserved_at_start;   // bytes of them
  int64_t cca_peak_reserved;   // most bytes CCA held from the first recorded allocation on
                               // (from the start, where nothing was recorded)
  uint64_t cca_system_allocs;  // segments at the start, less those freed before the first
                               // recorded allocation, plus every segment_alloc
  int64_t cca_reserved_at_end; // bytes CCA held when the snapshot was taken
  uint64_t cca_segment_allocs, cca_segment_frees; // `# S`, `# F` lines
  uint64_t trace_bytes;                           // bytes of trace written
  // Whether CCA ran with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True):
  // the snapshot's allocator_settings say so, or one of the device's segments is marked
  // is_expandable. Its segments then grew by mapping pages, as devbuf's growable ones do.
  int expandable_segments;
} devbuf_snapshot_figures;

// Writes the trace of CUDA device `device` (>= 0) of the snapshot pickled in `data` to
// `out`, with `# t` lines and up to `frames` `# frame` lines per allocation; `source` names
// the snapshot in the `# converted` line. 0 with `*figures` filled, or -1 with a message in
// `message` (always terminated; offsets of the pickle where the fault lies in it). Nothing
// in the pickle is called; every value is freed before it returns.
int devbuf_snapshot_convert(const uint8_t *data, size_t size, const char *source, int device,
                            int frames, FILE *out, devbuf_snapshot_figures *figures, char *message,
                            size_t capacity);

// A snapshot converted into a temporary trace file for the tool's commands.
typedef struct devbuf_tool_snapshot {
  char trace_path[4096]; // the trace, under $TMPDIR (or /tmp); "" when none
  int device;            // the CUDA device whose allocations it holds
  devbuf_snapshot_figures figures;
} devbuf_tool_snapshot;

// Whether the file at `path` starts as a pickle of protocol 2 to 5 (a file that cannot be
// read is not one: the trace reader then says why).
int devbuf_tool_is_snapshot(const char *path);
// Converts the allocations of CUDA device `device` in the snapshot at `path`
// (DEVBUF_SNAPSHOT_DEFAULT_FRAMES frames) into a temporary file: 0, or 1 with
// "devbuf COMMAND: PATH: why" printed on stderr (also where it records no event and no
// segment of the device, 0 as any other).
int devbuf_tool_snapshot_open(const char *command, const char *path, int device,
                              devbuf_tool_snapshot *out);
// Removes the temporary file. Safe on a snapshot never opened (zeroed).
void devbuf_tool_snapshot_close(devbuf_tool_snapshot *snapshot);

#endif
