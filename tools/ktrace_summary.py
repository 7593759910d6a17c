#!/usr/bin/env python3
"""Summarises a GPTOSS_KERNEL_TRACE CSV (gptoss bench; src/cli/kernel_trace.h): per kernel kind, the
launches in the traced step, the mean time each adds to the step's critical path (its end past every
earlier kernel's end), its mean duration, and how early it starts before the previous kernel ends
(programmatic dependent launch). Usage: ktrace_summary.py TRACE.csv [more.csv ...]"""
import collections
import csv
import re
import sys


def kind(name):
    """A kernel's function name without namespaces, return type and arguments; template arguments kept."""
    n = re.sub(r"\(anonymous namespace\)::|gptoss::kernels::cuda::|gptoss::kernels::|^void ", "", name)
    depth, out = 0, []
    for ch in n:  # cut at the argument list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        out.append(ch)
    return "".join(out)[:70]


def summarise(path):
    rows = list(csv.DictReader(open(path)))
    for label in dict.fromkeys(r["label"] for r in rows):
        rs = [r for r in rows if r["label"] == label]
        agg = collections.OrderedDict()
        prev_end = None
        for r in rs:
            s, e, a = float(r["start_us"]), float(r["end_us"]), float(r["adds_us"])
            d = agg.setdefault(kind(r["kernel"]), [0, 0.0, 0.0, 0.0])
            d[0] += 1
            d[1] += a
            d[2] += e - s
            d[3] += (prev_end - s) if prev_end is not None else 0.0
            prev_end = e
        total = sum(v[1] for v in agg.values())
        # Time some kernel was running (the union of the intervals) against the span: the rest is
        # the GPU idle between kernels inside the step.
        busy, cur_s, cur_e = 0.0, None, None
        for r in sorted(rs, key=lambda r: float(r["start_us"])):
            s, e = float(r["start_us"]), float(r["end_us"])
            if cur_e is None or s > cur_e:
                if cur_e is not None:
                    busy += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None:
            busy += cur_e - cur_s
        print(f"{path}: {label}: step {float(rs[0]['step_us']):.1f} us start to start, kernels {total:.1f} us, "
              f"busy {busy:.1f} us, idle inside {total - busy:.1f} us")
        print(f"  {'kernel':70s} {'n':>4s} {'adds':>7s} {'dur':>7s} {'early':>6s} {'total':>8s}")
        for k, (n, adds, dur, early) in agg.items():
            print(f"  {k:70s} {n:4d} {adds / n:7.2f} {dur / n:7.2f} {early / n:6.2f} {adds:8.1f}")


if __name__ == "__main__":
    for p in sys.argv[1:]:
        summarise(p)
