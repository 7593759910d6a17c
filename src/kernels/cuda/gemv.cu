#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe_common.cuh"
#include "kernels/cuda/ops.h"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kUnroll = 8;  // 16-byte weight loads in flight per lane (a 2880-wide row in 2 rounds)

__device__ __forceinline__ void load_x8(const float* x, float (&v)[8]) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x) + 1);
    v[0] = a.x;
    v[1] = a.y;
    v[2] = a.z;
    v[3] = a.w;
    v[4] = b.x;
    v[5] = b.y;
    v[6] = b.z;
    v[7] = b.w;
}
__device__ __forceinline__ void load_x8(const __nv_bfloat16* x, float (&v)[8]) {
    const uint4 u = __ldg(reinterpret_cast<const uint4*>(x));
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
}

// Weight formats of the v1 kernels: a 16-byte chunk holds 8 bf16 or 16 e4m3 weights.
struct Bf16W {
    static constexpr int kElems = 8;
    __device__ static __forceinline__ void decode(const uint4& v, float (&f)[8]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
};
struct Fp8W {
    static constexpr int kElems = 16;
    // Elements 8h .. 8h + 7 only (fewer live registers where two rows are decoded at once).
    __device__ static __forceinline__ void decode_half(const uint4& v, int h, float (&f)[8]) {
        const uint32_t w[2] = {h ? v.z : v.x, h ? v.w : v.y};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
                    static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * j)) & 0xffffu), __NV_E4M3);
                const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&r));
                f[4 * i + 2 * j] = t.x;
                f[4 * i + 2 * j + 1] = t.y;
            }
        }
    }
    // e4m3 pairs -> half2 (one cvt each, exact: e4m3 fits fp16) -> float2. Byte j is element j.
    __device__ static __forceinline__ void decode(const uint4& v, float (&f)[16]) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const __half2_raw r = __nv_cvt_fp8x2_to_halfraw2(
                    static_cast<__nv_fp8x2_storage_t>((w[i] >> (16 * h)) & 0xffffu), __NV_E4M3);
                const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&r));
                f[4 * i + 2 * h] = t.x;
                f[4 * i + 2 * h + 1] = t.y;
            }
        }
    }
};

template <typename XT, int N>
__device__ __forceinline__ void load_xn(const XT* x, float (&v)[N]) {
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
        float t[8];
        load_x8(x + 8 * j, t);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[8 * j + i] = t[i];
    }
}

// Row `row` of the weight as 16-byte chunks; FP8 rows have stride w_ld bytes (Fp8Weight::k_pad).
template <typename WF>
__device__ __forceinline__ const uint4* weight_row(const GemvArgs& a, int row) {
    if constexpr (WF::kElems == 16)
        return reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(a.w) + static_cast<int64_t>(row) * a.w_ld);
    else
        return reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.w) + static_cast<int64_t>(row) * a.k);
}
// The block scale of chunk c of `row` (1 for bf16): 128-element blocks are 8 FP8 chunks.
template <typename WF>
__device__ __forceinline__ float chunk_scale(const GemvArgs& a, int row, int c) {
    if constexpr (WF::kElems == 16)
        return __ldg(a.w_scale + static_cast<int64_t>(row / 128) * (a.w_ld / 128) + c / 8);
    else
        return 1.0f;
}
// acc[m] += (w · x_m) over one chunk. bf16: straight into the accumulator (the r2 order); FP8:
// the chunk's partial sum times its block scale.
template <typename WF, typename XT, int MT>
__device__ __forceinline__ void chunk_fma(const float (&wf)[WF::kElems], float scale, const XT* x, int k, int c,
                                          int num_tokens, float (&acc)[MT]) {
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m < num_tokens) {
            float xv[WF::kElems];
            load_xn(x + static_cast<int64_t>(m) * k + WF::kElems * c, xv);
            if constexpr (WF::kElems == 16) {
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < WF::kElems; ++i) p += wf[i] * xv[i];
                acc[m] += scale * p;
            } else {
#pragma unroll
                for (int i = 0; i < WF::kElems; ++i) acc[m] += wf[i] * xv[i];
            }
        }
    }
}

// Resident CTAs per SM the kernels are compiled for. FP8 rows are short (2880 bytes: 6 chunks a
// lane), so the whole matrix can be in flight in one wave if registers allow 3 CTAs (24 warps) an
// SM: 3,168 warps cover the 2,880 rows of O and the 2,560 row pairs of QKV. (At 160 registers the
// first FP8 QKV kernel ran 1 CTA an SM, 2.4 waves, and was slower than bf16.)
// MT: most tokens a launch handles (accumulators per row); the batch-1 instance (MT = 1) is the
// one that needs the registers for 3 CTAs an SM without spilling.
template <typename WF, int MT>
constexpr int kMinBlocks = WF::kElems == 16 ? (MT == 1 ? 3 : 2) : 1;

// One warp per output row; lanes stride over 16-byte chunks of the row, U chunks in flight.
template <typename XT, typename WF, int U, int MT = kGemvMaxTokens>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<WF, MT>) gemv_kernel(const GemvArgs a) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * kWarps + warp;
    if (row >= a.n) return;
    const int chunks = a.k / WF::kElems;
    const uint4* w = weight_row<WF>(a, row);
    const XT* x = static_cast<const XT*>(a.x);
    float acc[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
    // The first round of weight loads is issued before pdl_wait(): weights
    // never change, so they stream in while the kernel before (which writes x) finishes.
    uint4 wv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        wv[u] = c < chunks ? __ldg(w + c) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        if (c0 != lane) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0 + 32 * u;
                wv[u] = c < chunks ? __ldg(w + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (c >= chunks) break;
            float wf[WF::kElems];
            WF::decode(wv[u], wf);
            chunk_fma<WF>(wf, chunk_scale<WF>(a, row, c), x, a.k, c, a.num_tokens, acc);
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m < a.num_tokens) {
            const float s = warp_sum(acc[m]);
            if (lane == 0) a.y[static_cast<int64_t>(m) * a.n + row] = s + (a.bias ? a.bias[row] : 0.0f);
        }
    }
}

