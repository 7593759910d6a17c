// Embedding, fused residual + RMSNorm, and bias + RoPE + KV write.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/fp8_quant.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/ops.h"

namespace gptoss::kernels::cuda {
namespace {

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const __nv_bfloat16* __restrict__ table, int hidden,
                                 float* __restrict__ x) {
    const int t = blockIdx.x;
    const __nv_bfloat16* row = table + static_cast<int64_t>(ids[t]) * hidden;
    float* out = x + static_cast<int64_t>(t) * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = __bfloat162float(row[i]);
}

// hidden % 8 == 0, 16-byte aligned rows: 8 values a thread per 16-byte load, the loads of a thread
// issued together (r29 profile, 20b 8k prefill: the 2-byte form took 0.235 ms for 47 MB read and
// 94 MB written, ~6x their time at copy bandwidth).
constexpr int kEmbedThreads = 128;
__global__ void __launch_bounds__(kEmbedThreads)
    embedding_vec_kernel(const int32_t* __restrict__ ids, const uint4* __restrict__ table, int hidden8,
                         float4* __restrict__ x) {
    const int t = blockIdx.x;
    const uint4* row = table + static_cast<int64_t>(ids[t]) * hidden8;
    float4* out = x + static_cast<int64_t>(t) * hidden8 * 2;
#pragma unroll 4
    for (int i = threadIdx.x; i < hidden8; i += kEmbedThreads) {
        const uint4 u = __ldg(row + i);
        out[2 * i] = make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                                 __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
        out[2 * i + 1] = make_float4(__uint_as_float(u.z << 16), __uint_as_float(u.z & 0xffff0000u),
                                     __uint_as_float(u.w << 16), __uint_as_float(u.w & 0xffff0000u));
    }
}

// One block per token. hidden_size ≤ 4 · blockDim · kMaxPerThread values kept in registers.
// 1024 threads: at decode (one block per token) the block's latency is the cost, so each thread
// handles only a few elements.
constexpr int kNormThreads = 1024;
constexpr int kMaxPerThread = 4;  // supports hidden_size up to 4096

// Every global load of a thread (its x elements, the adds of each, their weights and the bias) is
// issued before the first sum: one memory round trip. (r27 ncu, 20b batch 1: 5.6 µs a norm with
// the add loop's loads behind its per-iteration branches, ~a round trip per add.) The sums are
// the same expressions in the same order as before.
constexpr int kNormMaxAdd = 4;  // adds held in registers (gpt-oss: 4 experts); more are loaded in the loop

template <bool kAddBf16>
__device__ __forceinline__ float load_add(const ResidualRmsNormArgs& a, int64_t o) {
    if constexpr (kAddBf16)
        return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(a.add)[o]);
    else
        return a.add[o];
}

template <bool kAddBf16>
__device__ __forceinline__ float residual_rmsnorm_rows(const ResidualRmsNormArgs& a, int t, float (&v)[kMaxPerThread],
                                                       float (&gain)[kMaxPerThread]) {
    const int H = a.hidden_size;
    float* x = a.x + static_cast<int64_t>(t) * H;
    const int na = a.add != nullptr ? a.num_add : 0;
    float wts[kNormMaxAdd], addv[kMaxPerThread][kNormMaxAdd], bias[kMaxPerThread];
#pragma unroll
    for (int k = 0; k < kNormMaxAdd; ++k) wts[k] = k < na && a.add_weights ? a.add_weights[t * na + k] : 1.0f;
        // Loads at clamped addresses (element min(i, H - 1), add min(k, na - 1)), their values unused past
        // H and na: no branch between the loads.
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
        const int ic = min(static_cast<int>(threadIdx.x) + j * kNormThreads, H - 1);
        v[j] = x[ic];
        gain[j] = a.weight != nullptr ? a.weight[ic] : 0.0f;  // for the output, after the block's sum
        bias[j] = a.add != nullptr && a.add_bias ? a.add_bias[ic] : 0.0f;
#pragma unroll
        for (int k = 0; k < kNormMaxAdd; ++k) addv[j][k] = 0.0f;
        if (na > 0) {
#pragma unroll
            for (int k = 0; k < kNormMaxAdd; ++k)
                addv[j][k] = load_add<kAddBf16>(a, (static_cast<int64_t>(t) * na + min(k, na - 1)) * H + ic);
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < H) {
            float xi = v[j];
            if (a.add != nullptr) {
                float acc = bias[j];
#pragma unroll
                for (int k = 0; k < kNormMaxAdd; ++k)
                    if (k < na) acc += wts[k] * addv[j][k];
#pragma unroll 1
                for (int k = kNormMaxAdd; k < na; ++k) {  // beyond gpt-oss's 4 experts
                    const float w = a.add_weights ? a.add_weights[t * na + k] : 1.0f;
                    acc += w * load_add<kAddBf16>(a, (static_cast<int64_t>(t) * na + k) * H + i);
                }
                xi += acc;
                x[i] = xi;
            }
            v[j] = xi;
            ss += xi * xi;
        }
    }
    return ss;
}

