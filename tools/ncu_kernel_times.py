#!/usr/bin/env python3
"""Per-kernel device time from `ncu --metrics gpu__time_duration.sum --csv` output: kernels grouped
by (shortened) name, with launch count, total and mean µs, largest first.

    python3 tools/ncu_kernel_times.py ncu.csv [--steps N]   # N: divide totals by the profiled steps
"""
import argparse
import collections
import csv
import re
import sys


def short(name: str) -> str:
    name = re.sub(r"gptoss::kernels::cuda::|\(anonymous namespace\)::|<unnamed>::", "", name)
    name = re.sub(r"\(.*$", "", name)  # drop the parameter list
    name = re.sub(r"^void ", "", name)
    return name[:90]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=0.0, help="0: the launches of the embedding kernel")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    lines = [l for l in open(args.csv, errors="replace") if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    total = collections.defaultdict(float)
    count = collections.Counter()
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        us = v / 1000.0 if unit == "nsecond" or unit == "ns" else v if unit in ("usecond", "us") else v * 1000.0
        k = short(r["Kernel Name"])
        total[k] += us
        count[k] += 1
    if not total:
        print("no gpu__time_duration rows")
        return 1
    if args.steps <= 0:
        args.steps = float(sum(c for k, c in count.items() if "embedding" in k) or 1)
    s = sum(total.values())
    print(f"{sum(count.values())} kernels, {s / args.steps:.1f} µs per step ({args.steps:g} steps)")
    print("| kernel | launches/step | µs/step | mean µs | share |")
    print("|---|---:|---:|---:|---:|")
    for k, t in sorted(total.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"| {k} | {count[k] / args.steps:.0f} | {t / args.steps:.1f} | {t / count[k]:.2f} | {100 * t / s:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
