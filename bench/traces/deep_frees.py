#!/usr/bin/env python3
"""Writes a devbuf trace that frees blocks deep beneath many live ones, for the cost of
clears, limits and holes in growable segments (docs/allocator.md, "Growable segments").

usage: python3 bench/traces/deep_frees.py FILE [--live N] [--rounds M] [--clears | --holes]

The trace allocates N blocks of 4 KiB (default 100,000), then M times (default 20,000)
frees the lowest block still live and asks for 1 GiB, which a memory limit under 1 GiB
refuses (with --clears, a `# E` line instead of the request). Replay it with
`devbuf trace replay FILE --growable --memory-limit 600MiB`: every refusal and every clear
gives back the pages of the block just freed, and nothing needs to walk the live ones.
With --holes it frees every other block instead, clears (each freed block's page goes back:
N/2 holes between mapped pages), then allocates 4 KiB N/2 times, each filling the lowest
hole left; M is not used.
"""
import argparse


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--live", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=20_000)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--clears", action="store_true")
    mode.add_argument("--holes", action="store_true")
    args = parser.parse_args()
    if not 0 <= args.rounds <= args.live:
        parser.error(f"--rounds {args.rounds} must be between 0 and --live {args.live}")
    lines = ["# devbuf trace 1"]
    lines += [f"a {i} 4096" for i in range(1, args.live + 1)]
    next_id = args.live + 1
    if args.holes:
        lines += [f"f {i}" for i in range(1, args.live + 1, 2)]
        lines.append("# E")
        lines += [f"a {i} 4096" for i in range(next_id, next_id + args.live // 2)]
        args.rounds = 0
    for freed in range(1, args.rounds + 1):
        lines.append(f"f {freed}")
        if args.clears:
            lines.append("# E")
        else:
            lines.append(f"a {next_id} {1 << 30}")
            next_id += 1
    with open(args.file, "w") as out:
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