// Rows i and i + head_dim/2 of head h (bias added: x1, x2) for token m: q and k heads rotated as
// qkv_rope_kernel does, q written to q_out, k and v to the paged cache at the token's slot.
__device__ __forceinline__ void rope_store(const QkvRopeArgs& r, int h, int i, int m, float x1, float x2) {
    const int hd = r.head_dim, half = hd / 2, nq = r.num_heads, nkv = r.num_kv_heads;
    const int slot = r.slot_mapping[m];
    if (h < nq + nkv) {  // q or k head: rotate
        float sn, cs, y1, y2;
        rope_cos_sin(r.positions[m], r.inv_freq[i], r.attention_scaling, cs, sn);
        rope_rotate(x1, x2, cs, sn, y1, y2);
        if (h < nq) {
            __nv_bfloat16* q = static_cast<__nv_bfloat16*>(r.q_out) + static_cast<int64_t>(m) * nq * hd + h * hd;
            q[i] = __float2bfloat16(y1);
            q[i + half] = __float2bfloat16(y2);
        } else if (slot >= 0) {
            const int64_t k = static_cast<int64_t>(slot) * nkv * hd + (h - nq) * hd;
            store_kv(r.k_cache, k + i, y1, r.kv_fp8);
            store_kv(r.k_cache, k + i + half, y2, r.kv_fp8);
        }
    } else if (slot >= 0) {  // v head: copied
        const int64_t v = static_cast<int64_t>(slot) * nkv * hd + (h - nq - nkv) * hd;
        store_kv(r.v_cache, v + i, x1, r.kv_fp8);
        store_kv(r.v_cache, v + i + half, x2, r.kv_fp8);
    }
}

// Row pair (r0, r0 + half) of one head per warp; the loop is gemv_kernel's, for two rows at once.
template <typename XT, typename WF, int U, int MT = kGemvMaxTokens>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<WF, MT>)
    qkv_gemv_rope_kernel(const GemvArgs g, const QkvRopeArgs r) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hd = r.head_dim, half = hd / 2;
    const int pair = blockIdx.x * kWarps + warp;
    if (pair >= g.n / 2) return;
    const int h = pair / half, i = pair % half;
    const int row0 = h * hd + i, row1 = row0 + half;
    const int chunks = g.k / WF::kElems;
    const uint4* w0 = weight_row<WF>(g, row0);
    const uint4* w1 = weight_row<WF>(g, row1);
    const XT* x = static_cast<const XT*>(g.x);
    float acc0[MT], acc1[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) acc0[m] = acc1[m] = 0.0f;
    uint4 wv0[U], wv1[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int c = lane + 32 * u;
        wv0[u] = c < chunks ? __ldg(w0 + c) : make_uint4(0, 0, 0, 0);
        wv1[u] = c < chunks ? __ldg(w1 + c) : make_uint4(0, 0, 0, 0);
    }
    pdl_wait();
    pdl_trigger();
    for (int c0 = lane; c0 < chunks; c0 += 32 * U) {
        if (c0 != lane) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int c = c0 + 32 * u;
                wv0[u] = c < chunks ? __ldg(w0 + c) : make_uint4(0, 0, 0, 0);
                wv1[u] = c < chunks ? __ldg(w1 + c) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int c = c0 + 32 * u;
            if (c >= chunks) break;
            if constexpr (WF::kElems == 16) {
                // Half a chunk of both rows at a time; per (row, token) the partial sum runs over
                // the chunk's 16 elements in order, as chunk_fma's does.
                float p0[MT], p1[MT];
#pragma unroll
                for (int m = 0; m < MT; ++m) p0[m] = p1[m] = 0.0f;
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    float a0[8], a1[8];
                    Fp8W::decode_half(wv0[u], hh, a0);
                    Fp8W::decode_half(wv1[u], hh, a1);
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        if (m < g.num_tokens) {
                            float xv[8];
                            load_x8(x + static_cast<int64_t>(m) * g.k + 16 * c + 8 * hh, xv);
#pragma unroll
                            for (int j = 0; j < 8; ++j) {
                                p0[m] += a0[j] * xv[j];
                                p1[m] += a1[j] * xv[j];
                            }
                        }
                    }
                }
                const float s0 = chunk_scale<WF>(g, row0, c), s1 = chunk_scale<WF>(g, row1, c);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    acc0[m] += s0 * p0[m];
                    acc1[m] += s1 * p1[m];
                }
            } else {  // the r12 order: both rows' FMAs per element, x loaded once
                float f0[WF::kElems], f1[WF::kElems];
                WF::decode(wv0[u], f0);
                WF::decode(wv1[u], f1);
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    if (m < g.num_tokens) {
                        float xv[8];
                        load_x8(x + static_cast<int64_t>(m) * g.k + 8 * c, xv);
#pragma unroll
                        for (int j = 0; j < 8; ++j) {
                            acc0[m] += f0[j] * xv[j];
                            acc1[m] += f1[j] * xv[j];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= g.num_tokens) break;
        const float s0 = warp_sum(acc0[m]), s1 = warp_sum(acc1[m]);
        if (lane == 0) rope_store(r, h, i, m, s0 + r.bias[row0], s1 + r.bias[row1]);
    }
}

// ---- v2: persistent warps, row prefetch ------------------------------------------------------
constexpr int kV2Warps = 4;  // small CTAs: finer occupancy steps at ~150 registers a thread

