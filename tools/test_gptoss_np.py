"""Unit tests for tools/gptoss_np.py. Needs numpy only:  python3 tools/test_gptoss_np.py"""
import math
import os
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptoss_np as G  # noqa: E402


class Mxfp4Tests(unittest.TestCase):
    def test_worked_example_from_spec(self):
        # MODEL.md section 3: bytes 2F 91 70 08 with scale 0x7E decode to these 8 elements.
        blocks = np.zeros((1, 1, 16), np.uint8)
        blocks[0, 0, :4] = [0x2F, 0x91, 0x70, 0x08]
        scales = np.array([[0x7E]], np.uint8)
        v = G.dequantize_mxfp4(blocks, scales)[0]
        want = [-3.0, 0.5, 0.25, -0.25, 0.0, 3.0, -0.0, 0.0]
        self.assertEqual(v[:8].tolist(), want)
        self.assertTrue(math.copysign(1.0, v[6]) < 0)  # code 8 is -0.0
        self.assertEqual(G.dequantize_mxfp4_slow(blocks, scales)[0, :8].tolist(), want)

    def test_nibble_order_low_is_even(self):
        blocks = np.zeros((1, 16), np.uint8)
        blocks[0, 0] = 0x72  # low nibble 2 (+1.0) -> element 0, high nibble 7 (+6.0) -> element 1
        v = G.dequantize_mxfp4(blocks, np.array([127], np.uint8))
        self.assertEqual(v[:2].tolist(), [1.0, 6.0])

    def test_fast_equals_slow_decoder(self):
        rng = np.random.default_rng(0)
        blocks = rng.integers(0, 256, size=(3, 5, 4, 16), dtype=np.uint8)
        scales = rng.integers(100, 150, size=(3, 5, 4), dtype=np.uint8)
        a = G.dequantize_mxfp4(blocks, scales)
        b = G.dequantize_mxfp4_slow(blocks, scales)
        self.assertEqual(a.shape, (3, 5, 128))
        np.testing.assert_array_equal(a, b)

    def test_representable_roundtrip(self):
        rng = np.random.default_rng(1)
        codes = rng.integers(0, 16, size=(6, 7, 64))
        codes[..., 0] = rng.choice([6, 7, 14, 15], size=codes.shape[:-1])  # a +-4 or +-6 in every group
        codes[..., 32] = rng.choice([6, 7, 14, 15], size=codes.shape[:-1])
        s = rng.integers(110, 140, size=(6, 7, 2))
        w = np.ldexp(G.FP4_VALUES[codes], np.repeat(s, 32, axis=-1) - 127)
        blocks, scales = G.quantize_mxfp4(w)
        self.assertEqual(blocks.shape, (6, 7, 2, 16))
        self.assertEqual(scales.shape, (6, 7, 2))
        np.testing.assert_array_equal(scales, s.astype(np.uint8))
        np.testing.assert_array_equal(G.dequantize_mxfp4(blocks, scales), w)
        # bytes identical up to the sign of zero
        c = np.zeros(codes.shape, np.int64)
        c[..., 0::2] = blocks.reshape(6, 7, 32) & 15
        c[..., 1::2] = blocks.reshape(6, 7, 32) >> 4
        np.testing.assert_array_equal(c & 7, codes & 7)
        nz = (codes & 7) != 0
        np.testing.assert_array_equal(c[nz], codes[nz])

    def test_scale_rule_and_nearest(self):
        rng = np.random.default_rng(2)
        w = rng.normal(size=(40, 96)) * np.exp2(rng.integers(-12, 6, size=(40, 1)))
        blocks, scales = G.quantize_mxfp4(w)
        deq = G.dequantize_mxfp4(blocks, scales)
        grp = w.reshape(40, 3, 32)
        amax = np.abs(grp).max(-1)
        e = np.floor(np.log2(amax)) - 2
        np.testing.assert_array_equal(scales.astype(np.int64), e + 127)
        # every value is a nearest table value (brute force over all 16 codes)
        sc = np.exp2(np.repeat(e, 32, axis=-1)).reshape(40, 96)
        cand = G.FP4_VALUES[None, None, :] * sc[..., None]
        best = np.abs(cand - w[..., None]).min(-1)
        np.testing.assert_allclose(np.abs(deq - w), best, rtol=0, atol=1e-300)
        rel = np.sqrt(((deq - w) ** 2).sum() / (w ** 2).sum())
        self.assertLess(rel, 0.2)

    def test_edge_cases(self):
        w = np.zeros((4, 32))
        w[1, :] = 1e-3  # tiny
        w[1, 5] = -1e-9  # rounds to -0 -> code 8
        w[2, :] = np.linspace(-7.9, 7.9, 32)  # amax in [4, 8): scale 2^0, |x| > 6 saturates
        w[3, :] = 0.75  # a tie between 0.5 and 1.0 at scale 2^-2 -> 3.0: no tie; use an exact tie below
        w[3, 0] = 1.0  # amax 1 -> e = -2 -> 0.75 * 4 = 3.0 exactly
        w[3, 1] = 1.25 / 4  # 1.25 is a tie between 1.0 (code 2) and 1.5 (code 3): even code 2
        w[3, 2] = 2.5 / 4  # tie between 2 (code 4) and 3 (code 5): code 4
        w[3, 3] = 5.0 / 4  # tie between 4 (code 6) and 6 (code 7): code 6
        w[3, 4] = 0.25 / 4  # tie between 0 and 0.5: code 0
        blocks, scales = G.quantize_mxfp4(w)
        self.assertEqual(scales[0, 0], 0)  # all-zero group -> e = -127
        self.assertTrue(np.all(blocks[0] == 0))
        self.assertEqual(int(blocks[1, 0, 2] >> 4), 8)  # element 5 = high nibble of byte 2 -> code 8 (-0)
        self.assertIn(int(blocks[1, 0, 2] & 15), (6, 7))  # element 4 = 1e-3 = amax -> 4 or 6 times 2^e
        self.assertEqual(scales[2, 0], 127)
        deq = G.dequantize_mxfp4(blocks, scales)
        self.assertEqual(deq[2, 0], -6.0)
        self.assertEqual(deq[2, 31], 6.0)
        self.assertEqual(scales[3, 0], 125)
        self.assertEqual(deq[3, 1:5].tolist(), [0.25, 0.5, 1.0, 0.0])
        self.assertEqual(deq[3, 5], 0.75)

    def test_orientation_groups_run_along_last_axis(self):
        # A row whose first 32 inputs are large and the rest small must get two different scales:
        # amax 3 -> e = 1 - 2 = -1 (byte 126); amax 0.01 -> e = -7 - 2 = -9 (byte 118).
        w = np.concatenate([np.full(32, 3.0), np.full(32, 0.01)])[None]
        _, scales = G.quantize_mxfp4(w)
        self.assertEqual(scales.tolist(), [[126, 118]])