__global__ void __launch_bounds__(kNormThreads) residual_rmsnorm_kernel(const ResidualRmsNormArgs a) {
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    const int H = a.hidden_size;
    float v[kMaxPerThread], gain[kMaxPerThread];
    float ss = a.add_bf16 ? residual_rmsnorm_rows<true>(a, t, v, gain) : residual_rmsnorm_rows<false>(a, t, v, gain);
    if (a.out == nullptr && a.out_f32 == nullptr && a.out_inv_rms == nullptr) return;
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(H) + a.eps);
    if (a.out_inv_rms != nullptr && threadIdx.x == 0) a.out_inv_rms[t] = inv;
    auto* out = static_cast<__nv_bfloat16*>(a.out);
#pragma unroll
    for (int j = 0; j < kMaxPerThread; ++j) {
        const int i = threadIdx.x + j * kNormThreads;
        if (i < H) {
            // (v · inv) · weight, each product rounded (RouterTopkArgs::norm_inv_rms repeats it bit for bit).
            const float y = __fmul_rn(__fmul_rn(v[j], inv), gain[j]);
            if (out) out[static_cast<int64_t>(t) * H + i] = __float2bfloat16(y);
            if (a.out_f32) a.out_f32[static_cast<int64_t>(t) * H + i] = y;
        }
    }
}

// The same for prefill-sized batches: 256 threads a token, 16-byte loads, every load of a thread
// issued before its sum (r23 profile, 20b 8k prefill: 49 norms took 8.7 ms, ~1.5× their bytes'
// time with 1,024 threads of ≤ 3 dependent elements each). hidden_size % 4 == 0, ≤ 4,096.
constexpr int kWideNormThreads = 256;
constexpr int kWideNormChunks = 4;  // float4 a thread: hidden_size ≤ 256 · 4 · 4
constexpr int kWideNormMinTokens = 64;
// With out_q: also the bf16 rows quantized for an FP8 GEMM (ResidualRmsNormArgs::out_q), the bytes
// of quantize_act_fp8_bf16: a warp's 32 float4 are one 128-wide group (amax by a warp max), and
// CTAs past num_tokens (up to q_m_pad) write the padding rows (zeros, scale 1).
// Each chunk's loads (x, every add, the bias, the gain) are issued together at clamped addresses,
// the chunk's sums branch-free (only the store predicated), so nothing orders one chunk's loads
// after another chunk's sums. r29 (8k --fp8 prefill, same run) against the loop form it replaced
// (each add's load behind the add loop's branches; the same bits): 20b 81.78 -> 81.44 ms, 120b
// 167.88 -> 167.52.
// Σ of a chunk's squares, each operation rounded as written (nvcc's contraction of the plain
// expression changed with its context: r29 saw two forms of this kernel differ in the last bit).
__device__ __forceinline__ float sumsq4(float4 v) {
    return __fmaf_rn(v.w, v.w, __fmaf_rn(v.z, v.z, __fmaf_rn(v.y, v.y, __fmul_rn(v.x, v.x))));
}
template <bool kAddBf16>
__device__ __forceinline__ float4 load_add4(const ResidualRmsNormArgs& a, int64_t o) {
    if constexpr (kAddBf16) {  // 4 bf16 (8 bytes) a chunk
        const uint2 u = reinterpret_cast<const uint2*>(a.add)[o];
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                           __uint_as_float(u.y & 0xffff0000u));
    } else {
        return reinterpret_cast<const float4*>(a.add)[o];
    }
}
template <bool kAddBf16>
__device__ __forceinline__ float wide_rows_batched(const ResidualRmsNormArgs& a, int t, float4 (&v)[kWideNormChunks],
                                                   float4 (&gain)[kWideNormChunks]) {
    const int H4 = a.hidden_size / 4;
    float4* x = reinterpret_cast<float4*>(a.x + static_cast<int64_t>(t) * a.hidden_size);
    const int na = a.add != nullptr ? a.num_add : 0;
    float wts[kNormMaxAdd];
#pragma unroll
    for (int k = 0; k < kNormMaxAdd; ++k) wts[k] = k < na && a.add_weights ? a.add_weights[t * na + k] : 1.0f;
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kWideNormChunks; ++j) {
        const int i = threadIdx.x + j * kWideNormThreads, ic = min(i, H4 - 1);
        const bool valid = i < H4;
        float4 xi = x[ic];
        gain[j] =
            a.weight != nullptr ? reinterpret_cast<const float4*>(a.weight)[ic] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 acc = a.add != nullptr && a.add_bias ? reinterpret_cast<const float4*>(a.add_bias)[ic]
                                                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 addv[kNormMaxAdd];
#pragma unroll
        for (int k = 0; k < kNormMaxAdd; ++k)
            addv[k] = na > 0 ? load_add4<kAddBf16>(a, (static_cast<int64_t>(t) * na + min(k, na - 1)) * H4 + ic)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (a.add != nullptr) {
#pragma unroll
            for (int k = 0; k < kNormMaxAdd; ++k) {
                if (k < na) {
                    acc.x += wts[k] * addv[k].x;
                    acc.y += wts[k] * addv[k].y;
                    acc.z += wts[k] * addv[k].z;
                    acc.w += wts[k] * addv[k].w;
                }
            }
#pragma unroll 1
            for (int k = kNormMaxAdd; k < na; ++k) {  // beyond gpt-oss's 4 experts
                const float w = a.add_weights ? a.add_weights[t * na + k] : 1.0f;
                const float4 ad = load_add4<kAddBf16>(a, (static_cast<int64_t>(t) * na + k) * H4 + ic);
                acc.x += w * ad.x;
                acc.y += w * ad.y;
                acc.z += w * ad.z;
                acc.w += w * ad.w;
            }
            xi.x += acc.x;
            xi.y += acc.y;
            xi.z += acc.z;
            xi.w += acc.w;
            if (valid) x[i] = xi;
        }
        v[j] = xi;
        if (valid) ss = __fadd_rn(ss, sumsq4(xi));
    }
    return ss;
}

