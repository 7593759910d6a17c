#!/usr/bin/env python3
"""Plots from `gptoss bench --json` reports (matplotlib; Debian: python3-matplotlib).

    python3 tools/plot_bench.py bench/results/2026-11-29_h200_r4/bench.json --out bench/results/2026-11-29_h200_r4

Writes decode.png (decode tok/s per user against cost per million output tokens, one line per
context length, points labelled by batch size) and prefill.png (prefill latency against input
length, with cost per million input tokens on a second axis). A peer report from
tools/bench_peer_transformers.py can be added with --peer for the prefill plot.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--peer", default="")
    ap.add_argument("--out", default=".")
    ap.add_argument("--title", default="gpt-oss-20b (random weights), one H200")
    args = ap.parse_args()
    with open(args.report) as f:
        rep = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    # One layout (older reports: at the top level) or several (`--layout` / `--sweep`: "runs").
    runs = [r for r in rep.get("runs", [rep]) if "error" not in r]
    many = len(runs) > 1
    price = rep["assumptions"].get("price_per_gpu_hour", 3.0)

    wrote = []
    if any(d.get("fits") for run in runs for d in run.get("decode", [])):
        wrote.append(plot_decode(runs, many, price, args))
    if any(run.get("prefill") for run in runs):
        wrote.append(plot_prefill(runs, args))
    print("wrote", " and ".join(wrote) if wrote else "nothing (no decode or prefill rows)")


def plot_decode(runs, many, price, args):
    """decode.png: tok/s per user against $ per 1M output tokens, a line per context."""
    fig, ax = plt.subplots(figsize=(7, 5))
    for run in runs:
        decode = [d for d in run.get("decode", []) if d.get("fits")]
        for ctx in sorted({d["context"] for d in decode}):
            pts = sorted((d for d in decode if d["context"] == ctx), key=lambda d: d["batch"])
            x = [d["tok_per_s_per_seq"] for d in pts]
            y = [d["usd_per_m_tokens"] for d in pts]
            label = f"{run.get('layout', '')} ctx {ctx}" if many else f"context {ctx}"
            ax.plot(x, y, marker="o", label=label)
            for d in pts:
                ax.annotate(str(d["batch"]), (d["tok_per_s_per_seq"], d["usd_per_m_tokens"]), fontsize=7,
                            textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel("decode tok/s per user")
    ax.set_ylabel("\\$ per 1M output tokens (at \\$%.2f/GPU-hour)" % price)
    ax.set_yscale("log")
    ax.set_title(args.title + ": decode (labels = batch size)", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7 if many else None)
    fig.tight_layout()
    path = os.path.join(args.out, "decode.png")
    fig.savefig(path, dpi=120)
    return path


def plot_prefill(runs, args):
    """prefill.png: latency against input length, $ per 1M input tokens on a second axis."""
    fig, ax = plt.subplots(figsize=(7, 5))
    for run in runs:
        pre = sorted(run.get("prefill", []), key=lambda d: d["tokens"])
        ax.plot([d["tokens"] for d in pre], [d["latency_ms"] for d in pre], marker="o",
                label=f"gptoss {run.get('layout', '')}".strip())
    pre = sorted(runs[0].get("prefill", []), key=lambda d: d["tokens"]) if runs else []
    if args.peer:
        with open(args.peer) as f:
            peer = json.load(f)
        pp = sorted((d for d in peer.get("prefill", []) if "latency_ms" in d), key=lambda d: d["tokens"])
        ax.plot([d["tokens"] for d in pp], [d["latency_ms"] for d in pp], marker="s", label="transformers (bf16, eager)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("input tokens (batch 1)")
    ax.set_ylabel("prefill latency (ms)")
    ax.set_title(args.title + ": prefill", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax2 = ax.twinx()
    ax2.plot([d["tokens"] for d in pre], [d["usd_per_m_tokens"] for d in pre], color="gray", linestyle=":",
             marker=".", label="\\$ / 1M input tokens")
    ax2.set_ylabel("\\$ per 1M input tokens (gptoss)")
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left")
    fig.tight_layout()
    path = os.path.join(args.out, "prefill.png")
    fig.savefig(path, dpi=120)
    return path


if __name__ == "__main__":
    main()