class Bf16Tests(unittest.TestCase):
    def test_rounding(self):
        x = np.array([1.0, 1.0 + 2 ** -8, 1.0 + 3 * 2 ** -8, -2.5, 3.0e-39, 65504.0], np.float32)
        r = G.round_to_bf16(x)
        self.assertEqual(r[0], 1.0)
        self.assertEqual(r[1], 1.0)  # tie -> even
        self.assertEqual(r[2], 1.0 + 2 ** -6)  # tie -> even (up)
        self.assertEqual(r[3], -2.5)
        self.assertEqual(r[5], 65536.0)
        # every FP4 value times any normal power of two is exact in bf16
        v = np.ldexp(G.FP4_VALUES[None, :], np.arange(-120, 120)[:, None])
        np.testing.assert_array_equal(G.round_to_bf16(v), v)


class SafetensorsTests(unittest.TestCase):
    def test_roundtrip(self):
        rng = np.random.default_rng(3)
        a = rng.normal(size=(3, 5)).astype(np.float32)
        b = rng.integers(0, 256, size=(2, 3, 16), dtype=np.uint8)
        c = G.f32_to_bf16_bits(rng.normal(size=(7,)))
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.safetensors")
            G.st_write_minimal(p, {"a": ("F32", a), "b": ("U8", b), "c": ("BF16", c)}, {"format": "pt"})
            hdr = G.st_read_header(p)
            self.assertEqual(hdr[1], {"format": "pt"})
            self.assertEqual(hdr[0]["b"]["shape"], [2, 3, 16])
            np.testing.assert_array_equal(G.st_read_tensor(p, "a", hdr), a)
            np.testing.assert_array_equal(G.st_read_tensor(p, "b", hdr), b)
            np.testing.assert_array_equal(G.st_read_tensor(p, "c", hdr), G.bf16_bits_to_f32(c))