__device__ __forceinline__ float4 bf16_round4(float4 y) {
    return make_float4(__bfloat162float(__float2bfloat16(y.x)), __bfloat162float(__float2bfloat16(y.y)),
                       __bfloat162float(__float2bfloat16(y.z)), __bfloat162float(__float2bfloat16(y.w)));
}
__device__ __forceinline__ float abs_max_bf16(float4 y) {
    const float4 b = bf16_round4(y);
    return fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w)));
}

// Row t ≥ num_tokens of out_q (up to q_m_pad): zeros, scale 1.
__device__ __forceinline__ void wide_norm_padding_row(const ResidualRmsNormArgs& a, int t) {
    for (int i = threadIdx.x; i < a.q_k_pad / 4; i += kWideNormThreads)
        reinterpret_cast<uint32_t*>(a.out_q + static_cast<int64_t>(t) * a.q_k_pad)[i] = 0u;
    for (int g = threadIdx.x; g < a.q_k_pad / 128; g += kWideNormThreads)
        a.out_q_scale[static_cast<int64_t>(g) * a.q_m_pad + t] = 1.0f;
}

// The rest of the wide kernel after its loads: the block's Σ v², 1 / rms, and the outputs (gain:
// the norm weight's chunks, already loaded).
template <bool kRowQ>
__device__ __forceinline__ void wide_norm_finish(const ResidualRmsNormArgs& a, int t,
                                                 const float4 (&v)[kWideNormChunks],
                                                 const float4 (&gain)[kWideNormChunks], float ss, float* scratch) {
    const int H4 = a.hidden_size / 4;
    if (a.out == nullptr && a.out_f32 == nullptr && a.out_q == nullptr && a.out_inv_rms == nullptr && !kRowQ) return;
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / static_cast<float>(a.hidden_size) + a.eps);
    if (a.out_inv_rms != nullptr && threadIdx.x == 0) a.out_inv_rms[t] = inv;
    float amax = 0.0f;  // of the bf16-rounded outputs, for out_row_q