__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// A lane's chunks lane, lane + 32, ... of one row (NC · 32 · 8 ≥ k).
template <int NC>
__device__ __forceinline__ void load_row(uint4 (&w)[NC], const uint4* row, int chunks, int lane) {
#pragma unroll
    for (int i = 0; i < NC; ++i) {
        const int c = lane + 32 * i;
        w[i] = c < chunks ? ld_stream(row + c) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// Warp gw takes rows gw, gw + W, gw + 2W, ... (W warps in the grid): neighbouring warps read
// neighbouring rows. Before the FMAs of a row, the warp issues all loads of its next row, so each
// lane keeps up to 2 · NC · 16 bytes in flight and no warp waits on a second round trip per row.
template <typename XT, int NC>
__global__ void __launch_bounds__(kV2Warps * 32) gemv_v2_kernel(const __grid_constant__ GemvArgs a) {
    pdl_wait();  // launched without PDL; a no-op, kept so a PDL launch stays safe
    const int lane = threadIdx.x & 31;
    const int stride = gridDim.x * kV2Warps;
    int row = blockIdx.x * kV2Warps + (threadIdx.x >> 5);
    if (row >= a.n) return;  // warp-uniform
    const int chunks = a.k / 8;
    const uint4* w = static_cast<const uint4*>(a.w);
    const XT* x = static_cast<const XT*>(a.x);
    uint4 cur[NC];
    load_row<NC>(cur, w + static_cast<int64_t>(row) * chunks, chunks, lane);
    for (;;) {
        const int next = row + stride;
        uint4 nxt[NC];
        if (next < a.n) {
            load_row<NC>(nxt, w + static_cast<int64_t>(next) * chunks, chunks, lane);
        } else {
#pragma unroll
            for (int i = 0; i < NC; ++i) nxt[i] = make_uint4(0u, 0u, 0u, 0u);
        }
        float acc[kGemvMaxTokens];
#pragma unroll
        for (int m = 0; m < kGemvMaxTokens; ++m) acc[m] = 0.0f;
#pragma unroll
        for (int i = 0; i < NC; ++i) {
            const int c = lane + 32 * i;
            if (c < chunks) {
                const uint32_t ww[4] = {cur[i].x, cur[i].y, cur[i].z, cur[i].w};
                float wf[8];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    wf[2 * j] = __uint_as_float(ww[j] << 16);
                    wf[2 * j + 1] = __uint_as_float(ww[j] & 0xffff0000u);
                }
#pragma unroll
                for (int m = 0; m < kGemvMaxTokens; ++m) {
                    if (m < a.num_tokens) {
                        float xv[8];
                        load_x8(x + static_cast<int64_t>(m) * a.k + 8 * c, xv);
#pragma unroll
                        for (int j = 0; j < 8; ++j) acc[m] = fmaf(wf[j], xv[j], acc[m]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < kGemvMaxTokens; ++m) {
            if (m < a.num_tokens) {  // uniform
                const float s = warp_sum(acc[m]);
                if (lane == 0) a.y[static_cast<int64_t>(m) * a.n + row] = s + (a.bias ? a.bias[row] : 0.0f);
            }
        }
        if (next >= a.n) break;
        row = next;
#pragma unroll
        for (int i = 0; i < NC; ++i) cur[i] = nxt[i];
    }
}

// Resident CTAs per SM × SMs for one instance, queried once (host-only: graph-capturable).
template <typename XT, int NC>
int v2_grid_limit() {
    // Per device, and safe from the ranks' threads of a parallel layout.
    constexpr int kDevices = 64;
    static std::atomic<int> cached[kDevices];
    int device = 0, sms = 0, per_sm = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (device < kDevices) {
        const int b = cached[device].load(std::memory_order_acquire);
        if (b != 0) return b;
    }
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_v2_kernel<XT, NC>, kV2Warps * 32, 0));
    const int blocks = std::max(1, per_sm) * sms;
    if (device < kDevices) cached[device].store(blocks, std::memory_order_release);
    return blocks;
}

// ---- FP8 on the tensor cores: several tokens a launch -----------------------------------------
// The one-warp-per-row kernel reads, for every 16 weight bytes, 32–64 bytes of x per token from L1,
// so past one token it is bound by L1, not DRAM (r22: lm_head 1,248 µs at 4 tokens, 319 at 1).
// Here the weights are the A operand of mma.m16n8k16 (bf16, fp32 accumulation) and the tokens its
// 8 columns, as in moe_decode_mma (moe_decode.cu):
// - A CTA is one 16-row tile; its 8 warps take the tile's 64-byte K steps in turn (warp w: steps
//   w, w + 8, ...). Lane (g, t) loads bytes 16t .. 16t + 15 of each step of rows g and g + 8. All
//   loads of a round (≤ 8 steps: k ≤ 4,096 in one) are issued before any math, the first round
//   before pdl_wait (weights never change).
// - K order inside an MMA is free as long as A and B agree. Word j of a lane's 16 bytes feeds MMA
//   j: its bytes (0, 2) are the pair at logical k (2t, 2t + 1), bytes (1, 3) the pair at (2t + 8,
//   2t + 9). An e4m3 byte becomes a bf16 by moving bits (the sign to bit 15, the other 7 bits to
//   bits 4..10: value · 2^-120, subnormals included) and one exact bf16x2 multiply by 2^120.
// - x: lane (g, t) reads token g's 16 values at the same k, rounded to bf16; lanes g ≥ num_tokens
//   read nothing. Products are exact in fp32 and sums fp32, so the one rounding beyond the fp32
//   kernel's is x to bf16 (as every bf16 GEMM and moe_decode_mma do).
// - Each step's 4 MMAs go to a scratch accumulator, added to the tile's times the step's block
//   scale (rows g and g + 8 each their own). The 8 warps' sums meet in shared memory in warp order.
// kRope: the QKV tile of head h holds rows i0 .. i0 + 7 and half + i0 .. half + i0 + 7 (the pairs
// RoPE rotates) and ends as qkv_gemv_rope_kernel does.
constexpr int kMmaWarps = 8;
constexpr int kMmaSteps = 8;  // 64-byte K steps a warp keeps in flight
// GemvFp8Kernel::kMmaOneWave (the default for k ≤ 3,072 since r23): 6 steps a warp (k ≤ 3,072 in
// one round) and the tile's block scales in shared memory instead of 16 registers, to fit 3 CTAs an
// SM: the QKV projection's 320 tiles then run in one wave of 396 slots instead of two of 264.
// Measured (r23, 20b --fp8, 1k context): batch 1 2.055 → 2.005 ms a step, batch 4 3.797 → 3.715.
constexpr int kMmaStepsOneWave = 6;
constexpr int kOneWaveMaxK = kMmaWarps * kMmaStepsOneWave * 64;  // 3,072

// Bytes (0, 2) and (1, 3) of an e4m3 word as bf16x2 pairs (the lower byte in the low half), exact.
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t w, uint32_t& even, uint32_t& odd) {
    constexpr uint32_t k2p120 = 0x7B807B80u;  // bf16x2 (2^120, 2^120)
    even = bf16x2_mul(((w << 4) & 0x07f007f0u) | ((w << 8) & 0x80008000u), k2p120);
    odd = bf16x2_mul(((w >> 4) & 0x07f007f0u) | (w & 0x80008000u), k2p120);
}

// Token values k .. k + 15 as 8 bf16x2 words, word q = (x[2q], x[2q + 1]).
__device__ __forceinline__ void load_x16_bf16(const float* x, uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float4 v = __ldg(reinterpret_cast<const float4*>(x) + i);
        w[2 * i] = pack_bf16x2(v.x, v.y);
        w[2 * i + 1] = pack_bf16x2(v.z, v.w);
    }
}
__device__ __forceinline__ void load_x16_bf16(const __nv_bfloat16* x, uint32_t (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(x) + i);
        w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
}

// kF16 (GemvArgs::mma_f16, session 35): the same MMAs in f16. An e4m3 pair becomes an f16 pair in
// one instruction (cvt.rn.f16x2.e4m3x2, F2FP.F16.E4M3.UNPACK_B: exact, subnormals included)
// where the bf16 route above takes five; cvt_bench measured 141 against 65 values an SM-clock. x is
// rounded to bf16 as before (so the products are the same), then staged once a CTA in shared memory
// as f16, which holds every bf16 value of [2^-14, 65504] exactly (below, f16's subnormals round it
// within 2^-25). A token whose x reaches 65504 in magnitude is staged again scaled down by a power of
// two and its sums scaled back (moe_common.cuh f16_stage_rows).
// Row pitch of the staged x in 32-bit words: k / 2 + 4 (16 bytes of padding: the 8 rows that lanes g
// read at one offset fall in different banks).
__host__ __device__ __forceinline__ int xs_pitch_words(int k) { return k / 2 + 4; }

// ---- a sliding layer's decode attention in the QKV kernel's last CTA of each kv head (kTail) -----
// QkvAttnTailArgs (gemv.h). The window's keys (at most kTailKeys) land as rows of two [128][64] bf16
// tiles in shared memory (K, V; the attention kernels' XOR swizzle), warp w takes rows 16w .. 16w + 15
// as the decode attention kernel's warps take 16 keys of a 64-key tile (Q with the 8 heads in MMA rows
// 0-7, S = Q·Kᵀ, masked, a sink-free partial (m, l, acc) a warp), and the 8 partials meet in shared
// memory with the sink added once, as that kernel's one-split merge does.
constexpr int kTailKeys = kMmaWarps * 16;            // 128
constexpr int kTailTileBytes = kTailKeys * 128;      // 16 KB: K (or V) rows of one kv head
constexpr int kTailSmem = 2 * kTailTileBytes + 128;  // + slack to align the tiles to 128 bytes
constexpr int kTailRedStride = 68;                   // a (warp, head) row of the merge: acc[64], m, l, pad
constexpr float kTailLog2e = 1.4426950408889634f;
constexpr float kTailNegBig = -1.0e30f;  // attention.cu's kNegBig
static_assert(kMmaWarps * 8 * kTailRedStride * 4 <= 2 * kTailTileBytes, "the merge scratch reuses the tiles");

__device__ __forceinline__ uint32_t tail_swizzle(int row, int chunk) {
    return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}
__device__ __forceinline__ void tail_ldsm_x4(uint32_t (&r)[4], uint32_t addr, bool trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                     : "r"(addr));
}
__device__ __forceinline__ float tail_exp2(float x) {  // ex2.approx(−inf) = +0: masked keys drop out
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float tail_quad(float v, bool is_max) {
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, u) : v + u;
    }
    return v;
}

