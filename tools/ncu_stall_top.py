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
    # ncu puts a "Kernel Name" row above the header: the header is the first row naming "Address".
    header = next((r for r in reader if any(c.strip().lower() == "address" for c in r)), None)
    if header is None:
        print(f"{path}: no header row with an Address column")
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
    # The per-reason columns (stall_long_sb, ...; not their "(Not Issued)" twins).
    reasons = [(i, name[len("stall_"):]) for i, name in enumerate(header)
               if name.startswith("stall_") and "not issued" not in name.lower()]

    def num(x):
        try:
            return float(x.replace(",", "") or 0)
        except ValueError:
            return 0.0

    by_reason = {name: 0.0 for _, name in reasons}
    for r in reader:
        if len(r) <= max(c_samples, c_source):
            continue
        n = num(r[c_samples])
        why = sorted(((num(r[i]), name) for i, name in reasons if i < len(r)), reverse=True)
        for v, name in why:
            by_reason[name] += v
        top_why = ", ".join(f"{name} {v:.0f}" for v, name in why[:2] if v > 0)
        rows.append((n, r[c_addr] if c_addr is not None else "", r[c_source].strip(), top_why))
    total = sum(row[0] for row in rows) or 1.0
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    all_reasons = sum(by_reason.values()) or 1.0
    print("by reason: " + ", ".join(f"{name} {100.0 * v / all_reasons:.1f}%"
                                    for name, v in sorted(by_reason.items(), key=lambda kv: -kv[1])[:8] if v > 0))
    for n, addr, src, why in sorted(rows, reverse=True)[:top]:
        print(f"{100.0 * n / total:6.2f}%  {addr:>8}  {src[:64]:<64}  {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