#pragma unroll
    for (int j = 0; j < kWideNormChunks; ++j) {
        const int i = threadIdx.x + j * kWideNormThreads;
        float4 y = make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // past hidden_size: out_q's zero padding
        if (i < H4) {
            const float4 w = gain[j];
            // (v · inv) · weight, each product rounded (RouterTopkArgs::norm_inv_rms repeats it bit for bit).
            y = make_float4(__fmul_rn(__fmul_rn(v[j].x, inv), w.x), __fmul_rn(__fmul_rn(v[j].y, inv), w.y),
                            __fmul_rn(__fmul_rn(v[j].z, inv), w.z), __fmul_rn(__fmul_rn(v[j].w, inv), w.w));
            if (a.out != nullptr) {
                __nv_bfloat162 lo = __floats2bfloat162_rn(y.x, y.y), hi = __floats2bfloat162_rn(y.z, y.w);
                uint2 p;
                p.x = *reinterpret_cast<uint32_t*>(&lo);
                p.y = *reinterpret_cast<uint32_t*>(&hi);
                reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(a.out) +
                                         static_cast<int64_t>(t) * a.hidden_size)[i] = p;
            }
            if (a.out_f32) reinterpret_cast<float4*>(a.out_f32 + static_cast<int64_t>(t) * a.hidden_size)[i] = y;
        }
        if constexpr (kRowQ) amax = fmaxf(amax, abs_max_bf16(y));
        if (a.out_q != nullptr && i < a.q_k_pad / 4) {  // warp-uniform: q_k_pad / 4 is a multiple of 32
            // As quantize_act_fp8_bf16 reads out: the bf16 values, amax over the group, a power-of-two
            // scale, e4m3 of value / scale.
            const float4 b =
                make_float4(__bfloat162float(__float2bfloat16(y.x)), __bfloat162float(__float2bfloat16(y.y)),
                            __bfloat162float(__float2bfloat16(y.z)), __bfloat162float(__float2bfloat16(y.w)));
            const float m = warp_max(fmaxf(fmaxf(fabsf(b.x), fabsf(b.y)), fmaxf(fabsf(b.z), fabsf(b.w))));
            const float s = fp8_pow2_scale(m);
            const float r = fp8_pow2_inverse(s);  // exact: s is a power of two
            const uint32_t q = static_cast<uint32_t>(to_e4m3(b.x * r)) | static_cast<uint32_t>(to_e4m3(b.y * r)) << 8 |
                               static_cast<uint32_t>(to_e4m3(b.z * r)) << 16 |
                               static_cast<uint32_t>(to_e4m3(b.w * r)) << 24;
            reinterpret_cast<uint32_t*>(a.out_q + static_cast<int64_t>(t) * a.q_k_pad)[i] = q;
            if ((threadIdx.x & 31) == 0) a.out_q_scale[static_cast<int64_t>(i / 32) * a.q_m_pad + t] = s;
        }
    }
    if constexpr (kRowQ) {                         // quant_rows_e4m3_kernel's arithmetic on the same bf16 values
        const float m = block_max(amax, scratch);  // chunks past hidden_size hold zeros
        const float scale = m > 0.0f ? m / 448.0f : 1.0f;
        const float r = m > 0.0f ? fminf(448.0f / m, 3.0e38f) : 1.0f;
        if (threadIdx.x == 0) a.out_row_scale[t] = scale;
#pragma unroll
        for (int j = 0; j < kWideNormChunks; ++j) {
            const int i = threadIdx.x + j * kWideNormThreads;
            if (i < H4) {  // y again (fewer live registers than keeping it: no spill at 64)
                const float4 w = gain[j];
                const float4 yb = bf16_round4(
                    make_float4(__fmul_rn(__fmul_rn(v[j].x, inv), w.x), __fmul_rn(__fmul_rn(v[j].y, inv), w.y),
                                __fmul_rn(__fmul_rn(v[j].z, inv), w.z), __fmul_rn(__fmul_rn(v[j].w, inv), w.w)));
                const uint32_t q01 =
                    __nv_cvt_float2_to_fp8x2(make_float2(yb.x * r, yb.y * r), __NV_SATFINITE, __NV_E4M3);
                const uint32_t q23 =
                    __nv_cvt_float2_to_fp8x2(make_float2(yb.z * r, yb.w * r), __NV_SATFINITE, __NV_E4M3);
                reinterpret_cast<uint32_t*>(a.out_row_q + static_cast<int64_t>(t) * a.hidden_size)[i] =
                    q01 | (q23 << 16);
            }
        }
    }
}

// kRowQ: with out_row_q (a.out_row_q set). 4 CTAs an SM (64 registers: both forms spill 16-32
// bytes). r35: sized for 3 (85 registers, no spill) the 8k prefill's norms took 5.95 ms instead
// of 5.30 (20b), 8.71 instead of 7.76 (120b): the occupancy matters more than the spill.
template <bool kRowQ>
__global__ void __launch_bounds__(kWideNormThreads, 4)
    residual_rmsnorm_wide_batched_kernel(const ResidualRmsNormArgs a) {
    pdl_wait();
    pdl_trigger();
    __shared__ float scratch[32];
    const int t = blockIdx.x;
    if (t >= a.num_tokens) {  // a padding row of out_q
        wide_norm_padding_row(a, t);
        return;
    }
    float4 v[kWideNormChunks], gain[kWideNormChunks];
    const float ss = a.add_bf16 ? wide_rows_batched<true>(a, t, v, gain) : wide_rows_batched<false>(a, t, v, gain);
    wide_norm_finish<kRowQ>(a, t, v, gain, ss, scratch);
}