// Whether the tail's keys come in more than one chunk (full layers, or windows past kTailKeys): two
// chunk buffers then (double buffering), one otherwise. The launch sizes its shared memory by the same rule.
__host__ __device__ __forceinline__ bool tail_two_buffers(int window) { return window < 1 || window > kTailKeys; }
constexpr int kTailPrefetchKeys = 2 * kTailKeys;  // the keys prefetched into L2: the first two chunks
// qkv_attention_tail_applies: at most this many visible keys past one chunk (16 chunks a CTA, one after another).
constexpr int kTailMaxKeys = 16 * kTailKeys;

// Before pdl_wait: the first kTailPrefetchKeys visible keys' K and V rows of every kv head into L2 (a
// 128-byte line a thread), so that the ticket's last CTAs read them from L2; later chunks stream behind
// the first ones' math. Keys of earlier steps; the token's own row is written by this launch (a prefetch
// of it is harmless). The position and the block table are the step's inputs, written before the
// graph's first kernel.
__device__ __forceinline__ void attention_tail_prefetch(const QkvRopeArgs& r, const QkvAttnTailArgs& t) {
    const int pos = t.seq_start_pos[0];
    const int kv_lo = t.window > 0 ? max(0, pos - t.window + 1) : 0, nkv = r.num_kv_heads;
    const int lines = 2 * min(pos - kv_lo + 1, kTailPrefetchKeys) * nkv;  // (key, K or V) pairs × a kv head's line
    const int shift = __ffs(t.block_size) - 1;
    for (int f = blockIdx.x * blockDim.x + threadIdx.x; f < lines; f += gridDim.x * blockDim.x) {
        const int pair = f / nkv, line = f - pair * nkv, j = kv_lo + (pair >> 1);
        const int64_t slot =
            (static_cast<int64_t>(__ldg(t.block_table + (j >> shift))) << shift) + (j & (t.block_size - 1));
        const uint8_t* c = static_cast<const uint8_t*>((pair & 1) ? r.v_cache : r.k_cache);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + (slot * nkv + line) * 128));
    }
}

// After the CTA's q / k / v stores (rope_store): a ticket for kv head kvh; the last of its `ctas` CTAs
// runs the attention. The ticket is MoeResidualTail's (moe_decode.cu): one atom.acq_rel.gpu by thread 0
// after a CTA barrier (the release covers the CTA's stores, cumulative), the acquire the other CTAs';
// the reads below go to L2 (cp.async.cg, ld.global.cg). smem: free to reuse, kTailSmem bytes (two
// buffers: 2 · kTailSmem; tail_two_buffers).
// The visible keys [kv_lo, pos] come in chunks of kTailKeys (chunk c's row i = key kv_lo + 128c + i,
// zeros past pos); warp w takes rows 16w .. 16w + 15 of every chunk with the decode kernel's online
// softmax (running max m, sum l, acc rescaled by 2^(m_old − m_new)).
__device__ __forceinline__ void attention_tail(const QkvRopeArgs& r, const QkvAttnTailArgs& t, int kvh, int ctas,
                                               void* smem) {
    __shared__ int s_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t prev;
        asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(prev) : "l"(t.counters + kvh) : "memory");
        s_last = static_cast<int>(prev) + 1 >= ctas;
        if (s_last) t.counters[kvh] = 0u;  // every CTA of the kv head has taken its ticket
    }
    __syncthreads();
    if (!s_last) return;
    const int q_row = t.query_start[0];
    if (t.query_start[1] - q_row != 1) return;  // not a decode token (as the decode attention kernel)
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
    const int pos = t.seq_start_pos[0];
    const int kv_lo = t.window > 0 ? max(0, pos - t.window + 1) : 0, nkeys = pos - kv_lo + 1;
    const int n_chunks = (nkeys + kTailKeys - 1) / kTailKeys, nkv = r.num_kv_heads;
    const int shift = __ffs(t.block_size) - 1, bmask = t.block_size - 1;
    uint8_t* base =
        reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem) + 127) & ~static_cast<uintptr_t>(127));
    // Chunk c's K and V tiles into buffer c & 1 (K at its start, V kTailTileBytes on), one commit group.
    const auto load_chunk = [&](int c) {
        uint8_t* buf = base + (c & 1) * 2 * kTailTileBytes;
#pragma unroll
        for (int i = 0; i < kTailKeys * 8 / (kMmaWarps * 32); ++i) {  // rows × 16-byte chunks, 4 a thread
            const int e = tid + kMmaWarps * 32 * i, row = e >> 3, part = e & 7, key = c * kTailKeys + row;
            const bool valid = key < nkeys;
            int64_t off = 0;
            if (valid) {
                const int j = kv_lo + key;
                const int64_t slot = (static_cast<int64_t>(__ldg(t.block_table + (j >> shift))) << shift) + (j & bmask);
                off = (slot * nkv + kvh) * 128 + part * 16;
            }
            const uint32_t d = tail_swizzle(row, part);
            cp_async16(buf + d, static_cast<const uint8_t*>(r.k_cache) + off, valid);  // zeros past the last key
            cp_async16(buf + kTailTileBytes + d, static_cast<const uint8_t*>(r.v_cache) + off, valid);
        }
        cp_async_commit();
    };
    load_chunk(0);
    // Q as the A operand, heads in rows 0-7 (rows 8-15 zero): lane (g, t) holds head g, dims 16kc + 2t (+8).
    const uint32_t* qh = reinterpret_cast<const uint32_t*>(
        static_cast<const __nv_bfloat16*>(r.q_out) + (static_cast<int64_t>(q_row) * r.num_heads + kvh * 8 + g) * 64);
    uint32_t qa[4][2];