def _loop_forward(W, d, ids):
    """Second, loop-based implementation (in the style of shared/spec/hf_probe.py)."""
    T = len(ids)
    nh, nkv, hd, K = d["nh"], d["nkv"], d["hd"], d["K"]
    x = W["model.embed_tokens.weight"][ids].astype(np.float64)
    inv, conc = G.yarn_inv_freq(d)

    def rms(v, w):
        return v / np.sqrt(np.mean(v * v, -1, keepdims=True) + d["eps"]) * w

    def rot(vec, pos):
        a, b = vec[: hd // 2], vec[hd // 2:]
        c, s = np.cos(pos * inv) * conc, np.sin(pos * inv) * conc
        return np.concatenate([a * c - b * s, b * c + a * s])

    for l in range(d["L"]):
        p = f"model.layers.{l}."
        h = rms(x, W[p + "input_layernorm.weight"])
        q = h @ W[p + "self_attn.q_proj.weight"].T + W[p + "self_attn.q_proj.bias"]
        k = h @ W[p + "self_attn.k_proj.weight"].T + W[p + "self_attn.k_proj.bias"]
        v = h @ W[p + "self_attn.v_proj.weight"].T + W[p + "self_attn.v_proj.bias"]
        o = np.zeros((T, nh * hd))
        for i in range(T):
            for hh in range(nh):
                kv = hh // (nh // nkv)
                qi = rot(q[i, hh * hd:(hh + 1) * hd], i)
                logits, vals = [], []
                for j in range(i + 1):
                    if l % 2 == 0 and j <= i - d["window"]:
                        continue
                    kj = rot(k[j, kv * hd:(kv + 1) * hd], j)
                    logits.append(qi @ kj / 8.0)
                    vals.append(v[j, kv * hd:(kv + 1) * hd])
                sink = W[p + "self_attn.sinks"][hh]
                m = max(max(logits), sink)
                ex = np.exp(np.array(logits) - m)
                den = ex.sum() + math.exp(sink - m)
                o[i, hh * hd:(hh + 1) * hd] = (ex[:, None] * np.array(vals)).sum(0) / den
        x = x + o @ W[p + "self_attn.o_proj.weight"].T + W[p + "self_attn.o_proj.bias"]
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        rl = h @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]
        acc = np.zeros_like(x)
        for t in range(T):
            top = sorted(range(d["E"]), key=lambda e_: -rl[t, e_])[:K]
            wts = np.exp(rl[t, top] - rl[t, top].max())
            wts /= wts.sum()
            for e_, wt in zip(top, wts):
                gu = W[p + "mlp.experts.gate_up_proj"][e_] @ h[t] + W[p + "mlp.experts.gate_up_proj_bias"][e_]
                g = np.minimum(gu[0::2], 7.0)
                u = np.clip(gu[1::2], -7.0, 7.0)
                a = (u + 1.0) * g * (1.0 / (1.0 + np.exp(-1.702 * g)))
                acc[t] += wt * (W[p + "mlp.experts.down_proj"][e_] @ a + W[p + "mlp.experts.down_proj_bias"][e_])
        x = x + acc
    return rms(x, W["model.norm.weight"]) @ W["lm_head.weight"].T


class ForwardTests(unittest.TestCase):
    CFG = {"num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 64, "num_local_experts": 6, "num_experts_per_tok": 4,
           "vocab_size": 50, "sliding_window": 4, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0,
           "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                            "truncate": False, "original_max_position_embeddings": 4096},
           "rope_theta": 150000}

    def test_yarn_check_values(self):
        d = G.model_dims(self.CFG)
        inv, conc = G.yarn_inv_freq(d)
        self.assertAlmostEqual(conc, 1.3465735902799727, places=14)
        want = {0: 1.0, 8: 5.081327e-2, 9: 3.170570e-2, 12: 6.794959e-3, 17: 1.293187e-4,
                18: 3.830881e-5, 31: 3.023511e-7}
        for i, v in want.items():
            self.assertLess(abs(inv[i] - v) / v, 2e-6, (i, inv[i], v))

    def test_vectorized_equals_loops(self):
        d = G.model_dims(self.CFG)
        self.assertEqual(d["layer_types"], ["sliding_attention", "full_attention", "sliding_attention"])
        rng = np.random.default_rng(4)
        W = {}
        for n, s in G.param_shapes(d, "disk").items():
            if n.endswith("norm.weight") or "layernorm" in n:
                W[n] = 1 + 0.2 * rng.normal(size=s)
            elif n.endswith("sinks"):
                W[n] = 2 * rng.normal(size=s)
            elif n.endswith("bias"):
                W[n] = 0.1 * rng.normal(size=s)
            elif "embed" in n:
                W[n] = rng.normal(size=s)
            elif n.endswith("gate_up_proj"):
                W[n] = 4 * rng.normal(size=s) / math.sqrt(s[-1])
            else:
                W[n] = rng.normal(size=s) / math.sqrt(s[-1])
        ids = rng.integers(0, d["V"], size=11)
        a = G.forward(W, d, ids, collect=True)
        b = _loop_forward(W, d, ids)
        np.testing.assert_allclose(a["logits"], b, rtol=0, atol=1e-10)
        self.assertGreater(a["n_gate_clamped"], 0)
        self.assertEqual(len(a["layer_out"]), 3)
        self.assertEqual(a["topk"][0].shape, (11, 4))
        # a window bug must show: all-full attention differs
        d2 = dict(d, layer_types=["full_attention"] * 3)
        c = G.forward(W, d2, ids)
        self.assertGreater(np.abs(c["logits"] - b).max(), 1e-3)


if __name__ == "__main__":
    unittest.main(verbosity=2)
