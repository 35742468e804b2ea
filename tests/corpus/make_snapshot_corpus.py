#!/usr/bin/env python3
"""Writes the snapshot corpus (tests/corpus/snapshot/): snapshot-shaped pickles of
protocols 2, 4 and 5 that both readers convert (valid_*), and hostile pickles each breaking
one rule of the C reader (bad_*), with expect.txt naming a phrase its message must contain.
They seed fuzz_snapshot (scripts/fuzz.sh) and check_snapshot_reader.py reads them all.
Run from anywhere: python3 tests/corpus/make_snapshot_corpus.py
"""
import os
import pickle
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "snapshot")
MiB = 1 << 20


class Evil:
    """Pickles as a call of os.system: a reader that calls anything would run it."""

    def __init__(self, command="false"):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class Frame:
    """A class instance (NEWOBJ + BUILD): an inert object with no 'filename' to the readers."""

    def __init__(self):
        self.filename = "object.py"
        self.line = 3


def snapshots(command="false"):
    """name -> snapshot-shaped object; `command` is what Evil would run."""
    cyclic = []
    cyclic.append(cyclic)
    frames = [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"},
              {"filename": "model.py", "line": 12, "name": "forward"},
              {"filename": "train.py", "line": 40, "name": "step"}]
    return {
        # The snapshot of check_snapshot_convert.py: live blocks, an orphan free, a traced
        # segment, a zero-byte allocation, a segment freed, another device's segment.
        "basic": {
            "segments": [
                {"device": 0, "address": 0x10000000, "total_size": 2 * MiB, "stream": 0,
                 "segment_type": "small",
                 "blocks": [{"address": 0x10000000, "size": 512, "requested_size": 100,
                             "state": "active_allocated"},
                            {"address": 0x10000200, "size": 1024, "requested_size": 1000,
                             "state": "active_allocated"},
                            {"address": 0x10000600, "size": 2 * MiB - 1536, "requested_size": 0,
                             "state": "inactive"}]},
                {"device": 0, "address": 0x20000000, "total_size": 20 * MiB, "stream": 0,
                 "segment_type": "large",
                 "blocks": [{"address": 0x20000000, "size": 20 * MiB, "requested_size": 0,
                             "state": "inactive"}]},
                {"device": 1, "address": 0x90000000, "total_size": 2 * MiB, "stream": 0,
                 "segment_type": "small", "blocks": []},
            ],
            "device_traces": [[
                {"action": "free_requested", "addr": 0x30000000, "size": 300, "stream": 0},
                {"action": "free_completed", "addr": 0x30000000, "size": 300, "stream": 0,
                 "frames": [Evil(command)]},
                {"action": "segment_alloc", "addr": 0x20000000, "size": 20 * MiB, "stream": 0},
                {"action": "alloc", "addr": 0x20000000, "size": 4 * MiB - 10, "stream": 0},
                {"action": "alloc", "addr": 0x10000200, "size": 1000, "stream": 0},
                {"action": "alloc", "addr": 0x10000600, "size": 0, "stream": 0},
                {"action": "free_completed", "addr": 0x20000000, "size": 4 * MiB - 10, "stream": 0},
                {"action": "segment_free", "addr": 0x30000000, "size": 2 * MiB, "stream": 0},
            ]],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None},
        },
        # Times and frames: C++ frames left out where Python ones exist, a newline, a frame
        # too long for a line, a class instance among the frames.
        "timed": {
            "segments": [],
            "device_traces": [[
                {"action": "alloc", "addr": 0x1000, "size": 4096, "stream": 0,
                 "time_us": 1700000000000100, "frames": frames + [
                     {"filename": "train.py", "line": 41, "name": "step\nwith a newline"},
                     {"filename": "main.py", "line": 1, "name": "<module>"}]},
                {"action": "alloc", "addr": 0x3000, "size": 512, "stream": 0,
                 "time_us": 1700000000000150,
                 "frames": [Evil(command), Frame(), {"filename": "x" * 300, "line": 1, "name": "f"}]},
                {"action": "free_requested", "addr": 0x1000, "size": 4096, "stream": 0,
                 "time_us": 1700000000000190},
                {"action": "free_completed", "addr": 0x1000, "size": 4096, "stream": 0,
                 "time_us": 1700000000000200},
            ]],
        },
        # Everything else the conversion reads: streams, runs of segment frees, shared and
        # cyclic values, odd scalars in frames, non-ASCII and unprintable characters cut to
        # whole characters, events that are not dictionaries, a second device, big and
        # negative numbers, a C++-only stack.
        "mixed": {
            "segments": [
                {"device": 0, "address": 1 << 40, "total_size": 20 * MiB, "segment_type": "large",
                 "blocks": [{"address": 1 << 40, "size": 1 << 20, "state": "active_allocated"},
                            {"address": (1 << 40) + (1 << 20), "size": 4096, "requested_size": None,
                             "state": "active_allocated"}]},
                {"device": 0, "address": 1 << 41, "total_size": 2 * MiB, "segment_type": "small",
                 "blocks": []},
            ],
            "device_traces": [[
                None, 7, "not an event",
                {"action": "segment_alloc", "addr": 1 << 42, "size": 40 * MiB, "stream": 3},
                {"action": "alloc", "addr": 1 << 42, "size": 30 * MiB, "stream": 3, "time_us": -5,
                 "frames": frames, "compile_context": cyclic},
                {"action": "alloc", "addr": (1 << 42) + 30 * MiB, "size": 1, "stream": 3,
                 "time_us": 12, "frames": frames},
                {"action": "alloc", "addr": (1 << 41), "size": 700, "stream": 7, "time_us": 13,
                 "frames": [{"filename": "modèle\u200b\u00a0.py", "line": 2.5, "name": None},
                            {"filename": "🙂" * 100 + ".py", "line": True, "name": "ünïcode"},
                            {"filename": "é" * 119 + ".py", "line": 10 ** 15, "name": "x"},
                            {"filename": "layer.py", "line": -1, "name": 1e-7},
                            {"filename": "layer.py", "line": 1e22, "name": 0.1},
                            {"filename": "a.py", "line": float("inf"), "name": -0.0},
                            {"filename": "b.py", "name": "no line"},
                            {"filename": "c.py", "line": 4, "name": "\x07bell"},
                            {"filename": "d.py", "line": 5, "name": "ninth: left out"}]},
                {"action": "alloc", "addr": (1 << 41) + 1024, "size": 100, "stream": 7,
                 "frames": [{"filename": "libtorch.so", "line": 0, "name": "at::empty"},
                            {"filename": 7, "line": 0, "name": "number as a file"}]},
                {"action": "free_completed", "addr": 1 << 42, "size": 30 * MiB, "stream": 3,
                 "time_us": 20},
                {"action": "free_completed", "addr": 1 << 40, "size": 1 << 20, "stream": 0},
                {"action": "free_completed", "addr": 0x50000100, "size": 1, "stream": 0},
                {"action": "segment_free", "addr": 1 << 41, "size": 2 * MiB, "stream": 0},
                {"action": "segment_free", "addr": 0x50000000, "size": 2 * MiB, "stream": 0},
                {"action": "oom", "stream": 0},
                {"action": "segment_free", "addr": 0x60000000, "size": 22 * MiB, "stream": 0},
            ], [
                {"action": "alloc", "addr": 0x1000, "size": 4096, "stream": 0},
            ]],
        },
        "empty": {"segments": []},
        # A segment held at the start (with an allocation live in it) freed by the trace, and
        # a new segment allocated at its address (CUDA gives freed addresses out again) that
        # is still held at the end; another segment made and freed by the trace.
        "reused": {
            "segments": [
                {"device": 0, "address": 0x40000000, "total_size": 20 * MiB, "segment_type": "large",
                 "blocks": [{"address": 0x40000000, "size": 6 * MiB, "requested_size": 6 * MiB - 100,
                             "state": "active_allocated"},
                            {"address": 0x40600000, "size": 14 * MiB, "state": "inactive"}]},
                {"device": 0, "address": 0x50000000, "total_size": 2 * MiB, "segment_type": "small",
                 "blocks": [{"address": 0x50000000, "size": 512, "requested_size": 300,
                             "state": "active_allocated"}]},
            ],
            "device_traces": [[
                {"action": "free_requested", "addr": 0x40100000, "size": 1000, "stream": 0},
                {"action": "free_completed", "addr": 0x40100000, "size": 1000, "stream": 0},
                {"action": "segment_free", "addr": 0x40000000, "size": 40 * MiB, "stream": 0},
                {"action": "segment_alloc", "addr": 0x40000000, "size": 20 * MiB, "stream": 0},
                {"action": "alloc", "addr": 0x40000000, "size": 6 * MiB - 100, "stream": 0},
                {"action": "segment_alloc", "addr": 0x60000000, "size": 2 * MiB, "stream": 0},
                {"action": "alloc", "addr": 0x60000000, "size": 512, "stream": 0},
                {"action": "free_completed", "addr": 0x60000000, "size": 512, "stream": 0},
                {"action": "segment_free", "addr": 0x60000000, "size": 2 * MiB, "stream": 0},
            ]],
        },
        # Blocks with no "address" (older PyTorch versions: a "history" instead), each placed
        # where the sizes of the blocks before it end; one that has an address where they put
        # it; a trace of one free and one allocation, neither with frames or times.
        "unaddressed": {
            "segments": [
                {"device": 0, "address": 0x70000000, "total_size": 20 * MiB, "segment_type": "large",
                 "stream": 0, "allocated_size": 3 * MiB, "active_size": 3 * MiB, "requested_size": 3 * MiB,
                 "blocks": [{"size": 1 * MiB, "requested_size": MiB - 10, "state": "active_allocated",
                             "history": [{"addr": 0x70000000, "real_size": MiB - 10, "frames": frames}]},
                            {"size": 3 * MiB, "requested_size": 0, "state": "inactive"},
                            {"size": 2 * MiB, "requested_size": 2 * MiB, "state": "active_allocated"},
                            {"size": 14 * MiB, "requested_size": 0, "state": "inactive"}]},
                {"device": 0, "address": 0x80000000, "total_size": 2 * MiB, "segment_type": "small",
                 "blocks": [{"address": 0x80000000, "size": 512, "requested_size": 100,
                             "state": "active_allocated"},
                            {"size": 2 * MiB - 512, "requested_size": 0, "state": "inactive"}]},
            ],
            "device_traces": [[
                {"action": "free_completed", "addr": 0x70100000, "size": 1000, "stream": 0},
                {"action": "alloc", "addr": 0x70400000, "size": 2 * MiB, "stream": 0},
            ]],
        },
        # Integers past 64 bits, as pickle writes them (LONG1: 2^64 - 1 takes 9 bytes, 0xff x8
        # then 0x00; a real snapshot has it as a C++ frame's line): the frames and times that
        # hold them are written as Python's str() spells them, and a frame past the eighth is
        # not looked at (one with more digits than str() writes converts).
        "wide": {
            "segments": [
                {"device": 0, "address": 1 << 30, "total_size": 2 * MiB, "segment_type": 2 ** 64,
                 "blocks": []},
            ],
            "device_traces": [[
                {"action": "alloc", "addr": 1 << 30, "size": 4096, "stream": 0,
                 "time_us": 2 ** 63 + 5, "frames": [
                     {"filename": "model.py", "line": 2 ** 64 - 1, "name": "forward"},
                     {"filename": "model.py", "line": -2 ** 63 - 1, "name": 10 ** 40},
                     {"filename": "train.py", "line": 2 ** 63, "name": -(10 ** 200)}] +
                    [{"filename": "loop.py", "line": n, "name": "step"} for n in range(5)] +
                    [{"filename": "deep.py", "line": 10 ** 5000, "name": "the ninth"}]},
                {"action": "free_completed", "addr": 1 << 30, "size": 4096, "stream": 0,
                 "time_us": 2 ** 64 - 1, "frames": [
                     {"filename": "model.py", "line": 2 ** 64 - 1, "name": "not written"}]},
            ]],
        },
    }