// One block per token; one thread per two neighbouring rotation pairs (i, i + 1) of a head (q, k)
// plus v copies two elements at a time: 4- and 8-byte loads and stores (r27: with one pair a thread
// and 2-byte accesses the 8k prefill's rope took 88 µs a layer, ~2× its bytes' time). The token's
// cos/sin (one per pair index, shared by all heads) are computed once into shared memory (r23: a
// sincosf per head had this kernel at ~4× its bytes' time). kHd: the head_dim (0: a.head_dim, any
// multiple of 4).
constexpr int kRopeThreads = 256;
constexpr int kRopeMaxHalf = 128;  // head_dim ≤ 256
// kTokens tokens a block (kRopeThreads / kTokens threads each): 4 when q is not written (k and v
// only: 1/5 of the work a token). r34, 8k: 24 us a layer at one token a block (call 3), 20.5 at 4.
// Elements i, i + 1 (i even) of the qkv row starting at row0, plus the bias.
__device__ __forceinline__ float2 qkv_row_pair(const QkvRopeArgs& a, int64_t row0, int i) {
    float2 v;
    if (a.qkv_bf16)
        v = __bfloat1622float2(
            *reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(a.qkv) + row0 + i));
    else
        v = *reinterpret_cast<const float2*>(static_cast<const float*>(a.qkv) + row0 + i);
    const float2 b = *reinterpret_cast<const float2*>(a.bias + i);
    return make_float2(v.x + b.x, v.y + b.y);
}
// Cache elements i, i + 1 (bf16, or e4m3 with kv_fp8).
__device__ __forceinline__ void store_kv_pair(const QkvRopeArgs& a, void* cache, int64_t i, float2 v) {
    if (a.kv_fp8) {
        store_kv(cache, i, v.x, true);
        store_kv(cache, i + 1, v.y, true);
    } else {
        *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(cache) + i) = __floats2bfloat162_rn(v.x, v.y);
    }
}

template <int kHd, int kTokens = 1>
__global__ void __launch_bounds__(kRopeThreads) qkv_rope_kernel(const QkvRopeArgs a) {
    constexpr int kThreads = kRopeThreads / kTokens;
    __shared__ __align__(8) float s_cos_all[kTokens][kRopeMaxHalf];
    __shared__ __align__(8) float s_sin_all[kTokens][kRopeMaxHalf];
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    const int sub = threadIdx.x / kThreads, tid = threadIdx.x % kThreads;
    const int t = blockIdx.x * kTokens + sub;
    float* s_cos = s_cos_all[sub];
    float* s_sin = s_sin_all[sub];
    const bool live = t < a.num_tokens;
    const int hd = kHd > 0 ? kHd : a.head_dim, half = hd / 2, quarter = hd / 4;
    const int pos = live ? a.positions[t] : 0;
    for (int i = tid; i < half; i += kThreads)
        rope_cos_sin(pos, a.inv_freq[i], a.attention_scaling, s_cos[i], s_sin[i]);
    __syncthreads();
    if (!live) return;
    const int nq = a.num_heads, nkv = a.num_kv_heads;
    const int width = (nq + 2 * nkv) * hd;
    const int64_t row0 = static_cast<int64_t>(t) * width;
    const auto row2 = [&](int i) { return qkv_row_pair(a, row0, i); };
    const auto store_kv2 = [&](void* cache, int64_t i, float2 v) { store_kv_pair(a, cache, i, v); };
    const int slot = a.slot_mapping[t];
    auto* q_out = static_cast<__nv_bfloat16*>(a.q_out) + static_cast<int64_t>(t) * nq * hd;
    // Rotations: (nq + nkv) heads × half / 2 pair couples; without q_out the k heads only (the
    // prefill attention rotates q itself, PagedAttentionArgs::q_raw).
    const int h0 = a.q_out != nullptr ? 0 : nq;
    for (int idx = tid; idx < (nq + nkv - h0) * quarter; idx += kThreads) {
        const int h = h0 + idx / quarter, i = 2 * (idx % quarter);
        const float2 c = *reinterpret_cast<const float2*>(s_cos + i), s = *reinterpret_cast<const float2*>(s_sin + i);
        const int base = h * hd;  // q heads first, then k heads
        const float2 x1 = row2(base + i), x2 = row2(base + i + half);
        float2 y1, y2;
        rope_rotate(x1.x, x2.x, c.x, s.x, y1.x, y2.x);
        rope_rotate(x1.y, x2.y, c.y, s.y, y1.y, y2.y);
        if (h < nq) {
            *reinterpret_cast<__nv_bfloat162*>(q_out + base + i) = __floats2bfloat162_rn(y1.x, y1.y);
            *reinterpret_cast<__nv_bfloat162*>(q_out + base + i + half) = __floats2bfloat162_rn(y2.x, y2.y);
        } else if (slot >= 0) {
            const int64_t dst = static_cast<int64_t>(slot) * nkv * hd + (h - nq) * hd;
            store_kv2(a.k_cache, dst + i, y1);
            store_kv2(a.k_cache, dst + i + half, y2);
        }
    }
    if (slot >= 0) {
        for (int i = 2 * tid; i < nkv * hd; i += 2 * kThreads)
            store_kv2(a.v_cache, static_cast<int64_t>(slot) * nkv * hd + i, row2((nq + nkv) * hd + i));
    }
}

