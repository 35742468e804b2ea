#!/usr/bin/env bash
# The caching allocator's folder knows segments, blocks and byte ranges only: no storage,
# buffer, hazard tracker, queue or work item may appear in it, nor their headers.
# Usage: check_layers.sh SOURCE_DIR
set -u
folder="$1/src/memory/caching"
found=$(grep -nE 'devbuf__storage|devbuf_buffer_t|devbuf__hazard|devbuf_queue_t|devbuf__work|devbuf_event_t|#include "[./]*(core/hazard|exec/queue|hazard|queue)\.h"' "$folder"/*.c "$folder"/*.h)
if [ -n "$found" ]; then
  echo "src/memory/caching/ reaches into other layers:"
  echo "$found"
  exit 1
fi
echo "src/memory/caching/ sees no storages, buffers, trackers or queues ($(ls "$folder" | wc -l) files)"
