"""Pure-numpy pieces shared by the fixture tools (no torch needed).

Everything here follows shared/spec/MODEL.md:
  * MXFP4 (section 3): FP4 E2M1 table, low nibble = even element, E8M0 scale with bias 127,
    blocks [..., rows, K/32, 16] / scales [..., rows, K/32] with K the *input* dimension.
  * the forward pass (section 4) as an independent float64 reference: RMSNorm, YaRN (half-split
    rotation, concentration on cos and sin), GQA with sinks and the sliding window on the layers
    that config.layer_types marks "sliding_attention", router top-k then softmax, interleaved
    clamped SwiGLU with (up + 1).
  * a minimal safetensors reader used to check what was written, independently of the
    `safetensors` package.

Unit tests: python3 tools/test_gptoss_np.py (numpy only).
"""
import json
import math
import struct

import numpy as np

# FP4 E2M1 code -> value (MODEL.md section 3). Code 8 is -0.0.
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float64,
)
_FP4_MAG = FP4_VALUES[:8]


# --------------------------------------------------------------------------------------------
# MXFP4
# --------------------------------------------------------------------------------------------
def quantize_mxfp4(w):
    """Quantize w [..., K] (K a multiple of 32, along the LAST = input dimension) to MXFP4.

    OCP convention (MODEL.md section 3): per 32-group, e = floor(log2(max|x|)) - 2 (exactly,
    via frexp), scale byte s = e + 127; each x * 2^-e is rounded to the nearest FP4 magnitude
    (ties to the even code, i.e. round-half-even on the mantissa bit), saturating at 6; the sign
    goes to bit 3 (so a small negative value becomes code 8 = -0). All-zero groups get e = -127
    (scale byte 0) and codes 0. e is clamped to [-127, 127].
    Returns (blocks uint8 [..., K/32, 16], scales uint8 [..., K/32]).
    Byte b of a group holds element 2b in its low nibble and element 2b+1 in its high nibble.
    """
    w = np.asarray(w, dtype=np.float64)
    assert w.ndim >= 1 and w.shape[-1] % 32 == 0, w.shape
    assert np.all(np.isfinite(w))
    pre = w.shape[:-1]
    G = w.shape[-1] // 32
    g = w.reshape(*pre, G, 32)
    amax = np.abs(g).max(-1)
    _, ex = np.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1)  =>  floor(log2(amax)) = ex - 1
    e = np.where(amax > 0, ex.astype(np.int64) - 1 - 2, -127)
    e = np.clip(e, -127, 127)
    a = np.abs(np.ldexp(g, -e[..., None]))
    dist = np.abs(a[..., None] - _FP4_MAG)  # [..., G, 32, 8]
    idx = dist.argmin(-1)  # first minimum = lower code on ties
    # ties between code i (odd) and i+1 (even): pick the even code (round half to even)
    nxt = np.minimum(idx + 1, 7)
    d_idx = np.take_along_axis(dist, idx[..., None], -1)[..., 0]
    d_nxt = np.take_along_axis(dist, nxt[..., None], -1)[..., 0]
    idx = np.where((idx % 2 == 1) & (nxt != idx) & (d_nxt == d_idx), nxt, idx)
    codes = (idx | np.where(g < 0, 8, 0)).astype(np.uint8)
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    scales = (e + 127).astype(np.uint8)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(scales)


def dequantize_mxfp4(blocks, scales):
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> float64 [..., G*32]."""
    blocks = np.asarray(blocks)
    scales = np.asarray(scales)
    assert blocks.dtype == np.uint8 and scales.dtype == np.uint8
    assert blocks.shape[-1] == 16 and blocks.shape[:-1] == scales.shape, (blocks.shape, scales.shape)
    lo = FP4_VALUES[blocks & 0x0F]
    hi = FP4_VALUES[blocks >> 4]
    vals = np.stack([lo, hi], -1).reshape(*blocks.shape[:-1], 32)
    vals = np.ldexp(vals, scales.astype(np.int64)[..., None] - 127)
    return vals.reshape(*blocks.shape[:-2], blocks.shape[-2] * 32)


def dequantize_mxfp4_slow(blocks, scales):
    """Element-by-element decoder written from MODEL.md's flat-offset formula (for tests)."""
    blocks = np.asarray(blocks)
    scales = np.asarray(scales)
    R = int(np.prod(blocks.shape[:-2]))
    G = blocks.shape[-2]
    fb = blocks.reshape(-1).tolist()
    fs = scales.reshape(-1).tolist()
    out = np.zeros((R, G * 32))
    for r in range(R):
        for g in range(G):
            S = fs[r * G + g]
            for b in range(16):
                B = fb[(r * G + g) * 16 + b]
                out[r, 32 * g + 2 * b] = math.ldexp(float(FP4_VALUES[B & 15]), S - 127)
                out[r, 32 * g + 2 * b + 1] = math.ldexp(float(FP4_VALUES[B >> 4]), S - 127)
    return out.reshape(*blocks.shape[:-2], G * 32)