#pragma unroll
    for (int kc4 = 0; kc4 < 4; ++kc4) {
        qa[kc4][0] = __ldcg(qh + kc4 * 8 + tig);
        qa[kc4][1] = __ldcg(qh + kc4 * 8 + 4 + tig);
    }
    const float qk_scale = t.scale * kTailLog2e;
    float m = kTailNegBig, l = 0.0f;  // this warp's sink-free partial softmax state of head g (base 2)
    float acc[8][4];                  // [d tile][c]: c0, c1 = head g, dims 8dt + 2t, +1 (c2, c3 stay 0)
#pragma unroll
    for (int dt = 0; dt < 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.0f;
#pragma unroll 1
    for (int c = 0; c < n_chunks; ++c) {
        if (c + 1 < n_chunks) {  // the next chunk into the other buffer (freed by the previous barrier)
            load_chunk(c + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // chunk c has landed for every thread
        const uint32_t ks = smem_addr(base + (c & 1) * 2 * kTailTileBytes), vs = ks + kTailTileBytes;
        // S: 8 heads × this warp's 16 keys (n-tile 0: rows 16w .. 16w + 7, n-tile 1: the next 8).
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kc4 = 0; kc4 < 4; ++kc4) {
            uint32_t kb[4];
            tail_ldsm_x4(
                kb, ks + tail_swizzle(warp * 16 + (lane & 7) + ((lane >> 4) << 3), kc4 * 2 + ((lane >> 3) & 1)), false);
            mma_bf16(s[0], qa[kc4][0], 0u, qa[kc4][1], 0u, kb[0], kb[1]);
            mma_bf16(s[1], qa[kc4][0], 0u, qa[kc4][1], 0u, kb[2], kb[3]);
        }
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                if (c * kTailKeys + warp * 16 + nt * 8 + tig * 2 + e >= nkeys) s[nt][e] = -INFINITY;
                mx = fmaxf(mx, s[nt][e]);
            }
        mx = tail_quad(mx, true);
        const float m_new = fmaxf(m, mx * qk_scale);  // stays kNegBig while all keys are masked
        const float corr = tail_exp2(m - m_new);
        m = m_new;
        float p[2][2], sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                p[nt][e] = tail_exp2(fmaf(s[nt][e], qk_scale, -m_new));
                sum += p[nt][e];
            }
        l = l * corr + sum;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt) {
            acc[dt][0] *= corr;
            acc[dt][1] *= corr;
        }
        // P·V: P as the A operand (rows 0-7 = heads, k = this warp's 16 keys), V by transposed ldmatrix.
        const uint32_t pa0 = pack_bf16x2(p[0][0], p[0][1]), pa2 = pack_bf16x2(p[1][0], p[1][1]);
#pragma unroll
        for (int dp = 0; dp < 4; ++dp) {
            uint32_t vb[4];
            tail_ldsm_x4(vb, vs + tail_swizzle(warp * 16 + (lane & 7) + (((lane >> 3) & 1) << 3), dp * 2 + (lane >> 4)),
                         true);
            mma_bf16(acc[2 * dp], pa0, 0u, pa2, 0u, vb[0], vb[1]);
            mma_bf16(acc[2 * dp + 1], pa0, 0u, pa2, 0u, vb[2], vb[3]);
        }
        __syncthreads();  // every warp is done with chunk c's buffer (the next load, or the merge scratch)
    }
    float* red = reinterpret_cast<float*>(base);  // [warp][head][kTailRedStride]
    l = tail_quad(l, false);
    {
        float* mine = red + (warp * 8 + g) * kTailRedStride;
#pragma unroll
        for (int dt = 0; dt < 8; ++dt)
            *reinterpret_cast<float2*>(mine + dt * 8 + tig * 2) = make_float2(acc[dt][0], acc[dt][1]);
        if (tig == 0) {
            mine[64] = m;
            mine[65] = l;
        }
    }
    __syncthreads();
    // Thread (h = warp, lane): head kvh · 8 + h, dims 2·lane and 2·lane + 1; the sink once.
    const int h = warp, d0 = 2 * lane;
    float mw = kTailNegBig;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) mw = fmaxf(mw, red[(w * 8 + h) * kTailRedStride + 64]);
    float lw = 0.0f, o0 = 0.0f, o1 = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) {
        const float* rw = red + (w * 8 + h) * kTailRedStride;
        const float f = tail_exp2(rw[64] - mw);
        lw += f * rw[65];
        o0 += f * rw[d0];
        o1 += f * rw[d0 + 1];
    }
    const int head = kvh * 8 + h;
    const float sink = fmaxf(t.sinks[head] * kTailLog2e, kTailNegBig);
    const float mx_all = fmaxf(mw, sink);
    const float f = tail_exp2(mw - mx_all);
    const float sc = f / (lw * f + tail_exp2(sink - mx_all));
    __nv_bfloat16* dst =
        static_cast<__nv_bfloat16*>(t.out) + (static_cast<int64_t>(q_row) * r.num_heads + head) * 64 + d0;
    *reinterpret_cast<uint32_t*>(dst) = pack_bf16x2(o0 * sc, o1 * sc);
}

