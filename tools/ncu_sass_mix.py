#!/usr/bin/env python3
"""Instruction mix and stall samples of one kernel from ncu's source page.

Input: the csv of `ncu -i REPORT --page source --csv --print-source sass` (gpu_check.sh ncu_sass
writes one per kernel). Prints the executed warp instructions by opcode (with their share and the
warp-stall samples on those lines), then, with --regions, the totals over line ranges given as
START:END:NAME (SASS line indices of the csv, 0-based, END exclusive) — e.g. to split a kernel into
its setup, staging, main loop and epilogue after reading the listing.
"""
import argparse
import collections
import csv
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="opcodes to print")
    ap.add_argument("--regions", nargs="*", default=[], help="START:END:NAME line ranges")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv, newline="")))
    # The first row names the kernel; the second is the header.
    hdr, data = rows[1], rows[2:]
    i_exec = hdr.index("Instructions Executed")
    i_src = hdr.index("Source")
    i_samp = hdr.index("Warp Stall Sampling (All Samples)")

    def num(r, i):
        try:
            return int(r[i].replace(",", ""))
        except (IndexError, ValueError):
            return 0

    ops, samples = collections.Counter(), collections.Counter()
    total = 0
    for r in data:
        words = r[i_src].split() if len(r) > i_src else []
        if not words:
            continue
        op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
        op = op.split(".")[0]
        n = num(r, i_exec)
        ops[op] += n
        samples[op] += num(r, i_samp)
        total += n
    print(f"{rows[0][1] if len(rows[0]) > 1 else ''}\nwarp instructions executed: {total}")
    for op, n in ops.most_common(args.top):
        print(f"{op:12s} {n:10d} {100 * n / max(total, 1):5.1f}%  stall samples {samples[op]}")
    all_samples = sum(num(r, i_samp) for r in data)
    for spec in args.regions:
        a, b, name = spec.split(":", 2)
        part = data[int(a):int(b)]
        s = sum(num(r, i_samp) for r in part)
        n = sum(num(r, i_exec) for r in part)
        print(f"{name:24s} instructions {n:10d} ({100 * n / max(total, 1):4.1f}%)  samples {s} "
              f"({100 * s / max(all_samples, 1):4.1f}%)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(0)