# --------------------------------------------------------------------------------------------
# bf16 helpers (numpy has no bf16 dtype)
# --------------------------------------------------------------------------------------------
def f32_to_bf16_bits(x):
    """float -> uint16 bf16 bit patterns, round to nearest even (finite inputs)."""
    b = np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_bits_to_f32(u16):
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to_bf16(x):
    return bf16_bits_to_f32(f32_to_bf16_bits(x)).astype(np.float64)


# --------------------------------------------------------------------------------------------
# safetensors (read-only, plus a tiny writer for the unit tests)
# --------------------------------------------------------------------------------------------
ST_DTYPES = {"BF16": (np.uint16, 2), "F16": (np.float16, 2), "F32": (np.float32, 4), "F64": (np.float64, 8),
             "U8": (np.uint8, 1), "I8": (np.int8, 1), "I16": (np.int16, 2), "I32": (np.int32, 4),
             "I64": (np.int64, 8), "BOOL": (np.bool_, 1)}


def st_read_header(path):
    """Returns (header dict without __metadata__, metadata dict or None, data_start offset).
    Also checks that the tensors tile the data section exactly (no gaps, no overlap)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        (n,) = struct.unpack("<Q", raw)
        hdr = json.loads(f.read(n).decode("utf-8"))
        f.seek(0, 2)
        size = f.tell()
    meta = hdr.pop("__metadata__", None)
    start = 8 + n
    spans = []
    for name, t in hdr.items():
        dt, shp, (b, e) = t["dtype"], t["shape"], t["data_offsets"]
        assert dt in ST_DTYPES, (path, name, dt)
        nbytes = ST_DTYPES[dt][1] * int(np.prod(shp, dtype=np.int64))
        assert e - b == nbytes, (path, name, dt, shp, b, e)
        spans.append((b, e, name))
    spans.sort()
    pos = 0
    for b, e, name in spans:
        assert b == pos, f"{path}: gap/overlap before {name} ({b} != {pos})"
        pos = e
    assert start + pos == size, f"{path}: data section {pos} B but file has {size - start} B after header"
    return hdr, meta, start


def st_read_tensor(path, name, header=None):
    """Reads one tensor as numpy. BF16 is returned as float32 values (exact)."""
    if header is None:
        header = st_read_header(path)
    hdr, _, start = header
    t = hdr[name]
    np_dt, _ = ST_DTYPES[t["dtype"]]
    b, e = t["data_offsets"]
    with open(path, "rb") as f:
        f.seek(start + b)
        buf = f.read(e - b)
    a = np.frombuffer(buf, dtype=np.dtype(np_dt).newbyteorder("<")).reshape(t["shape"])
    if t["dtype"] == "BF16":
        return bf16_bits_to_f32(a)
    return a.astype(np_dt)


def st_write_minimal(path, tensors, metadata=None):
    """Tiny safetensors writer (tests only). tensors: name -> (dtype string, numpy array)."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    off = 0
    blobs = []
    for name in sorted(tensors):
        dt, arr = tensors[name]
        raw = np.ascontiguousarray(arr).astype(np.dtype(ST_DTYPES[dt][0]).newbyteorder("<")).tobytes()
        hdr[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        blobs.append(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for raw in blobs:
            f.write(raw)


# --------------------------------------------------------------------------------------------
# Model description and the float64 reference forward
# --------------------------------------------------------------------------------------------
def model_dims(cfg):
    """cfg: a config.json-like dict (either spelling). Returns a flat dict of what the math needs."""
    rp = cfg.get("rope_parameters") or {}
    rs = cfg.get("rope_scaling") or {}
    r = dict(rs)
    r.update(rp)
    theta = r.get("rope_theta", cfg.get("rope_theta"))
    L = cfg["num_hidden_layers"]
    lt = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(L)]
    return dict(
        L=L, H=cfg["hidden_size"], I=cfg["intermediate_size"], nh=cfg["num_attention_heads"],
        nkv=cfg["num_key_value_heads"], hd=cfg["head_dim"], E=cfg["num_local_experts"],
        K=cfg["num_experts_per_tok"], V=cfg["vocab_size"], window=cfg["sliding_window"],
        theta=float(theta), factor=float(r["factor"]), L0=float(r["original_max_position_embeddings"]),
        beta_fast=float(r["beta_fast"]), beta_slow=float(r["beta_slow"]), truncate=bool(r.get("truncate", True)),
        eps=float(cfg["rms_norm_eps"]), limit=float(cfg.get("swiglu_limit", 7.0)), alpha=1.702,
        layer_types=list(lt),
    )


def param_shapes(d, expert_layout="disk"):
    """Canonical HF parameter names -> shapes. expert_layout:
       'disk'   : experts as gate_up [E, 2I, H] / down [E, H, I] (out, in) -- dense view of the MXFP4 tensors
       'hf'     : transformers' in-memory / bf16-export layout gate_up_proj [E, H, 2I], down_proj [E, I, H]
       'mxfp4'  : the on-disk *_blocks / *_scales tensors."""
    L, H, I, nh, nkv, hd, E, V = (d[k] for k in ("L", "H", "I", "nh", "nkv", "hd", "E", "V"))
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for l in range(L):
        p = f"model.layers.{l}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (nh * hd, H)
        s[p + "self_attn.q_proj.bias"] = (nh * hd,)
        s[p + "self_attn.k_proj.weight"] = (nkv * hd, H)
        s[p + "self_attn.k_proj.bias"] = (nkv * hd,)
        s[p + "self_attn.v_proj.weight"] = (nkv * hd, H)
        s[p + "self_attn.v_proj.bias"] = (nkv * hd,)
        s[p + "self_attn.o_proj.weight"] = (H, nh * hd)
        s[p + "self_attn.o_proj.bias"] = (H,)
        s[p + "self_attn.sinks"] = (nh,)
        s[p + "mlp.router.weight"] = (E, H)
        s[p + "mlp.router.bias"] = (E,)
        s[p + "mlp.experts.gate_up_proj_bias"] = (E, 2 * I)
        s[p + "mlp.experts.down_proj_bias"] = (E, H)
        if expert_layout == "disk":
            s[p + "mlp.experts.gate_up_proj"] = (E, 2 * I, H)
            s[p + "mlp.experts.down_proj"] = (E, H, I)
        elif expert_layout == "hf":
            s[p + "mlp.experts.gate_up_proj"] = (E, H, 2 * I)
            s[p + "mlp.experts.down_proj"] = (E, I, H)
        elif expert_layout == "mxfp4":
            s[p + "mlp.experts.gate_up_proj_blocks"] = (E, 2 * I, H // 32, 16)
            s[p + "mlp.experts.gate_up_proj_scales"] = (E, 2 * I, H // 32)
            s[p + "mlp.experts.down_proj_blocks"] = (E, H, I // 32, 16)
            s[p + "mlp.experts.down_proj_scales"] = (E, H, I // 32)
        else:
            raise ValueError(expert_layout)
    return s


def yarn_inv_freq(d):
    """YaRN inverse frequencies and the concentration (MODEL.md 4.4)."""
    hd, base, factor = d["hd"], d["theta"], d["factor"]
    half = hd // 2
    pos_freqs = base ** (np.arange(0, hd, 2, dtype=np.float64) / hd)

    def corr_dim(beta):
        return hd * math.log(d["L0"] / (beta * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(d["beta_fast"]), corr_dim(d["beta_slow"])
    if d["truncate"]:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, hd - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(half, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv = (1.0 / pos_freqs) * (1.0 - ramp) + (1.0 / (factor * pos_freqs)) * ramp
    conc = 0.1 * math.log(factor) + 1.0
    return inv, conc


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def forward(W, d, ids, collect=False):
    """float64 forward of gpt-oss written from MODEL.md section 4.

    W: name -> float64 array with experts in the 'disk' layout of param_shapes (gate_up [E,2I,H]
    rows interleaved gate/up, down [E,H,I]). ids: 1-D ints, positions 0..T-1.
    Returns dict(logits [T,V]) and, with collect, per-layer tensors, routing and clamp counts."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    H, I, nh, nkv, hd, E, K = (d[k] for k in ("H", "I", "nh", "nkv", "hd", "E", "K"))
    eps, lim, alpha = d["eps"], d["limit"], d["alpha"]
    G = nh // nkv
    inv, conc = yarn_inv_freq(d)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    cos, sin = np.cos(ang) * conc, np.sin(ang) * conc

    def rope(t):  # [T, heads, hd], half-split (NeoX)
        a, b = t[..., : hd // 2], t[..., hd // 2:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    out = {}
    x = W["model.embed_tokens.weight"][ids].astype(np.float64)
    if collect:
        out["embed"] = x.copy()
        out["attn_resid"], out["layer_out"], out["router_logits"], out["topk"], out["topw"] = [], [], [], [], []
        out["n_gate"] = out["n_gate_clamped"] = out["n_up_clamped"] = 0
    i_idx, j_idx = np.arange(T)[:, None], np.arange(T)[None, :]
    causal = j_idx <= i_idx
    for l in range(d["L"]):
        p = f"model.layers.{l}."
        h = _rms(x, W[p + "input_layernorm.weight"], eps)
        q = h @ W[p + "self_attn.q_proj.weight"].T + W[p + "self_attn.q_proj.bias"]
        k = h @ W[p + "self_attn.k_proj.weight"].T + W[p + "self_attn.k_proj.bias"]
        v = h @ W[p + "self_attn.v_proj.weight"].T + W[p + "self_attn.v_proj.bias"]
        q = rope(q.reshape(T, nh, hd))
        k = rope(k.reshape(T, nkv, hd))
        v = v.reshape(T, nkv, hd)
        allowed = causal.copy()
        if d["layer_types"][l] == "sliding_attention":
            allowed &= j_idx > i_idx - d["window"]
        kk = np.repeat(k, G, axis=1)  # q head h -> kv head h // G
        vv = np.repeat(v, G, axis=1)
        s = np.einsum("thd,shd->hts", q, kk) / math.sqrt(hd)
        s = np.where(allowed[None], s, -np.inf)
        sinks = W[p + "self_attn.sinks"][:, None, None]
        m = np.maximum(s.max(-1, keepdims=True), sinks)
        e = np.exp(s - m)
        den = e.sum(-1, keepdims=True) + np.exp(sinks - m)
        o = np.einsum("hts,shd->thd", e / den, vv).reshape(T, nh * hd)
        x = x + o @ W[p + "self_attn.o_proj.weight"].T + W[p + "self_attn.o_proj.bias"]
        if collect:
            out["attn_resid"].append(x.copy())
        h = _rms(x, W[p + "post_attention_layernorm.weight"], eps)
        rl = h @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]
        top = np.argsort(-rl, axis=-1, kind="stable")[:, :K]
        tv = np.take_along_axis(rl, top, -1)
        tw = np.exp(tv - tv.max(-1, keepdims=True))
        tw /= tw.sum(-1, keepdims=True)
        gu_w, gu_b = W[p + "mlp.experts.gate_up_proj"], W[p + "mlp.experts.gate_up_proj_bias"]
        dn_w, dn_b = W[p + "mlp.experts.down_proj"], W[p + "mlp.experts.down_proj_bias"]
        moe = np.zeros_like(x)
        for t in range(T):
            for kk_, ei in enumerate(top[t]):
                gu = gu_w[ei] @ h[t] + gu_b[ei]
                gate, up = gu[0::2], gu[1::2]
                if collect:
                    out["n_gate"] += gate.size
                    out["n_gate_clamped"] += int((gate > lim).sum())
                    out["n_up_clamped"] += int((np.abs(up) > lim).sum())
                gate = np.minimum(gate, lim)
                up = np.clip(up, -lim, lim)
                act = (up + 1.0) * (gate / (1.0 + np.exp(-alpha * gate)))
                moe[t] += tw[t, kk_] * (dn_w[ei] @ act + dn_b[ei])
        x = x + moe
        if collect:
            out["layer_out"].append(x.copy())
            out["router_logits"].append(rl)
            out["topk"].append(top)
            out["topw"].append(tw)
    x = _rms(x, W["model.norm.weight"], eps)
    if collect:
        out["final_norm"] = x.copy()
    out["logits"] = x @ W["lm_head.weight"].T
    return out


def topk_gap(router_logits, K):
    """Smallest gap between the K-th and (K+1)-th router logit (a routing near-tie measure)."""
    srt = -np.sort(-np.asarray(router_logits, dtype=np.float64), axis=-1)
    if srt.shape[-1] <= K:
        return float("inf")
    return float((srt[..., K - 1] - srt[..., K]).min())


def top1_margin(logits):
    srt = -np.sort(-np.asarray(logits, dtype=np.float64), axis=-1)
    return float((srt[..., 0] - srt[..., 1]).min())
