#!/usr/bin/env python3
"""Converts a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes)
into a devbuf allocation trace (the format of docs/traces.md), without torch and without
running anything the pickle names: the unpickler builds plain containers and numbers, and
turns every class reference into an inert dictionary.

Usage: snapshot_to_trace.py SNAPSHOT.pickle [-o OUT.trace] [--device N] [--times] [--frames N]

What it writes, for device N (0 by default):
  - `# s I SIZE POOL`: the segments held when recording began (those at dump time, less the
    ones the trace allocated, plus the ones it freed before allocating one at their address),
    in address order;
  - `# p SEG OFFSET ID BLOCK` + `a ID SIZE`: allocations live when recording began (blocks
    still allocated at dump time that the trace did not allocate, and allocations the
    trace frees without having allocated them; for those BLOCK is the request rounded up
    to 512 bytes), in address order. In a segment where a block has no address (older
    PyTorch versions wrote none), each block lies where the sizes of those before it end;
  - then the recorded events in order: `a ID SIZE` (the requested size), `f ID`
    (free_completed), `# S SIZE` (segment_alloc), `# E` + `# F SIZE` (segment_free runs),
    `# stream N` where the stream changes. Zero-byte allocations are left out.
  - with --times, `# t MICROSECONDS` (the event's time_us) before each recorded `a` and `f`;
    with --frames N, up to N `# frame FILE:LINE FUNCTION` lines (innermost first, as the
    snapshot lists them; only the Python frames where the stack has any) before each
    recorded `a`. Replay skips both; `devbuf trace view`
    shows them (time on the axis, the stack when hovering an allocation).
"""
import argparse
import pickle
import sys

SMALL_SEGMENT = 2 << 20
LONGEST_FRAME = 240  # bytes of UTF-8: a trace line holds at most 255 bytes


def frame_text(frame):
    """One stack frame as a line's text: printable, and short enough for the format (cut
    to whole characters, so that a line of non-ASCII text stays within 255 bytes too)."""
    if not isinstance(frame, dict) or "filename" not in frame:
        return None
    text = f"{frame.get('filename', '?')}:{frame.get('line', '?')} {frame.get('name', '?')}"
    text = "".join(c if c.isprintable() else "?" for c in text)
    encoded = text.encode("utf-8")
    if len(encoded) <= LONGEST_FRAME:
        return text
    return encoded[:LONGEST_FRAME - 3].decode("utf-8", "ignore") + "..."