// k and v only (q_out == null, head_dim 64, ≤ kRopeKvMaxHeads kv heads), kRopeKvTokens tokens a
// block: the qkv_rope_kernel arithmetic with each thread's row loads (its k pairs, its v pairs, their
// biases) and its token's slot issued before the cos / sin and the barrier, not after (the kernel
// above, r34: 20.5 us a layer at 8k for 34 MB, ~1.6 TB/s: a token's chain was positions -> sincosf
// -> barrier -> loads -> stores). r35 (8k --fp8 prefill, same run): rope_kv 0.498 -> 0.457-0.464
// ms on 20b, 0.754 -> 0.690 on 120b (-1.6 us a layer; less than hoped: ~19 us a layer for 34 MB
// is still ~1.8 TB/s).
constexpr int kRopeKvTokens = 4, kRopeKvThreads = kRopeThreads / kRopeKvTokens;  // 64 threads a token
constexpr int kRopeKvMaxHeads = 16;
constexpr int kRopeKvRot = kRopeKvMaxHeads * 16 / kRopeKvThreads;    // k pair couples a thread (≤ 4)
constexpr int kRopeKvV = kRopeKvMaxHeads * 64 / 2 / kRopeKvThreads;  // v pairs a thread (≤ 8)
__global__ void __launch_bounds__(kRopeThreads) qkv_rope_kv_kernel(const QkvRopeArgs a) {
    constexpr int kHd = 64, kHalf = kHd / 2, kQuarter = kHd / 4;
    __shared__ __align__(8) float s_cos_all[kRopeKvTokens][kHalf];
    __shared__ __align__(8) float s_sin_all[kRopeKvTokens][kHalf];
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    const int sub = threadIdx.x / kRopeKvThreads, tid = threadIdx.x % kRopeKvThreads;
    const int t = blockIdx.x * kRopeKvTokens + sub;
    const bool live = t < a.num_tokens;
    const int nq = a.num_heads, nkv = a.num_kv_heads;
    const int64_t row0 = static_cast<int64_t>(live ? t : 0) * (nq + 2 * nkv) * kHd;
    const auto row2 = [&](int i) { return qkv_row_pair(a, row0, i); };
    const int pos = live ? a.positions[t] : 0;
    const int slot = live ? a.slot_mapping[t] : -1;
    float2 x1[kRopeKvRot], x2[kRopeKvRot], vv[kRopeKvV];
#pragma unroll
    for (int j = 0; j < kRopeKvRot; ++j) {
        const int idx = tid + j * kRopeKvThreads;
        if (live && idx < nkv * kQuarter) {
            const int base = (nq + idx / kQuarter) * kHd, i = 2 * (idx % kQuarter);
            x1[j] = row2(base + i);
            x2[j] = row2(base + i + kHalf);
        }
    }
#pragma unroll
    for (int j = 0; j < kRopeKvV; ++j) {
        const int i = 2 * tid + j * 2 * kRopeKvThreads;
        if (live && i < nkv * kHd) vv[j] = row2((nq + nkv) * kHd + i);
    }
    float* s_cos = s_cos_all[sub];
    float* s_sin = s_sin_all[sub];
    for (int i = tid; i < kHalf; i += kRopeKvThreads)
        rope_cos_sin(pos, a.inv_freq[i], a.attention_scaling, s_cos[i], s_sin[i]);
    __syncthreads();
    if (!live || slot < 0) return;
    const auto store_kv2 = [&](void* cache, int64_t i, float2 v) { store_kv_pair(a, cache, i, v); };
    const int64_t dst0 = static_cast<int64_t>(slot) * nkv * kHd;
#pragma unroll
    for (int j = 0; j < kRopeKvRot; ++j) {
        const int idx = tid + j * kRopeKvThreads;
        if (idx < nkv * kQuarter) {
            const int h = idx / kQuarter, i = 2 * (idx % kQuarter);
            const float2 c = *reinterpret_cast<const float2*>(s_cos + i),
                         sn = *reinterpret_cast<const float2*>(s_sin + i);
            float2 y1, y2;
            rope_rotate(x1[j].x, x2[j].x, c.x, sn.x, y1.x, y2.x);
            rope_rotate(x1[j].y, x2[j].y, c.y, sn.y, y1.y, y2.y);
            store_kv2(a.k_cache, dst0 + h * kHd + i, y1);
            store_kv2(a.k_cache, dst0 + h * kHd + i + kHalf, y2);
        }
    }
#pragma unroll
    for (int j = 0; j < kRopeKvV; ++j) {
        const int i = 2 * tid + j * 2 * kRopeKvThreads;
        if (i < nkv * kHd) store_kv2(a.v_cache, dst0 + i, vv[j]);
    }
}

// Block i of the contiguous side <-> block ids[i] of the cache, 16 bytes a thread.
__global__ void copy_kv_blocks_kernel(const uint4* src, uint4* dst, const int32_t* ids, int n, int64_t block_vecs,
                                      bool gather) {
    const int64_t total = static_cast<int64_t>(n) * block_vecs;
    for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < total;
         t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int64_t i = t / block_vecs, j = t % block_vecs;
        const int64_t id = ids[i];
        if (id < 0) continue;
        if (gather) {
            dst[t] = src[id * block_vecs + j];
        } else {
            dst[id * block_vecs + j] = src[t];
        }
    }
}

