#!/usr/bin/env python3
"""Full-size check of the CUDA backend against transformers (run on the H200 host).

Makes (or reuses) a random gpt-oss checkpoint in the published layout with `gptoss init-model`,
computes fp32 transformers logits for a few prompts (one longer than 1,000 tokens), runs
`gptoss logits --backend cuda` on the same files and prints, per prompt, the relative L2 error of
the logits (worst position, last position) and the top-1 agreement over all positions.

It first checks the committed tiny fixtures (tests/data/checkpoints/tiny_a, tiny_b: transformers fp32
logits stored in reference.safetensors) with `gptoss logits --backend cuda`, the same way.

    python3 tools/verify_full_size.py --gptoss build/gptoss --preset gpt-oss-20b --work /tmp/verify
    python3 tools/verify_full_size.py --gptoss build/gptoss --fixtures-only

Acceptance (issue 5): last-position relative L2 <= 2e-2 and top-1 agreement >= 99%, for every
prompt of the tiny fixtures and of the full-size checkpoint; printed as PASS/FAIL per part.
The full-size checkpoint is regenerated when the one in --work was made by another init (the
safetensors metadata "gptoss_init"; see src/model/random_checkpoint.h).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import torch
from safetensors import safe_open
from safetensors.torch import load_file

MAX_LAST_REL_L2 = 2e-2  # issue 5
MIN_TOP1 = 0.99
# --fp8: e4m3 keeps 3 mantissa bits, so each FP8 GEMM is off by ~2.7% (weight-only) to ~3.75% (W8A8)
# relative L2 on random data (tests/kernels/fp8_gemm_test.cpp); the bound allows a few of those.
FP8_MAX_LAST_REL_L2 = 0.1
FP8_MIN_TOP1 = 0.95
# --kv-fp8: e4m3 K/V (scale 1) on the bf16 path. In the real-width CUDA test it moved the logits
# by ~0.4% rel L2 on top of bf16's (worst 0.0075 against 0.0039, tests/kernels/cuda_model_test.cpp),
# so issue 5's bf16 bound with 1.5x room.
KV8_MAX_LAST_REL_L2 = 3e-2
EXPECTED_INIT = "conditioned-v1"  # write_random_checkpoint's default init
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(*a):
    print(*a, flush=True)


def compare(ours, ref):
    """Relative L2 per position and top-1 agreement of [T, V] logits against a reference."""
    diff = (ours.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1)
    return {"tokens": int(ref.shape[0]), "worst_rel_l2": diff.max().item(), "mean_rel_l2": diff.mean().item(),
            "last_rel_l2": diff[-1].item(), "top1_agreement": (ours.argmax(-1) == ref.argmax(-1)).double().mean().item()}


def passes(r):
    if r.get("model", "").endswith(" kv-fp8"):
        return r["last_rel_l2"] <= KV8_MAX_LAST_REL_L2 and r["top1_agreement"] >= MIN_TOP1
    if r.get("model", "").endswith(" fp8"):
        return r["last_rel_l2"] <= FP8_MAX_LAST_REL_L2 and r["top1_agreement"] >= FP8_MIN_TOP1
    return r["last_rel_l2"] <= MAX_LAST_REL_L2 and r["top1_agreement"] >= MIN_TOP1


def run_logits(gptoss, model_dir, ids, out, backend="cuda", extra=()):
    subprocess.run([gptoss, "logits", "--backend", backend, "--model", model_dir, "--positions", "all",
                    "--ids", ",".join(str(int(x)) for x in ids), "--out", out, *extra], check=True)
    return load_file(out)["logits"]


def print_table(rows):
    log("| model | tokens | worst rel L2 | mean rel L2 | last rel L2 | top-1 agreement | |")
    log("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        log(f"| {r.get('model', '')} | {r['tokens']} | {r['worst_rel_l2']:.3g} | {r['mean_rel_l2']:.3g} | "
            f"{r['last_rel_l2']:.3g} | {100 * r['top1_agreement']:.2f}% | {'ok' if passes(r) else 'FAIL'} |")


def check_fixtures(args):
    """CUDA backend against the transformers fp32 logits stored with the committed tiny fixtures."""
    rows = []
    for name in args.fixtures.split(","):
        ckdir = os.path.join(args.fixtures_dir, name)
        ref = load_file(os.path.join(ckdir, "reference.safetensors"))
        i = 0
        while f"prompt{i}.ids" in ref:
            ids, ref_logits = ref[f"prompt{i}.ids"], ref[f"prompt{i}.logits"].float()
            ours = run_logits(args.gptoss, ckdir, ids, os.path.join(args.work, f"fixture_{name}_{i}.safetensors"))
            r = dict(compare(ours, ref_logits), model=name, prompt=i)
            rows.append(r)
            log(json.dumps(r))
            i += 1
    ok = bool(rows) and all(passes(r) for r in rows)
    print_table(rows)
    log(f"ISSUE 5 tiny fixtures ({args.fixtures}, CUDA vs transformers fp32): {'PASS' if ok else 'FAIL'}"
        f" (last rel L2 <= {MAX_LAST_REL_L2}, top-1 >= {100 * MIN_TOP1:.0f}% for every prompt)")
    return rows, ok


def checkpoint_init(model_dir):
    """The "gptoss_init" metadata of an init-model checkpoint ("" when absent or unreadable)."""
    try:
        files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
        with safe_open(os.path.join(model_dir, files[0]), framework="pt") as f:
            return (f.metadata() or {}).get("gptoss_init", "")
    except Exception:  # noqa: BLE001 - a missing or foreign checkpoint is simply regenerated
        return ""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gptoss", required=True)
    ap.add_argument("--preset", default="gpt-oss-20b")
    ap.add_argument("--work", default="/tmp/verify")
    ap.add_argument("--lengths", default="32,300,1100")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", default="")
    ap.add_argument("--fixtures", default="tiny_a,tiny_b", help="committed fixtures to check ('' = none)")
    ap.add_argument("--fixtures-dir", default=os.path.join(REPO, "tests", "data", "checkpoints"))
    ap.add_argument("--fixtures-only", action="store_true", help="check the tiny fixtures only")
    ap.add_argument("--fp8", action="store_true",
                    help=f"also run `gptoss logits --fp8` (bound: last rel L2 <= {FP8_MAX_LAST_REL_L2}, "
                         f"top-1 >= {100 * FP8_MIN_TOP1:.0f}%%)")
    ap.add_argument("--kv-fp8", action="store_true",
                    help=f"also run `gptoss logits --kv-cache-dtype fp8` (bound: last rel L2 <= "
                         f"{KV8_MAX_LAST_REL_L2}, top-1 >= {100 * MIN_TOP1:.0f}%%)")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    fixture_rows, fixtures_ok = check_fixtures(args) if args.fixtures else ([], True)
    if args.fixtures_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"fixtures": fixture_rows, "fixtures_ok": fixtures_ok, "ok": fixtures_ok}, f, indent=2)
        return 0 if fixtures_ok else 1
    model_dir = os.path.join(args.work, args.preset)
    have = os.path.exists(os.path.join(model_dir, "config.json"))
    if have and checkpoint_init(model_dir) != EXPECTED_INIT:
        log(f"{model_dir} was made by init '{checkpoint_init(model_dir) or 'unknown'}', not '{EXPECTED_INIT}':"
            " regenerating")
        shutil.rmtree(model_dir)
        have = False
    if not have:
        t0 = time.time()
        subprocess.run([args.gptoss, "init-model", "--preset", args.preset, "--out", model_dir,
                        "--seed", str(args.seed)], check=True)
        log(f"init-model {args.preset}: {time.time() - t0:.1f} s")

    from transformers import GptOssForCausalLM, Mxfp4Config
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    model = GptOssForCausalLM.from_pretrained(model_dir, quantization_config=Mxfp4Config(dequantize=True),
                                              attn_implementation="eager", dtype=torch.bfloat16,
                                              device_map="cuda")
    model = model.float().eval()
    log(f"transformers load + fp32: {time.time() - t0:.1f} s")
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(args.seed)
    prompts = [torch.randint(0, vocab, (int(n),), generator=g) for n in args.lengths.split(",")]
    refs = []
    with torch.no_grad():
        for ids in prompts:
            t0 = time.time()
            logits = model(input_ids=ids[None].cuda(), use_cache=False).logits[0].float().cpu()
            refs.append(logits)
            log(f"transformers fp32 prompt of {len(ids)}: {time.time() - t0:.1f} s")
    # The precision floor: transformers itself in bf16 against its fp32 logits.
    floor = []
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        for i, ids in enumerate(prompts):
            lb = model(input_ids=ids[None].cuda(), use_cache=False).logits[0].float().cpu()
            d = (lb.double() - refs[i].double()).norm(dim=-1) / refs[i].double().norm(dim=-1)
            floor.append({"tokens": len(ids), "last_rel_l2": d[-1].item(), "worst_rel_l2": d.max().item(),
                          "top1_agreement": (lb.argmax(-1) == refs[i].argmax(-1)).double().mean().item()})
            log("transformers bf16 vs fp32:", json.dumps(floor[-1]))
    del model
    torch.cuda.empty_cache()

    # Our CPU backend (fp32) on the shortest prompt: checks the checkpoint is read the same way.
    ids0 = prompts[0]
    out0 = os.path.join(args.work, "cpu_0.safetensors")
    t0 = time.time()
    subprocess.run([args.gptoss, "logits", "--backend", "cpu", "--model", model_dir, "--positions", "all",
                    "--ids", ",".join(str(int(x)) for x in ids0), "--out", out0], check=True)
    cpu0 = load_file(out0)["logits"]
    dcpu = (cpu0.double() - refs[0].double()).norm(dim=-1) / refs[0].double().norm(dim=-1)
    log(f"cpu backend vs transformers fp32 ({len(ids0)} tokens, {time.time() - t0:.1f} s): worst rel L2 "
        f"{dcpu.max().item():.3g}, top-1 agreement {(cpu0.argmax(-1) == refs[0].argmax(-1)).double().mean().item():.4f}")

    results = []
    for i, ids in enumerate(prompts):
        t0 = time.time()
        ours = run_logits(args.gptoss, model_dir, ids, os.path.join(args.work, f"ours_{i}.safetensors"))
        r = dict(compare(ours, refs[i]), model=args.preset, seconds=time.time() - t0)
        results.append(r)
        log(json.dumps(r))
    full_ok = all(passes(r) for r in results)
    fp8_results = []
    if args.fp8:  # FP8 weights (QKV, O, lm_head quantized from bf16; W8A8 experts in prefill)
        for i, ids in enumerate(prompts):
            t0 = time.time()
            ours = run_logits(args.gptoss, model_dir, ids, os.path.join(args.work, f"ours_fp8_{i}.safetensors"),
                              extra=("--fp8",))
            r = dict(compare(ours, refs[i]), model=args.preset + " fp8", seconds=time.time() - t0)
            fp8_results.append(r)
            log(json.dumps(r))
        fp8_ok = all(r["last_rel_l2"] <= FP8_MAX_LAST_REL_L2 and r["top1_agreement"] >= FP8_MIN_TOP1
                     for r in fp8_results)
        log(f"FP8 {args.preset} (CUDA --fp8 vs transformers fp32): {'PASS' if fp8_ok else 'FAIL'} "
            f"(last rel L2 <= {FP8_MAX_LAST_REL_L2}, top-1 >= {100 * FP8_MIN_TOP1:.0f}%)")
        full_ok = full_ok and fp8_ok
    kv8_results = []
    if args.kv_fp8:  # the FP8 (e4m3) KV cache on the bf16 weights
        for i, ids in enumerate(prompts):
            t0 = time.time()
            ours = run_logits(args.gptoss, model_dir, ids, os.path.join(args.work, f"ours_kv8_{i}.safetensors"),
                              extra=("--kv-cache-dtype", "fp8"))
            r = dict(compare(ours, refs[i]), model=args.preset + " kv-fp8", seconds=time.time() - t0)
            kv8_results.append(r)
            log(json.dumps(r))
        kv8_ok = all(r["last_rel_l2"] <= KV8_MAX_LAST_REL_L2 and r["top1_agreement"] >= MIN_TOP1
                     for r in kv8_results)
        log(f"FP8 KV cache {args.preset} (CUDA --kv-cache-dtype fp8 vs transformers fp32): "
            f"{'PASS' if kv8_ok else 'FAIL'} (last rel L2 <= {KV8_MAX_LAST_REL_L2}, top-1 >= {100 * MIN_TOP1:.0f}%)")
        full_ok = full_ok and kv8_ok
    print_table(fixture_rows + results + fp8_results + kv8_results)
    if args.fixtures:
        log(f"ISSUE 5 tiny fixtures ({args.fixtures}, CUDA vs transformers fp32): {'PASS' if fixtures_ok else 'FAIL'}")
    log(f"ISSUE 5 {args.preset} ({checkpoint_init(model_dir) or 'unknown init'}, CUDA vs transformers fp32): "
        f"{'PASS' if full_ok else 'FAIL'} (last rel L2 <= {MAX_LAST_REL_L2}, top-1 >= {100 * MIN_TOP1:.0f}% for every prompt)")
    ok = full_ok and fixtures_ok
    log("RESULT:", "ok" if ok else "FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"preset": args.preset, "init": checkpoint_init(model_dir), "results": results,
                       "fp8_results": fp8_results, "kv_fp8_results": kv8_results,
                       "bf16_floor": floor, "cpu_vs_transformers_worst_rel_l2": dcpu.max().item(),
                       "fixtures": fixture_rows, "fixtures_ok": fixtures_ok, "full_ok": full_ok, "ok": ok},
                      f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