class Inert(dict):
    """What any class reference in the pickle becomes: a dictionary that remembers the name
    and the arguments it was given. Nothing of the named class is imported or called."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self["__args__"] = list(args)
        if kwargs:
            self["__kwargs__"] = kwargs

    def __setstate__(self, state):
        self["__state__"] = state


class RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        # A fresh subclass per name, so that REDUCE, NEWOBJ and BUILD land in an Inert.
        return type("Inert_" + "".join(c if c.isalnum() else "_" for c in f"{module}.{name}"), (Inert,),
                    {"__module__": __name__, "qualified_name": f"{module}.{name}"})

    def persistent_load(self, pid):
        return Inert(pid)


def load_snapshot(path):
    with open(path, "rb") as f:
        snapshot = RestrictedUnpickler(f).load()
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        raise ValueError(f"{path}: not a memory snapshot (a dictionary with 'segments')")
    return snapshot


def convert(snapshot, device=0, source="snapshot", times=False, frames=0):
    traces = snapshot.get("device_traces") or []
    events = [e for e in (traces[device] if device < len(traces) else []) if isinstance(e, dict)]
    segments = [s for s in snapshot["segments"] if isinstance(s, dict) and s.get("device", 0) == device]
    # The segments held when recording began. In the events' order, a segment_free frees what
    # the last segment_alloc of its address made, where that is not freed yet, else a segment
    # held at the start (whose address a later segment_alloc may get again).
    traced_segments, freed_at_start = set(), []  # made by the trace and not freed since
    for e in events:
        if e.get("action") == "segment_alloc":
            traced_segments.add(e["addr"])
        elif e.get("action") == "segment_free":
            if e["addr"] in traced_segments:
                traced_segments.discard(e["addr"])
            else:
                freed_at_start.append(e)
    held = {s["address"]: (s["total_size"], s.get("segment_type", "large")) for s in segments
            if s["address"] not in traced_segments}
    for e in freed_at_start:
        held[e["addr"]] = (e["size"], "small" if e["size"] == SMALL_SEGMENT else "large")
    start = sorted(held.items())

    def place(address):
        for index, (base, (size, _)) in enumerate(start):
            if base <= address < base + size:
                return index, address - base
        return None

    # Allocations live when recording began.
    allocated_in_trace = {e["addr"] for e in events if e.get("action") == "alloc" and e.get("size", 0) > 0}
    live_at_start = {}  # address -> (requested, block)
    for s in segments:
        blocks = s.get("blocks", [])
        # Older PyTorch versions gave a block no "address" (a "history" of its allocations
        # instead), and listed a segment's blocks in address order, end to end from the
        # segment's address: where a block has none, each block of its segment is placed by
        # the sizes of those before it.
        placed = any("address" not in block for block in blocks)
        position = s["address"] if placed else None
        for index, block in enumerate(blocks):
            if placed:
                address, size = position, block["size"]
                if size < 0:
                    raise ValueError(f"block {index} of a segment: a size of {size} bytes")
                if "address" in block and block["address"] != position:
                    raise ValueError(f"block {index} of a segment is at {block['address']:#x}, not at "
                                     f"{position:#x} where the sizes of the blocks before it end")
                position += size
                if position - s["address"] > s["total_size"]:
                    raise ValueError(f"the blocks of a segment, placed end to end by their sizes, pass "
                                     f"its end at {s['total_size']} bytes with block {index}")
            if block.get("state") != "active_allocated":
                continue
            if not placed:
                address = block["address"]
            if address not in allocated_in_trace:
                requested = block.get("requested_size", block["size"]) or block["size"]
                live_at_start[address] = (requested, block["size"])
    seen = set()
    for e in events:
        action, address = e.get("action"), e.get("addr")
        if action == "alloc" and e.get("size", 0) > 0:
            seen.add(address)
        elif action == "free_completed" and address not in seen and address not in live_at_start:
            live_at_start[address] = (e["size"], (e["size"] + 511) // 512 * 512)
        if action == "free_completed":
            seen.discard(address)

    lines = ["# devbuf trace 1", f"# converted from {source}: device {device}, {len(events)} events"]
    streams = sorted({e.get("stream", 0) for e in events}) or [0]
    current_stream = streams[0]
    lines.append(f"# stream {current_stream}")
    for index, (_, (size, pool)) in enumerate(start):
        lines.append(f"# s {index} {size} {pool}")
    live = {}  # address -> id
    next_id = 1
    for address, (requested, block) in sorted(live_at_start.items()):
        where = place(address)
        if where is None:
            raise ValueError(f"allocation at {address:#x} lies in no segment held at the start")
        lines.append(f"# p {where[0]} {where[1]} {next_id} {block}")
        lines.append(f"a {next_id} {requested}")
        live[address] = next_id
        next_id += 1
    in_free_run = False
    for e in events:
        action = e.get("action")
        stream = e.get("stream", 0)
        if action in ("alloc", "free_completed", "segment_alloc", "segment_free") and stream != current_stream:
            lines.append(f"# stream {stream}")
            current_stream = stream
        if action != "segment_free":
            in_free_run = False
        recorded = (action == "alloc" and e.get("size", 0) > 0) or (action == "free_completed" and e.get("addr") in live)
        if times and recorded and isinstance(e.get("time_us"), int) and e["time_us"] >= 0:
            lines.append(f"# t {e['time_us']}")
        if action == "alloc":
            if e.get("size", 0) <= 0:
                continue
            stack = [f for f in (e.get("frames") if isinstance(e.get("frames"), list) else [])
                     if isinstance(f, dict) and "filename" in f]
            # The program's own lines are the Python frames; the C++ ones under them are the
            # allocator, the dispatcher and the interpreter, the same for every allocation.
            python = [f for f in stack if str(f["filename"]).endswith(".py")]
            # Only the frames written are spelt out: str() of a frame not written (an int of
            # more digits than Python prints, say) does not refuse the snapshot.
            for frame in (python or stack)[:frames]:
                lines.append(f"# frame {frame_text(frame)}")
            live[e["addr"]] = next_id
            lines.append(f"a {next_id} {e['size']}")
            next_id += 1
        elif action == "free_completed":
            if e["addr"] in live:
                lines.append(f"f {live.pop(e['addr'])}")
        elif action == "segment_alloc":
            lines.append(f"# S {e['size']}")
        elif action == "segment_free":
            if not in_free_run:
                lines.append("# E")
                in_free_run = True
            lines.append(f"# F {e['size']}")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description="PyTorch memory snapshot pickle -> devbuf trace")
    parser.add_argument("snapshot")
    parser.add_argument("-o", "--output")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--times", action="store_true", help="keep each event's time (# t lines)")
    parser.add_argument("--frames", type=int, default=0, metavar="N",
                        help="keep up to N stack frames of each allocation (# frame lines)")
    args = parser.parse_args()
    try:
        text = convert(load_snapshot(args.snapshot), args.device, args.snapshot, args.times, max(args.frames, 0))
    except (OSError, ValueError, KeyError, TypeError, pickle.UnpicklingError, EOFError) as error:
        print(f"snapshot_to_trace: {error}", file=sys.stderr)
        return 1
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