template <typename XT, bool kRope, int kSteps = kMmaSteps, bool kF16 = false, bool kTail = false>
__global__ void __launch_bounds__(kMmaWarps * 32, kSteps == kMmaSteps ? 2 : 3)
    gemv_fp8_mma_kernel(const __grid_constant__ GemvArgs a, const __grid_constant__ QkvRopeArgs r,
                        const __grid_constant__ QkvAttnTailArgs tail) {
    static_assert(!kTail || kRope, "the attention tail follows the QKV projection");
    constexpr bool kSmemScales = kSteps != kMmaSteps;  // the one-wave variant
    __shared__ float red[kMmaWarps][16][8];            // [warp][tile row][token]
    // One-wave variant: the block scales of tile rows 0-7 and 8-15 (k ≤ 3,072: ≤ 24 blocks each).
    __shared__ float s_scale[2][kSmemScales ? kOneWaveMaxK / 128 : 1];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    int head = 0, i0 = 0, row_lo, row_hi;  // this lane's rows g and g + 8 of the tile
    if constexpr (kRope) {
        const int half = r.head_dim / 2, tiles = half / 8;
        head = blockIdx.x / tiles;
        i0 = (blockIdx.x % tiles) * 8;
        row_lo = head * r.head_dim + i0 + g;
        row_hi = row_lo + half;
    } else {
        row_lo = blockIdx.x * 16 + g;
        row_hi = row_lo + 8;
    }
    const int ld_lo = min(row_lo, a.n - 1), ld_hi = min(row_hi, a.n - 1);  // rows past n: loaded, not stored
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    const uint8_t* p_lo = w + static_cast<int64_t>(ld_lo) * a.w_ld + 16 * t;
    const uint8_t* p_hi = w + static_cast<int64_t>(ld_hi) * a.w_ld + 16 * t;
    const int kb = a.w_ld / 128;
    const float* sc_lo = a.w_scale + static_cast<int64_t>(ld_lo / 128) * kb;
    const float* sc_hi = a.w_scale + static_cast<int64_t>(ld_hi / 128) * kb;
    const int S = a.k / 64;

    uint4 wl[kSteps], wh[kSteps];
    float sl[kSmemScales ? 1 : kSteps], sh[kSmemScales ? 1 : kSteps];
    auto load = [&](int base) {
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
            const int s = base + kMmaWarps * i;
            if (s < S) {
                wl[i] = ld_stream(reinterpret_cast<const uint4*>(p_lo + s * 64));
                wh[i] = ld_stream(reinterpret_cast<const uint4*>(p_hi + s * 64));
                if constexpr (!kSmemScales) {
                    sl[i] = __ldg(sc_lo + (s >> 1));
                    sh[i] = __ldg(sc_hi + (s >> 1));
                }
            }
        }
    };
    load(warp);
    if constexpr (kSmemScales) {  // the scale rows of tile rows 0 and 8 (each half in one 128-row block)
        const float* lo = a.w_scale + static_cast<int64_t>(min(row_lo - g, a.n - 1) / 128) * kb;
        const float* hi = a.w_scale + static_cast<int64_t>(min(row_hi - g, a.n - 1) / 128) * kb;
        for (int i = threadIdx.x; i < 2 * kb; i += kMmaWarps * 32)
            s_scale[i / kb][i % kb] = __ldg((i < kb ? lo : hi) + i % kb);
    }
    if constexpr (kTail) attention_tail_prefetch(r, tail);
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    // GemvArgs::x_ss_parts: the last warp sums them (loads issued now, the sum read in the epilogue,
    // after the barrier there).
    __shared__ float s_inv;
    if (a.x_ss_parts != nullptr && warp == kMmaWarps - 1) {
        float ss = 0.0f;
        for (int i = lane; i < a.x_ss_n; i += 32) ss += __ldcg(a.x_ss_parts + i);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) s_inv = rsqrtf(ss / static_cast<float>(a.k) + a.x_eps);
    }
    // kF16: x staged once a CTA (moe_common.cuh f16_stage_rows; its barrier also covers s_scale).
    extern __shared__ uint32_t xs_f16[];
    __shared__ F16StageShared s_stage;
    uint32_t down = 0;
    if constexpr (kF16) {
        const XT* xin = static_cast<const XT*>(a.x);
        down = f16_stage_rows(
            xs_f16, xs_pitch_words(a.k), a.num_tokens, a.k, std::is_same_v<XT, float>,
            [&](int m) -> const void* { return xin + static_cast<int64_t>(m) * a.k; }, s_stage);
    } else if constexpr (kSmemScales) {
        __syncthreads();  // s_scale
    }

    const bool has_x = g < a.num_tokens;
    const XT* x = static_cast<const XT*>(a.x) + static_cast<int64_t>(has_x ? g : 0) * a.k + 16 * t;
    const uint32_t* xrow = xs_f16 + (has_x ? g : 0) * xs_pitch_words(a.k) + 8 * t;  // kF16
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // rows g, g + 8 × tokens 2t, 2t + 1
    for (int base = warp; base < S; base += kMmaWarps * kSteps) {
        if (base != warp) load(base);
#pragma unroll
        for (int i = 0; i < kSteps; ++i) {
            const int s = base + kMmaWarps * i;
            if (s >= S) break;
            uint32_t xw[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};
            const uint32_t lo[4] = {wl[i].x, wl[i].y, wl[i].z, wl[i].w};
            const uint32_t hi[4] = {wh[i].x, wh[i].y, wh[i].z, wh[i].w};
            float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if constexpr (kF16) {
                // Word j of the lane's 16 bytes feeds MMA j: bytes (0, 1) are the pair at logical k
                // (2t, 2t + 1), bytes (2, 3) at (2t + 8, 2t + 9); x word q is the pair (x[2q], x[2q + 1]).
                if (has_x) {
                    const uint4 x0 = *reinterpret_cast<const uint4*>(xrow + 32 * s);
                    const uint4 x1 = *reinterpret_cast<const uint4*>(xrow + 32 * s + 4);
                    xw[0] = x0.x, xw[1] = x0.y, xw[2] = x0.z, xw[3] = x0.w;
                    xw[4] = x1.x, xw[5] = x1.y, xw[6] = x1.z, xw[7] = x1.w;
                }
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    mma_f16(tmp, cvt_e4m3x2_f16x2_lo(lo[j]), cvt_e4m3x2_f16x2_lo(hi[j]), cvt_e4m3x2_f16x2_hi(lo[j]),
                            cvt_e4m3x2_f16x2_hi(hi[j]), xw[2 * j], xw[2 * j + 1]);
            } else {
                if (has_x) load_x16_bf16(x + s * 64, xw);
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t le, lodd, he, hodd;
                    e4m3x4_to_bf16x2(lo[j], le, lodd);
                    e4m3x4_to_bf16x2(hi[j], he, hodd);
                    // x pairs at the same k: (x[4j], x[4j + 2]) and (x[4j + 1], x[4j + 3]).
                    const uint32_t b0 = __byte_perm(xw[2 * j], xw[2 * j + 1], 0x5410);
                    const uint32_t b1 = __byte_perm(xw[2 * j], xw[2 * j + 1], 0x7632);
                    mma_bf16(tmp, le, he, lodd, hodd, b0, b1);
                }
            }
            const float s_lo = kSmemScales ? s_scale[0][s >> 1] : sl[i];
            const float s_hi = kSmemScales ? s_scale[1][s >> 1] : sh[i];
            acc[0] = fmaf(s_lo, tmp[0], acc[0]);
            acc[1] = fmaf(s_lo, tmp[1], acc[1]);
            acc[2] = fmaf(s_hi, tmp[2], acc[2]);
            acc[3] = fmaf(s_hi, tmp[3], acc[3]);
        }
    }

    red[warp][g][2 * t] = acc[0];
    red[warp][g][2 * t + 1] = acc[1];
    red[warp][g + 8][2 * t] = acc[2];
    red[warp][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    const float inv = a.x_ss_parts != nullptr ? s_inv : 1.0f;
    if constexpr (kRope) {
        if (threadIdx.x < 64) {
            const int p = threadIdx.x & 7, m = threadIdx.x >> 3;
            if (m < a.num_tokens) {
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int v = 0; v < kMmaWarps; ++v) {
                    s0 += red[v][p][m];
                    s1 += red[v][p + 8][m];
                }
                const int row0 = head * r.head_dim + i0 + p;
                if constexpr (kF16) s0 = f16_unstage(s0, down, m, s_stage), s1 = f16_unstage(s1, down, m, s_stage);
                s0 *= inv, s1 *= inv;
                rope_store(r, head, i0 + p, m, s0 + r.bias[row0], s1 + r.bias[row0 + r.head_dim / 2]);
            }
        }
        if constexpr (kTail) {  // this CTA's kv head: of its q heads, its k head or its v head
            const int nq = r.num_heads, nkv = r.num_kv_heads;
            const int kvh = head < nq ? head / (nq / nkv) : head < nq + nkv ? head - nq : head - nq - nkv;
            attention_tail(r, tail, kvh, (nq / nkv + 2) * (r.head_dim / 16), xs_f16);
        }
    } else if (threadIdx.x < 128) {
        const int rr = threadIdx.x & 15, m = threadIdx.x >> 4, row = blockIdx.x * 16 + rr;
        if (m < a.num_tokens && row < a.n) {
            float v = 0.0f;
#pragma unroll
            for (int u = 0; u < kMmaWarps; ++u) v += red[u][rr][m];
            if constexpr (kF16) v = f16_unstage(v, down, m, s_stage);
            v *= inv;
            a.y[static_cast<int64_t>(m) * a.n + row] = v + (a.bias ? a.bias[row] : 0.0f);
        }
    }
}