def hostile():
    """name -> (bytes, phrase of the C reader's message)."""
    p4 = b"\x80\x04"
    cases = {
        "bad_not_a_snapshot": (pickle.dumps([1, 2, 3], protocol=4), "not a memory snapshot"),
        "bad_evil_top": (pickle.dumps(Evil(), protocol=4), "not a memory snapshot"),
        "bad_evil_segment": (pickle.dumps({"segments": [Evil()]}, protocol=2), "has no 'address'"),
        "bad_no_stop": (p4 + b"N", "ends before STOP"),
        "bad_empty_stop": (p4 + b".", "stack is empty"),
        "bad_string_past_end": (p4 + b"X\xff\x00\x00\x00abc.", "runs past the end"),
        "bad_string8_huge": (p4 + b"\x8d" + struct.pack("<Q", 1 << 63) + b".", "runs past the end"),
        "bad_bytes8_huge": (p4 + b"\x8e" + b"\xff" * 8 + b".", "runs past the end"),
        "bad_frame_huge": (p4 + b"\x95" + b"\xff" * 8 + b"N.", "frame of"),
        "bad_short_string_cut": (p4 + b"\x8c\x10abc", "runs past the end"),
        "bad_bad_utf8": (p4 + b"\x8c\x02\xc3\x28.", "not well-formed UTF-8"),
        "bad_surrogate": (p4 + b"\x8c\x03\xed\xa0\x80.", "not well-formed UTF-8"),
        # An integer of 9 bytes is read (the pickle's value), and refused where it may not be.
        "bad_long_9_bytes": (p4 + b"\x8a\x09" + b"\x01" * 9 + b".", "not a memory snapshot"),
        "bad_long4_past_end": (p4 + b"\x8b\x10\x00\x00\x00" + b"\x01" * 3 + b".", "runs past the end"),
        "bad_address_2_64": (pickle.dumps({"segments": [{"address": 2 ** 64 - 1, "total_size": 4096}]},
                                          protocol=4),
                             "segment 0 (offset 26): 'address' is 18446744073709551615, outside the 64-bit"),
        "bad_size_huge": (pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 4096, "size": -(10 ** 5000)}]]}, protocol=4),
            "'size' is an integer of 2077 bytes, outside the 64-bit"),
        "bad_line_digits": (pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 4096, "size": 1, "frames": [
                {"filename": "a.py", "line": 10 ** 4300, "name": "f"}]}]]}, protocol=4),
            "more than the 4300 digits Python's str() writes"),
        "bad_long4_negative": (p4 + b"\x8b\xff\xff\xff\xff.", "negative length"),
        "bad_deep_marks": (p4 + b"(" * 1000 + b".", "containers nested"),
        "bad_unknown_opcode": (p4 + b"\xff.", "byte 0xff"),
        "bad_text_int": (p4 + b"I1\n.", "opcode INT is not one"),
        "bad_persid": (p4 + b"Pid\n.", "opcode PERSID is not one"),
        "bad_set": (p4 + b"\x8f.", "opcode EMPTY_SET is not one"),
        "bad_second_proto": (p4 + b"\x80\x04N.", "a second PROTO"),
        "bad_memo_unset": (p4 + b"h\x05.", "memo index 5 was never stored"),
        "bad_memo_long_unset": (p4 + b"N\x94j\xff\xff\xff\xff.", "was never stored"),
        "bad_memo_past_input": (p4 + b"Nr\xff\xff\xff\xff.", "past what a"),
        "bad_memo_empty_stack": (p4 + b"\x94.", "stack is empty"),
        "bad_setitems_no_mark": (p4 + b"}Nu.", "no MARK"),
        "bad_odd_items": (p4 + b"}(Nu.", "odd number"),
        "bad_list_key": (p4 + b"}]Ns.", "a list as a dictionary key"),
        "bad_append_to_dict": (p4 + b"}Na.", "not a list"),
        "bad_setitem_in_list": (p4 + b"]NNs.", "not a dictionary"),
        "bad_tuple_underflow": (p4 + b"N\x87.", "3 values needed"),
        "bad_call_none": (p4 + b"N)R.", "a None called"),
        "bad_reduce_list_args": (p4 + b"\x8c\x01m\x8c\x01n\x93]R.", "not a tuple"),
        "bad_build_dict": (p4 + b"}Nb.", "only inert objects"),
        "bad_stack_global_int": (p4 + b"K\x01K\x02\x93.", "must be strings"),
        "bad_global_no_newline": (b"\x80\x02cos\nsystem", "no end"),
        "bad_memory": (p4 + b"]" * 40000 + b".", "more than"),
        "bad_segments_not_list": (pickle.dumps({"segments": 5}, protocol=4), "not a list"),
        "bad_block_not_dict": (pickle.dumps({"segments": [{"address": 0, "total_size": 4096,
                                                         "blocks": [3]}]}, protocol=4),
                               "not a dictionary"),
        "bad_float_address": (pickle.dumps({"segments": [{"address": 1.5, "total_size": 1}]},
                                           protocol=4), "not an integer"),
        "bad_overlap": (pickle.dumps({"segments": [{"address": 0, "total_size": 8192},
                                                   {"address": 4096, "total_size": 8192}]},
                                     protocol=4), "overlap"),
        "bad_outside": (pickle.dumps({"segments": [{"address": 0, "total_size": 4096, "blocks": [
            {"address": 8192, "size": 512, "state": "active_allocated"}]}]}, protocol=4),
                        "lies in no segment"),
        # Blocks with no address, which their sizes cannot place.
        "bad_blocks_past_end": (pickle.dumps({"segments": [{"address": 0, "total_size": 4096, "blocks": [
            {"size": 4096, "state": "inactive"}, {"size": 512, "state": "active_allocated"}]}]}, protocol=4),
            "pass its end at 4096 bytes with block 1"),
        "bad_block_misplaced": (pickle.dumps({"segments": [{"address": 0, "total_size": 4096, "blocks": [
            {"size": 512, "state": "inactive"},
            {"address": 1024, "size": 512, "state": "active_allocated"}]}]}, protocol=4),
            "block 1 of segment 0 (offset 102) is at 0x400, not at 0x200"),
        "bad_block_negative": (pickle.dumps({"segments": [{"address": 0, "total_size": 4096, "blocks": [
            {"size": -512, "state": "inactive"}]}]}, protocol=4), "a size of -512 bytes"),
        "bad_frame_list": (pickle.dumps({"segments": [], "device_traces": [[
            {"action": "alloc", "addr": 1, "size": 1, "frames": [{"filename": ["x"]}]}]]},
            protocol=4), "where the trace needs text"),
    }
    # Deep nesting without marks: a tuple in a tuple 10000 deep is a tree, not a snapshot.
    cases["bad_deep_tuples"] = (b"\x80\x02N" + b"\x85" * 10000 + b".", "not a memory snapshot")
    return cases


def main():
    os.makedirs(HERE, exist_ok=True)
    for name in os.listdir(HERE):
        if name.endswith(".pickle") or name == "expect.txt":
            os.unlink(os.path.join(HERE, name))
    for name, snapshot in snapshots().items():
        for protocol in (2, 4, 5):
            with open(os.path.join(HERE, f"valid_{name}_p{protocol}.pickle"), "wb") as f:
                pickle.dump(snapshot, f, protocol=protocol)
    lines = []
    for name, (data, phrase) in sorted(hostile().items()):
        with open(os.path.join(HERE, name + ".pickle"), "wb") as f:
            f.write(data)
        lines.append(f"{name}.pickle {phrase}")
    with open(os.path.join(HERE, "expect.txt"), "w") as f:
        f.write("# FILE PHRASE: devbuf trace replay FILE exits 1 with PHRASE in its message\n")
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
