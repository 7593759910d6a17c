#!/usr/bin/env python3
"""The peer in every benchmark report: Hugging Face transformers on the same checkpoint, prompts and
GPU, in the same run as `gptoss bench` (run on the H200 host).

Measures prefill latency (batch 1) at the given input lengths and batch-1 decode tok/s after a
prompt of --decode-context tokens, in bf16 with eager attention (transformers' only attention for
gpt-oss without hub kernels), MXFP4 experts dequantized to bf16 at load.

    python3 tools/bench_peer_transformers.py --model /tmp/verify/gpt-oss-20b --json peer.json
"""
import argparse
import json
import time

import torch


def timed(fn, repeats):
    times = []
    for r in range(repeats + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        if r > 0:
            times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prefill", default="128,1024,2048,8192")
    ap.add_argument("--decode-context", type=int, default=1024)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    from transformers import GptOssForCausalLM, Mxfp4Config
    model = GptOssForCausalLM.from_pretrained(args.model, quantization_config=Mxfp4Config(dequantize=True),
                                              attn_implementation="eager", dtype=torch.bfloat16,
                                              device_map="cuda").eval()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    report = {"peer": "transformers", "dtype": "bf16", "attention": "eager", "prefill": [], "decode": []}
    with torch.no_grad():
        for n in [int(x) for x in args.prefill.split(",") if x]:
            ids = torch.randint(0, vocab, (1, n), generator=g).cuda()
            try:
                t = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1), args.repeats)
                report["prefill"].append({"tokens": n, "latency_ms": t * 1e3, "tok_per_s": n / t})
            except torch.OutOfMemoryError:
                report["prefill"].append({"tokens": n, "error": "out of memory"})
                torch.cuda.empty_cache()
            print(json.dumps(report["prefill"][-1]), flush=True)
        ctx = args.decode_context
        ids = torch.randint(0, vocab, (1, ctx), generator=g).cuda()
        n_new = args.decode_tokens

        def gen(k):
            return lambda: model.generate(input_ids=ids, max_new_tokens=k, min_new_tokens=k, do_sample=False)
        t_prefill = timed(gen(1), args.repeats)
        t_total = timed(gen(n_new + 1), args.repeats)
        per_tok = (t_total - t_prefill) / n_new
        report["decode"].append({"context": ctx, "batch": 1, "step_ms": per_tok * 1e3, "tok_per_s": 1.0 / per_tok})
        print(json.dumps(report["decode"][-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
