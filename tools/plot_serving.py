#!/usr/bin/env python3
"""Serving plot from `gptoss bench-serve --json` output (JSON lines; matplotlib, Debian: python3-matplotlib).

    /usr/bin/python3 tools/plot_serving.py serving_1024_1024.log serving_8192_1024.log --out DIR [--gpus 1]

Writes serving.png: total (prompt + generated) tok/s against concurrency, one line per file
(labelled with its prompt/generation lengths and weights), and the cost per million total tokens
at --price $/GPU-hour on a second axis. Prints the table it plotted.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read_lines(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                rows.append(json.loads(line))
    return sorted(rows, key=lambda r: r["concurrency"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", default=".")
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--price", type=float, default=3.0, help="$ per GPU-hour")
    ap.add_argument("--title", default="serving throughput")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 5))
    ax2 = ax.twinx()
    print("| run | concurrency | total tok/s | generated tok/s | mean TTFT s | $ / 1M total tok |")
    print("|---|---:|---:|---:|---:|---:|")
    for path in args.files:
        rows = read_lines(path)
        if not rows:
            raise SystemExit(f"{path}: no JSON lines")
        r0 = rows[0]
        label = f"{r0['prompt_len']} in / {r0['max_tokens']} out, {r0.get('weights', 'bf16')}, {r0.get('layout', '')}"
        x = [r["concurrency"] for r in rows]
        y = [r["total_tok_per_s"] for r in rows]
        cost = [args.price * args.gpus / (t * 3600.0) * 1e6 for t in y]
        line, = ax.plot(x, y, marker="o", label=label)
        ax2.plot(x, cost, marker="x", linestyle="--", color=line.get_color(), alpha=0.6)
        for r, c in zip(rows, cost):
            print(f"| {label} | {r['concurrency']} | {r['total_tok_per_s']:.0f} | {r['generated_tok_per_s']:.0f} | "
                  f"{r['mean_ttft_s']:.3f} | {c:.4f} |")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("total tok/s (prompt + generated), solid")
    ax2.set_ylabel("\\$ per 1M total tokens (at \\$%.2f/GPU-hour), dashed" % args.price)
    ax.set_title(args.title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(args.out, "serving.png")
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