// Whether the MMA kernel takes these arguments (else the one-warp-per-row kernel runs).
bool fp8_mma_ok(const GemvArgs& a, const QkvRopeArgs* r) {
    if (a.w_scale == nullptr || a.k % 64 != 0 || a.w_ld % 128 != 0 || a.n < 1) return false;
    if (r != nullptr && ((r->head_dim / 2) % 8 != 0 || a.n % r->head_dim != 0)) return false;
    return a.fp8_kernel != GemvFp8Kernel::kRowPerWarp;
}

}  // namespace

bool gemv_fp8_mma_applies(const GemvArgs& a, bool qkv, int head_dim) {
    QkvRopeArgs r;
    r.head_dim = head_dim;
    return fp8_mma_ok(a, qkv ? &r : nullptr);
}

namespace {

// GPTOSS_GEMV_F16=0: the bf16 MMAs whatever GemvArgs::mma_f16 says (A/B runs).
bool gemv_f16_allowed() {
    static const bool on = [] {
        const char* v = std::getenv("GPTOSS_GEMV_F16");
        return v == nullptr || std::strcmp(v, "0") != 0;
    }();
    return on;
}

template <bool kRope, bool kF16, bool kTail = false>
void fp8_mma_launch_as(const GemvArgs& a, const QkvRopeArgs& r, const QkvAttnTailArgs& t, cudaStream_t stream) {
    const int grid = kRope ? a.n / 16 : (a.n + 15) / 16;
    // kF16's staged x: num_tokens rows of k / 2 + 4 words.
    // kTail: the attention's tiles reuse it (after the projection), kTailSmem at least.
    const size_t xs_bytes = kF16 ? static_cast<size_t>(a.num_tokens) * (a.k / 2 + 4) * 4 : 0;
    const size_t tail_bytes = static_cast<size_t>(kTailSmem) * (tail_two_buffers(t.window) ? 2 : 1);
    const size_t smem = kTail ? std::max(xs_bytes, tail_bytes) : xs_bytes;
    // kAuto: the one-wave variant for grids its 3 CTAs an SM hold at once (the QKV projection), but
    // not in f16 beyond that: lm_head at 1 token (12,568 tiles; gemv_bench, r50) 169.4 µs one-wave
    // and 179.0 the 2-an-SM kernel in bf16, 190.1 and 143.9 in f16.
    bool one_wave = a.fp8_kernel == GemvFp8Kernel::kMmaOneWave || a.fp8_kernel == GemvFp8Kernel::kAuto;
    if (kF16 && a.fp8_kernel == GemvFp8Kernel::kAuto) {
        int dev = 0, sms = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        one_wave = grid <= 3 * sms;
    }
    const auto go = [&](auto kernel) {
        fit_dynamic_smem(kernel, smem);
        launch_pdl(kernel, grid, kMmaWarps * 32, smem, stream, a, r, t);
    };
    if (one_wave && a.w_ld <= kOneWaveMaxK) {
        constexpr int kS = kMmaStepsOneWave;
        if (a.x_bf16)
            go(gemv_fp8_mma_kernel<__nv_bfloat16, kRope, kS, kF16, kTail>);
        else
            go(gemv_fp8_mma_kernel<float, kRope, kS, kF16, kTail>);
        return;
    }
    if (a.x_bf16)
        go(gemv_fp8_mma_kernel<__nv_bfloat16, kRope, kMmaSteps, kF16, kTail>);
    else
        go(gemv_fp8_mma_kernel<float, kRope, kMmaSteps, kF16, kTail>);
}
// f16 at one token only: its staging converts every x value a CTA (~30 instructions for 8), which
// at more tokens costs more than the bf16 MMAs' decode it saves (gemv_bench, r50: lm_head at 8 tokens
// 253 -> 382 µs, the QKV one-wave kernel even; 20b decode batch 4 3.17 -> 3.26 ms a step, batch 8
// 5.10 -> 5.30, batch 2 even).
template <bool kRope, bool kTail = false>
void fp8_mma_launch(const GemvArgs& a, const QkvRopeArgs& r, cudaStream_t stream, const QkvAttnTailArgs& t = {}) {
    if (a.mma_f16 && a.num_tokens == 1 && gemv_f16_allowed())
        fp8_mma_launch_as<kRope, true, kTail>(a, r, t, stream);
    else
        fp8_mma_launch_as<kRope, false, kTail>(a, r, t, stream);
}

template <typename XT, int NC>
void v2_launch(const GemvArgs& a, cudaStream_t stream) {
    const int grid = std::min(v2_grid_limit<XT, NC>(), (a.n + kV2Warps - 1) / kV2Warps);
    gemv_v2_kernel<XT, NC><<<grid, kV2Warps * 32, 0, stream>>>(a);
}

template <typename XT>
bool v2_dispatch(const GemvArgs& a, cudaStream_t stream) {
    const int per_lane = (a.k / 8 + 31) / 32;  // 16-byte chunks per lane per row
    if (per_lane <= 4)
        v2_launch<XT, 4>(a, stream);
    else if (per_lane <= 12)
        v2_launch<XT, 12>(a, stream);  // hidden_size 2880
    else if (per_lane <= 16)
        v2_launch<XT, 16>(a, stream);  // q width 4096
    else
        return false;
    return true;
}

}  // namespace

