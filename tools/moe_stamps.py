#!/usr/bin/env python3
"""Summarises a GPTOSS_MOE_STAMPS CSV (src/kernels/cuda/moe_decode.cu, MoeStamps): per-CTA %globaltimer stamps of
the decode MoE's gate_up loop kernel and one-tile down kernel at one token, the last step's launches, a slot a
layer. For each event, the spread over CTAs (min / p10 / p50 / p90 / max, µs after the layer's first gate_up CTA
entered), as the median over layers of each statistic; then the gate_up tiles' q-loop times, and how many CTAs
are still working as time goes on (the tail).

Usage: moe_stamps.py STAMPS.csv [--layer N] [--tile-bytes B (default 16 · 90 · 17, hidden 2880)]"""
import collections
import csv
import statistics
import sys

GATE_UP = {0: "entry", 1: "pdl_wait done", 2: "find_all + staging done", 3: "first loads start",
           4: "first loads issued", 5: "tile 0 weights used", 6: "tile 0 q loop done", 7: "tile 0 epilogue done",
           8: "tile 1 weights used", 9: "tile 1 q loop done", 10: "tile 1 epilogue done", 11: "tile 2 weights used",
           12: "tile 2 q loop done", 13: "tile 2 epilogue done", 14: "exit"}
DOWN = {0: "entry", 1: "tile found", 2: "loads issued", 3: "pdl_wait done", 4: "act staged", 5: "weights used",
        6: "q loop done", 7: "epilogue + tail done", 8: "2nd tile copies landed", 9: "2nd tile q loop done",
        10: "2nd tile epilogue done"}  # 8-10: moe_decode_mma_down2_kernel's second tiles


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))]


def main():
    path = sys.argv[1]
    only = int(sys.argv[sys.argv.index("--layer") + 1]) if "--layer" in sys.argv else None
    # data[slot][kernel][cta][event] = ns
    data = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(dict)))
    for r in csv.DictReader(open(path)):
        data[int(r["slot"])][int(r["kernel"])][int(r["cta"])][int(r["event"])] = int(r["ns"])
    slots = sorted(s for s in data if only is None or s == only)
    if not slots:
        sys.exit(f"{path}: no stamps")
    # Per slot: t0 = the earliest gate_up entry; each event's statistics over CTAs.
    stats = collections.defaultdict(list)  # (kernel, event) -> list of (min, p10, p50, p90, max, n) per slot
    qloop = collections.defaultdict(list)  # tile -> q loop µs (all CTAs, all slots)
    wait = collections.defaultdict(list)   # tile -> loads issued (or last epilogue) -> weights used, µs
    busy_curves = []
    down_wait, down_q = [], []
    arrivals = []
    tile_bytes = 16 * (2880 // 32) * 17  # 16 rows of 90 groups: 16-byte code words and a scale byte each
    if "--tile-bytes" in sys.argv:
        tile_bytes = int(sys.argv[sys.argv.index("--tile-bytes") + 1])
    for s in slots:
        gu, dn = data[s][0], data[s][1]
        if not gu:
            continue
        t0 = min(c[0] for c in gu.values() if 0 in c)
        for kernel, ctas, names in ((0, gu, GATE_UP), (1, dn, DOWN)):
            for ev in names:
                xs = [(c[ev] - t0) / 1000.0 for c in ctas.values() if ev in c]
                if xs:
                    stats[(kernel, ev)].append((min(xs), pct(xs, 0.1), pct(xs, 0.5), pct(xs, 0.9), max(xs), len(xs)))
        for c in gu.values():
            for i in range(3):
                u, q = 5 + 3 * i, 6 + 3 * i
                if u in c and q in c:
                    qloop[i].append((c[q] - c[u]) / 1000.0)
                before = 4 if i == 0 else 3 + 3 * i  # tile i's loads go out right after tile i - 1's q loop
                if u in c and before in c:
                    wait[i].append((c[u] - c[before]) / 1000.0)
        for c in dn.values():
            if 2 in c and 5 in c and 6 in c:
                down_wait.append((c[5] - c[2]) / 1000.0)
                down_q.append((c[6] - c[5]) / 1000.0)
        tw = statistics.median(c[1] for c in gu.values() if 1 in c)
        arrivals.append([(c[e] - tw) / 1000.0 for c in gu.values() for e in (5, 8, 11) if e in c])
        exits = sorted((c[14] - t0) / 1000.0 for c in gu.values() if 14 in c)
        busy_curves.append(exits)
    print(f"{path}: {len(slots)} layers; µs after the layer's first gate_up CTA entered (median over layers)")
    for kernel, names, title in ((0, GATE_UP, "gate_up loop kernel"), (1, DOWN, "down one-tile kernel")):
        print(f"\n{title}")
        print(f"  {'event':28s} {'CTAs':>5s} {'min':>7s} {'p10':>7s} {'p50':>7s} {'p90':>7s} {'max':>7s}")
        for ev, name in names.items():
            rows = stats.get((kernel, ev))
            if not rows:
                continue
            med = [statistics.median(r[k] for r in rows) for k in range(6)]
            print(f"  {name:28s} {med[5]:5.0f} {med[0]:7.2f} {med[1]:7.2f} {med[2]:7.2f} {med[3]:7.2f} {med[4]:7.2f}")
    print("\ngate_up tiles (all CTAs and layers): q loop µs, and the wait from the loads' issue to the weights' use")
    for i in sorted(qloop):
        q, w = qloop[i], wait.get(i, [])
        line = f"  tile {i}: {len(q):6d} q loops p10 {pct(q, 0.1):5.2f} p50 {pct(q, 0.5):5.2f} p90 {pct(q, 0.9):5.2f}"
        if w:
            line += f" | wait p10 {pct(w, 0.1):5.2f} p50 {pct(w, 0.5):5.2f} p90 {pct(w, 0.9):5.2f}"
        print(line)
    if down_q:
        print(f"down: q loop p10 {pct(down_q, 0.1):5.2f} p50 {pct(down_q, 0.5):5.2f} p90 {pct(down_q, 0.9):5.2f} | "
              f"loads issued -> weights used p10 {pct(down_wait, 0.1):5.2f} p50 {pct(down_wait, 0.5):5.2f} "
              f"p90 {pct(down_wait, 0.9):5.2f}")
    if arrivals:
        # Tiles whose weights were first used in each µs after pdl_wait returned, as TB/s of their bytes (a tile is
        # 16 rows × (G × 16 + G) bytes): when DRAM delivered, as the kernel saw it (a use can lag its arrival).
        print("\ngate_up tiles' weights used a µs after pdl_wait (median over layers), as TB/s of 16-row tiles:")
        end = int(max(max(x) for x in arrivals if x)) + 1
        line = []
        for t in range(0, end + 1):
            n = statistics.median(sum(1 for x in xs if t <= x < t + 1) for xs in arrivals)
            line.append(f"{t}:{n * tile_bytes / 1e6:.1f}")
        print("  " + " ".join(line))
    if busy_curves:
        print("\ngate_up CTAs still running (median over layers) at µs after the first entry:")
        end = max(max(b) for b in busy_curves if b)
        t = 0.0
        marks = []
        while t <= end + 1.0:
            marks.append((t, statistics.median(sum(1 for x in b if x > t) for b in busy_curves)))
            t += 1.0
        print("  " + " ".join(f"{t:.0f}:{n:.0f}" for t, n in marks))


if __name__ == "__main__":
    main()
