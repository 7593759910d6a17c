#!/usr/bin/env python3
"""What transformers makes of a gpt-oss config.json's rope fields: inverse frequencies and attention scaling.

    python3 tools/hf_rope_probe.py --out tests/data/hf_rope_cases.json

For each case below (the published 20b config.json with its rope fields changed) the config is written to a
directory, loaded with AutoConfig.from_pretrained (the path a checkpoint takes), and GptOssRotaryEmbedding is
built from it; its inv_freq and attention_scaling, or the error transformers raised, go to the JSON file.
tests/unit/model/rope_config_test.cpp parses the same config.json texts with the engine's parser and checks
that it computes the same values (or refuses the case with a clear error). Needs torch + transformers (the GPU
host has them); runs on the CPU in a few seconds.
"""
import argparse
import copy
import json
import os
import tempfile
import traceback

PUBLISHED = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "num_hidden_layers": 24,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "vocab_size": 201088,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "rope_theta": 150000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    },
    "initial_context_length": 4096,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "swiglu_limit": 7.0,
    "hidden_act": "silu",
    "attention_bias": True,
    "attention_dropout": 0.0,
    "tie_word_embeddings": False,
    "eos_token_id": 200002,
    "pad_token_id": 199999,
    "router_aux_loss_coef": 0.9,
    "output_router_logits": False,
    "use_cache": True,
    "initializer_range": 0.02,
    "torch_dtype": "bfloat16",
}


def variant(name, edit):
    c = copy.deepcopy(PUBLISHED)
    edit(c)
    return name, c


def rs(**kv):
    """An edit of rope_scaling: a value None removes the key."""

    def f(c):
        for k, v in kv.items():
            if v is None:
                c["rope_scaling"].pop(k, None)
            else:
                c["rope_scaling"][k] = v

    return f


def top(**kv):
    def f(c):
        for k, v in kv.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v

    return f


def both(*edits):
    def f(c):
        for e in edits:
            e(c)

    return f


def v5_form(c):  # transformers 5's spelling: rope_parameters holding rope_theta, no rope_scaling
    p = c.pop("rope_scaling")
    p["rope_theta"] = c.pop("rope_theta")
    c["rope_parameters"] = p


CASES = [
    variant("published", lambda c: None),
    variant("no_original_with_initial_context_length", rs(original_max_position_embeddings=None)),
    variant("no_original_no_initial_context_length",
            both(rs(original_max_position_embeddings=None), top(initial_context_length=None))),
    variant("no_original_initial_2048",
            both(rs(original_max_position_embeddings=None), top(initial_context_length=2048))),
    variant("max_pos_4096", top(max_position_embeddings=4096)),
    variant("max_pos_8192_original_1024", both(top(max_position_embeddings=8192), rs(original_max_position_embeddings=1024))),
    variant("attention_factor_1", rs(attention_factor=1.0)),
    variant("attention_factor_2_5", rs(attention_factor=2.5)),
    variant("mscale_both_0_707", rs(mscale=0.707, mscale_all_dim=0.707)),
    variant("mscale_1_all_dim_0", rs(mscale=1.0, mscale_all_dim=0.0)),
    variant("mscale_1_all_dim_0_5", rs(mscale=1.0, mscale_all_dim=0.5)),
    variant("mscale_only", rs(mscale=2.0)),
    variant("factor_1", rs(factor=1.0)),
    variant("factor_4_truncate", rs(factor=4.0, truncate=True)),
    variant("no_truncate_key", rs(truncate=None)),
    variant("no_betas", rs(beta_fast=None, beta_slow=None)),
    variant("beta_fast_0", rs(beta_fast=0)),
    variant("betas_16_2", rs(beta_fast=16.0, beta_slow=2.0)),
    variant("old_type_key", both(rs(rope_type=None), rs(type="yarn"))),
    variant("rope_parameters_v5", v5_form),
    variant("no_rope_scaling_theta_10000", top(rope_scaling=None, rope_theta=10000)),
    variant("no_rope_scaling_key", both(top(rope_theta=500000), lambda c: c.pop("rope_scaling"))),
    variant("theta_10000", top(rope_theta=10000)),
    variant("rope_scaling_null", lambda c: c.__setitem__("rope_scaling", None)),
    variant("rope_scaling_null_theta_10000", both(lambda c: c.__setitem__("rope_scaling", None), top(rope_theta=10000))),
    variant("default_type_in_rope_scaling", top(rope_scaling={"rope_type": "default"})),
    variant("default_type_in_rope_parameters",
            both(top(rope_scaling=None, rope_theta=None), top(rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))),
    variant("empty_rope_scaling", top(rope_scaling={})),
    variant("top_level_original_1024", top(original_max_position_embeddings=1024)),
    variant("top_level_original_1024_no_block", both(top(original_max_position_embeddings=1024), lambda c: c.pop("rope_scaling"))),
    variant("minimal_yarn_block", top(rope_scaling={"rope_type": "yarn", "factor": 8.0})),
    variant("factor_0_5", rs(factor=0.5)),
    variant("linear", top(rope_scaling={"rope_type": "linear", "factor": 2.0})),
    variant("partial_rotary_0_5", top(partial_rotary_factor=0.5)),
]


def probe(cfg):
    import torch
    from transformers import AutoConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        config = AutoConfig.from_pretrained(d)
        rope = GptOssRotaryEmbedding(config=config)
        inv = rope.inv_freq.detach().to(torch.float64).cpu().tolist()
        return {"inv_freq": inv, "attention_scaling": float(rope.attention_scaling),
                "rope_parameters": json.loads(json.dumps(getattr(config, "rope_parameters", None), default=str))}


def sources():
    import inspect
    from transformers import modeling_rope_utils as m

    return {"_compute_yarn_parameters": inspect.getsource(m._compute_yarn_parameters),
            "standardize_rope_params": inspect.getsource(m.RotaryEmbeddingConfigMixin.standardize_rope_params)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--with-source", action="store_true",
                    help="also store transformers' rope functions' source (for reading; not committed)")
    args = ap.parse_args()
    import transformers

    out = {"transformers": transformers.__version__,
           "generated_by": "python3 tools/hf_rope_probe.py --out tests/data/hf_rope_cases.json (on the GPU host, "
                           "transformers " + transformers.__version__ + ")",
           "cases": []}
    for name, cfg in CASES:
        row = {"name": name, "config": cfg}
        try:
            row.update(probe(cfg))
            row["ok"] = True
        except Exception as e:  # noqa: BLE001 - the error is the result
            row["ok"] = False
            row["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc(limit=3)
        out["cases"].append(row)
        print(name, row["attention_scaling"] if row["ok"] else "error: " + row["error"][:200])
    if args.with_source:
        out["source"] = sources()
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