__global__ void fill_random_bf16_kernel(__nv_bfloat16* out, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
        out[i] = __float2bfloat16(static_cast<float>(r >> 40) * 0x1.0p-24f * 4.0f - 2.0f);
    }
}

__global__ void fill_random_fp8_kernel(uint8_t* out, int64_t n, uint64_t seed) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint64_t r = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(i)));
        out[i] =
            __nv_cvt_float_to_fp8(static_cast<float>(r >> 40) * 0x1.0p-24f * 4.0f - 2.0f, __NV_SATFINITE, __NV_E4M3);
    }
}

// gather: dst[i] = src[ids[i]]; else dst[ids[i]] = src[i] (gather_kv_blocks / scatter_kv_blocks).
void copy_kv_blocks(const void* src, void* dst, const int32_t* ids, int n, int64_t block_bytes, bool gather,
                    cudaStream_t stream) {
    if (n == 0) return;
    ENGINE_CHECK(block_bytes % 16 == 0, "KV blocks of %lld bytes", static_cast<long long>(block_bytes));
    copy_kv_blocks_kernel<<<1024, 256, 0, stream>>>(static_cast<const uint4*>(src), static_cast<uint4*>(dst), ids, n,
                                                    block_bytes / 16, gather);
    CUDA_CHECK_LAUNCH();
}

}  // namespace

void gather_kv_blocks(const void* cache, const int32_t* ids, int n, int64_t block_bytes, void* out,
                      cudaStream_t stream) {
    copy_kv_blocks(cache, out, ids, n, block_bytes, true, stream);
}

void scatter_kv_blocks(const void* in, const int32_t* ids, int n, int64_t block_bytes, void* cache,
                       cudaStream_t stream) {
    copy_kv_blocks(in, cache, ids, n, block_bytes, false, stream);
}

void fill_random_fp8(void* out, int64_t n, uint64_t seed, cudaStream_t stream) {
    if (n == 0) return;
    fill_random_fp8_kernel<<<4096, 256, 0, stream>>>(static_cast<uint8_t*>(out), n, seed);
    CUDA_CHECK_LAUNCH();
}

void fill_random_bf16(void* out, int64_t n, uint64_t seed, cudaStream_t stream) {
    if (n == 0) return;
    fill_random_bf16_kernel<<<4096, 256, 0, stream>>>(static_cast<__nv_bfloat16*>(out), n, seed);
    CUDA_CHECK_LAUNCH();
}

void embedding(const int32_t* ids, int num_tokens, const void* table, int hidden, float* x, cudaStream_t stream) {
    if (num_tokens == 0) return;
    if (hidden % 8 == 0 && reinterpret_cast<uintptr_t>(table) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0)
        embedding_vec_kernel<<<num_tokens, kEmbedThreads, 0, stream>>>(ids, static_cast<const uint4*>(table),
                                                                       hidden / 8, reinterpret_cast<float4*>(x));
    else
        embedding_kernel<<<num_tokens, 256, 0, stream>>>(ids, static_cast<const __nv_bfloat16*>(table), hidden, x);
    CUDA_CHECK_LAUNCH();
}