namespace {
// What the tail kernels compute correctly: one token on the tensor-core FP8 QKV kernels, a bf16 cache, 8 q heads
// of 64 a kv head, a power-of-two block size.
bool tail_shapes_ok(const GemvArgs& g, const QkvRopeArgs& r, int block_size) {
    return fp8_mma_ok(g, &r) && g.num_tokens == 1 && r.num_tokens == 1 && !r.kv_fp8 && r.head_dim == 64 &&
           r.num_kv_heads >= 1 && r.num_heads == 8 * r.num_kv_heads && block_size > 0 &&
           (block_size & (block_size - 1)) == 0 && g.n == (r.num_heads + 2 * r.num_kv_heads) * r.head_dim &&
           g.w_ld >= g.k;
}
}  // namespace

bool qkv_attention_tail_applies(const GemvArgs& g, const QkvRopeArgs& r, int num_seqs, int window, bool kv_fp8,
                                int block_size, int max_context_len) {
    if (!tail_shapes_ok(g, r, block_size) || num_seqs != 1 || kv_fp8) return false;
    const int keys = window > 0 ? std::min(window, max_context_len) : max_context_len;
    return (window > 0 && window <= kTailKeys) || keys <= kTailMaxKeys;
}

void qkv_gemv_rope_attention(const GemvArgs& g, const QkvRopeArgs& r, const QkvAttnTailArgs& t, cudaStream_t stream) {
    ENGINE_CHECK(tail_shapes_ok(g, r, t.block_size),
                 "qkv_gemv_rope_attention: %d tokens, n %d, k %d, block size %d unsupported", g.num_tokens, g.n, g.k,
                 t.block_size);
    ENGINE_CHECK(r.q_out != nullptr && t.out != nullptr && t.sinks != nullptr && t.block_table != nullptr &&
                     t.seq_start_pos != nullptr && t.query_start != nullptr && t.counters != nullptr,
                 "qkv_gemv_rope_attention: q_out, out, sinks, the block table, positions and counters are required");
    fp8_mma_launch<true, true>(g, r, stream, t);
}

void qkv_gemv_rope(const GemvArgs& g, const QkvRopeArgs& r, cudaStream_t stream) {
    const bool fp8 = g.w_scale != nullptr;
    ENGINE_CHECK(g.num_tokens >= 1 && g.num_tokens <= kGemvMaxTokens && g.k % (fp8 ? 16 : 8) == 0 &&
                     r.head_dim % 2 == 0 && g.n == (r.num_heads + 2 * r.num_kv_heads) * r.head_dim &&
                     g.num_tokens == r.num_tokens && (!fp8 || (g.w_ld >= g.k && g.w_ld % 128 == 0)),
                 "qkv_gemv_rope: %d tokens, n %d, k %d unsupported", g.num_tokens, g.n, g.k);
    ENGINE_CHECK(r.q_out != nullptr, "qkv_gemv_rope: q_out is required");
    ENGINE_CHECK(g.x_ss_parts == nullptr || (fp8_mma_ok(g, &r) && g.num_tokens == 1),
                 "qkv_gemv_rope: x_ss_parts needs one token on the tensor-core FP8 kernels");
    if (fp8_mma_ok(g, &r)) {
        fp8_mma_launch<true>(g, r, stream);
        return;
    }
    const int blocks = (g.n / 2 + kWarps - 1) / kWarps;
    if (fp8) {  // 6 chunks a lane in flight covers k ≤ 3072 in one round (hidden 2880)
        const bool one = g.num_tokens == 1;
        if (g.x_bf16)
            launch_pdl(
                one ? qkv_gemv_rope_kernel<__nv_bfloat16, Fp8W, 6, 1> : qkv_gemv_rope_kernel<__nv_bfloat16, Fp8W, 6>,
                blocks, kWarps * 32, 0, stream, g, r);
        else
            launch_pdl(one ? qkv_gemv_rope_kernel<float, Fp8W, 6, 1> : qkv_gemv_rope_kernel<float, Fp8W, 6>, blocks,
                       kWarps * 32, 0, stream, g, r);
    } else if (g.x_bf16) {
        launch_pdl(qkv_gemv_rope_kernel<__nv_bfloat16, Bf16W, kUnroll>, blocks, kWarps * 32, 0, stream, g, r);
    } else {
        launch_pdl(qkv_gemv_rope_kernel<float, Bf16W, kUnroll>, blocks, kWarps * 32, 0, stream, g, r);
    }
}

void gemv_bf16w(const GemvArgs& a, cudaStream_t stream) {
    const bool fp8 = a.w_scale != nullptr;
    ENGINE_CHECK(a.num_tokens >= 1 && a.num_tokens <= kGemvMaxTokens && a.k % (fp8 ? 16 : 8) == 0 &&
                     (!fp8 || (a.w_ld >= a.k && a.w_ld % 128 == 0)),
                 "gemv: %d tokens, k %d unsupported", a.num_tokens, a.k);
    ENGINE_CHECK(a.x_ss_parts == nullptr || (fp8 && fp8_mma_ok(a, nullptr) && a.num_tokens == 1),
                 "gemv: x_ss_parts needs one token on the tensor-core FP8 kernels");
    if (a.n == 0) return;
    const int blocks = (a.n + kWarps - 1) / kWarps;
    if (fp8) {  // one round of loads: 6 chunks a lane for k ≤ 3072, 8 for k ≤ 4096 (O), else loops
        const bool k3 = a.k <= 6 * 32 * 16, one = a.num_tokens == 1;
        if (fp8_mma_ok(a, nullptr)) {
            fp8_mma_launch<false>(a, QkvRopeArgs{}, stream);
            return;
        }
        auto kernel = a.x_bf16
                          ? (k3 ? (one ? gemv_kernel<__nv_bfloat16, Fp8W, 6, 1> : gemv_kernel<__nv_bfloat16, Fp8W, 6>)
                                : (one ? gemv_kernel<__nv_bfloat16, Fp8W, 8, 1> : gemv_kernel<__nv_bfloat16, Fp8W, 8>))
                          : (k3 ? (one ? gemv_kernel<float, Fp8W, 6, 1> : gemv_kernel<float, Fp8W, 6>)
                                : (one ? gemv_kernel<float, Fp8W, 8, 1> : gemv_kernel<float, Fp8W, 8>));
        launch_pdl(kernel, blocks, kWarps * 32, 0, stream, a);
        return;
    }
    if (!a.legacy) {
        const bool launched = a.x_bf16 ? v2_dispatch<__nv_bfloat16>(a, stream) : v2_dispatch<float>(a, stream);
        if (launched) {
            CUDA_CHECK_LAUNCH();
            return;
        }
    }
    if (a.x_bf16)
        launch_pdl(gemv_kernel<__nv_bfloat16, Bf16W, kUnroll>, blocks, kWarps * 32, 0, stream, a);
    else
        launch_pdl(gemv_kernel<float, Bf16W, kUnroll>, blocks, kWarps * 32, 0, stream, a);
}

}  // namespace gptoss::kernels::cuda
