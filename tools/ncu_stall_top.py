#!/usr/bin/env python3
"""The SASS instructions with the most warp-stall samples in an `ncu --page source --csv
--print-source sass` export, with their share of all samples and the instruction text.

    python3 tools/ncu_stall_top.py ncu_src.csv [N]
"""
import csv
import sys


def main() -> int:
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    rows = []
    with open(path, newline="", errors="replace") as f:
        lines = [line for line in f if line.count(",") > 2]  # skip ncu's banner lines
    reader = csv.reader(lines)
    header = next(reader, None)
    if header is None:
        print(f"{path}: no CSV rows")
        return 1

    def column(*needles):
        for i, name in enumerate(header):
            if all(n.lower() in name.lower() for n in needles):
                return i
        return None

    c_samples = column("warp stall sampling", "all")
    c_source = column("source")
    c_addr = column("address")
    if c_samples is None or c_source is None:
        print(f"{path}: no stall-sampling or source column in {header[:12]}")
        return 1
    for r in reader:
        if len(r) <= max(c_samples, c_source):
            continue
        try:
            n = float(r[c_samples].replace(",", "") or 0)
        except ValueError:
            continue
        rows.append((n, r[c_addr] if c_addr is not None else "", r[c_source].strip()))
    total = sum(n for n, _, _ in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    for n, addr, src in sorted(rows, reverse=True)[:top]:
        print(f"{100.0 * n / total:6.2f}%  {addr:>8}  {src}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