namespace {
bool wide_norm_ok(const ResidualRmsNormArgs& a) {
    const auto aligned = [](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    return a.num_tokens >= kWideNormMinTokens && a.hidden_size % 4 == 0 &&
           a.hidden_size <= kWideNormThreads * kWideNormChunks * 4 && aligned(a.x) && aligned(a.add) &&
           aligned(a.add_bias) && aligned(a.weight) && aligned(a.out) && aligned(a.out_f32);
}
}  // namespace

bool residual_rmsnorm_fuses_quant(const ResidualRmsNormArgs& a) {
    return a.out_q != nullptr && wide_norm_ok(a) && a.q_k_pad <= kWideNormThreads * kWideNormChunks * 4 &&
           reinterpret_cast<uintptr_t>(a.out_q) % 16 == 0;
}

bool residual_rmsnorm_fuses_row_q(const ResidualRmsNormArgs& a) {
    if (a.out_row_q == nullptr) return false;
    ResidualRmsNormArgs b = a;
    b.out_q = nullptr;
    return residual_rmsnorm_fuses_quant(a) || wide_norm_ok(b);
}

void residual_rmsnorm(const ResidualRmsNormArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.hidden_size >= 1 && a.hidden_size <= kNormThreads * kMaxPerThread, "hidden_size %d unsupported",
                 a.hidden_size);
    ENGINE_CHECK(a.out_q == nullptr || (a.out_q_scale != nullptr && a.q_k_pad % 128 == 0 &&
                                        a.q_k_pad >= a.hidden_size && a.q_m_pad == fp8_gemm_m_pad(a.num_tokens)),
                 "residual_rmsnorm: out_q needs scales, q_k_pad %d (a multiple of 128 >= %d), q_m_pad %d", a.q_k_pad,
                 a.hidden_size, a.q_m_pad);
    ENGINE_CHECK(
        a.out_row_q == nullptr || (a.out_row_scale != nullptr && reinterpret_cast<uintptr_t>(a.out_row_q) % 16 == 0 &&
                                   a.hidden_size % 16 == 0 && (a.out != nullptr || residual_rmsnorm_fuses_row_q(a))),
        "residual_rmsnorm: out_row_q needs scales, 16-byte alignment, hidden_size %% 16 == 0 (%d), and out unless "
        "the norm writes it itself",
        a.hidden_size);
    if (a.num_tokens == 0) return;
    const auto wide = a.out_row_q != nullptr ? residual_rmsnorm_wide_batched_kernel<true>
                                             : residual_rmsnorm_wide_batched_kernel<false>;
    if (residual_rmsnorm_fuses_quant(a)) {
        launch_pdl(wide, a.q_m_pad, kWideNormThreads, 0, stream, a);
        return;
    }
    ResidualRmsNormArgs b = a;  // out_q by the quantizer after the norm
    b.out_q = nullptr;
    ENGINE_CHECK(a.out_q == nullptr || a.out != nullptr, "residual_rmsnorm: out_q without the fused path needs out");
    if (wide_norm_ok(b))
        launch_pdl(wide, b.num_tokens, kWideNormThreads, 0, stream, b);
    else
        launch_pdl(residual_rmsnorm_kernel, b.num_tokens, kNormThreads, 0, stream, b);
    if (a.out_q != nullptr)
        quantize_act_fp8_bf16(a.out, a.num_tokens, a.hidden_size, a.q_k_pad, a.out_q, a.out_q_scale, stream);
    if (a.out_row_q != nullptr && !wide_norm_ok(b))
        moe_fp8_quant_rows(a.out, false, nullptr, 1, a.num_tokens, a.hidden_size, a.out_row_q, a.out_row_scale, stream);
}

// GPTOSS_ROPE_KV_FIRST=0: the k/v-only RoPE in qkv_rope_kernel's order (A/B runs; same bits).
static bool rope_kv_loads_first() {
    static const bool on = [] {
        const char* v = std::getenv("GPTOSS_ROPE_KV_FIRST");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return on;
}

__global__ void rope_cos_sin_table_kernel(const int32_t* __restrict__ positions, int num_tokens,
                                          const float* __restrict__ inv_freq, int half, float scaling, float2* out) {
    pdl_wait();
    pdl_trigger();
    const int64_t n = static_cast<int64_t>(num_tokens) * half;
    for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const int t = static_cast<int>(e / half), i = static_cast<int>(e % half);
        float c, sn;
        rope_cos_sin(positions[t], inv_freq[i], scaling, c, sn);
        out[e] = make_float2(c, sn);
    }
}

void rope_cos_sin_table(const int32_t* positions, int num_tokens, const float* inv_freq, int half, float scaling,
                        float* out, cudaStream_t stream) {
    if (num_tokens <= 0) return;
    ENGINE_CHECK(half > 0 && positions && inv_freq && out, "rope_cos_sin_table: bad arguments (half %d)", half);
    const int64_t n = static_cast<int64_t>(num_tokens) * half;
    const int blocks = static_cast<int>(std::min<int64_t>((n + 255) / 256, 4096));
    launch_pdl(rope_cos_sin_table_kernel, blocks, 256, 0, stream, positions, num_tokens, inv_freq, half, scaling,
               reinterpret_cast<float2*>(out));
}

void qkv_bias_rope_kv_write(const QkvRopeArgs& a, cudaStream_t stream) {
    if (a.num_tokens == 0) return;
    ENGINE_CHECK(a.head_dim % 4 == 0 && a.head_dim / 2 <= kRopeMaxHalf, "qkv_bias_rope_kv_write: head_dim %d",
                 a.head_dim);
    if (a.head_dim == 64 && a.q_out == nullptr && a.num_kv_heads <= kRopeKvMaxHeads &&
        rope_kv_loads_first())  // gpt-oss, k and v only: 4 tokens a block, loads first
        launch_pdl(qkv_rope_kv_kernel, (a.num_tokens + kRopeKvTokens - 1) / kRopeKvTokens, kRopeThreads, 0, stream, a);
    else if (a.head_dim == 64 && a.q_out == nullptr)  // k and v only: 4 tokens a block
        launch_pdl(qkv_rope_kernel<64, 4>, (a.num_tokens + 3) / 4, kRopeThreads, 0, stream, a);
    else if (a.head_dim == 64)  // gpt-oss
        launch_pdl(qkv_rope_kernel<64>, a.num_tokens, kRopeThreads, 0, stream, a);
    else
        launch_pdl(qkv_rope_kernel<0>, a.num_tokens, kRopeThreads, 0, stream, a);
}

}  // namespace gptoss::kernels::cuda
