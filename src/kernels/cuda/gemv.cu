#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/launch.h"
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
    const int nq = r.num_heads, nkv = r.num_kv_heads;
    auto* q_out = static_cast<__nv_bfloat16*>(r.q_out);
    auto* k_cache = static_cast<__nv_bfloat16*>(r.k_cache);
    auto* v_cache = static_cast<__nv_bfloat16*>(r.v_cache);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
        if (m >= g.num_tokens) break;
        const float s0 = warp_sum(acc0[m]), s1 = warp_sum(acc1[m]);
        if (lane != 0) continue;
        const float x1 = s0 + r.bias[row0], x2 = s1 + r.bias[row1];
        const int slot = r.slot_mapping[m];
        if (h < nq + nkv) {  // q or k head: rotate as qkv_rope_kernel does
            float sn, cs;
            sincosf(static_cast<float>(r.positions[m]) * r.inv_freq[i], &sn, &cs);
            cs *= r.attention_scaling;
            sn *= r.attention_scaling;
            const float y1 = x1 * cs - x2 * sn;
            const float y2 = x2 * cs + x1 * sn;
            if (h < nq) {
                __nv_bfloat16* q = q_out + static_cast<int64_t>(m) * nq * hd + h * hd;
                q[i] = __float2bfloat16(y1);
                q[i + half] = __float2bfloat16(y2);
            } else if (slot >= 0) {
                __nv_bfloat16* k = k_cache + static_cast<int64_t>(slot) * nkv * hd + (h - nq) * hd;
                k[i] = __float2bfloat16(y1);
                k[i + half] = __float2bfloat16(y2);
            }
        } else if (slot >= 0) {  // v head: copied
            __nv_bfloat16* v = v_cache + static_cast<int64_t>(slot) * nkv * hd + (h - nq - nkv) * hd;
            v[i] = __float2bfloat16(x1);
            v[i + half] = __float2bfloat16(x2);
        }
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

// ---- FP8 ring: weights land in shared memory by cp.async, kRingDepth rows deep per warp ---------
// The hypothesis of r21: every register-landing decode kernel (GEMVs, MoE) stops at 1.2–1.8 TB/s
// because the register file bounds the bytes in flight (~70–100 KB an SM), while the kernels that
// land data in shared memory by cp.async (decode attention: 192 KB an SM) reach ~4 TB/s. Here a
// warp keeps kRingDepth rows of 3 KB in flight in its own shared-memory slice (4 warps a CTA,
// 48 KB; 4 CTAs an SM: 192 KB). A lane reads back only the chunks it copied itself, so
// cp.async.wait_group is the only synchronisation. Same chunk arithmetic and order as gemv_kernel.
constexpr int kRingWarps = 4, kRingDepth = 4;
// Slots of kChunks 16-byte chunks: 192 for rows of ≤ 3,072 bytes (hidden 2880: 48 KB a CTA, 4 CTAs
// an SM), 256 for ≤ 4,096 (the O projection: 64 KB, 3 CTAs an SM).

__device__ __forceinline__ void ring_cp16(void* dst, const void* src) {
    asm volatile(
        "cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
        "l"(src)
        : "memory");
}
__device__ __forceinline__ void ring_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void ring_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kRingDepth - 1) : "memory");
}

template <typename XT, int MT, int kRingChunks>
__global__ void __launch_bounds__(kRingWarps * 32) gemv_fp8_ring_kernel(const __grid_constant__ GemvArgs a) {
    extern __shared__ uint4 ring_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int stride = gridDim.x * kRingWarps;
    const int first = blockIdx.x * kRingWarps + warp;
    const int chunks = a.k / Fp8W::kElems;
    const uint8_t* w = static_cast<const uint8_t*>(a.w);
    const XT* x = static_cast<const XT*>(a.x);
    uint4* slots = ring_smem + warp * kRingDepth * kRingChunks;
    auto issue = [&](int i) {  // row first + i·stride into slot i % kRingDepth (an empty group past n)
        const int row = first + i * stride;
        if (row < a.n) {
            const uint4* src = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row) * a.w_ld);
            uint4* dst = slots + (i % kRingDepth) * kRingChunks;
            for (int c = lane; c < chunks; c += 32) ring_cp16(dst + c, src + c);
        }
        ring_commit();
    };
    // Weights first (they never change), then wait for x's producer.
    for (int i = 0; i < kRingDepth - 1; ++i) issue(i);
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    for (int i = 0; first + i * stride < a.n; ++i) {
        issue(i + kRingDepth - 1);
        ring_wait();  // row i's group is complete (this lane's copies)
        const int row = first + i * stride;
        const uint4* src = slots + (i % kRingDepth) * kRingChunks;
        float acc[MT];
#pragma unroll
        for (int m = 0; m < MT; ++m) acc[m] = 0.0f;
        for (int c = lane; c < chunks; c += 32) {
            float wf[Fp8W::kElems];
            Fp8W::decode(src[c], wf);
            chunk_fma<Fp8W>(wf, chunk_scale<Fp8W>(a, row, c), x, a.k, c, a.num_tokens, acc);
        }
#pragma unroll
        for (int m = 0; m < MT; ++m) {
            if (m < a.num_tokens) {  // uniform
                const float s = warp_sum(acc[m]);
                if (lane == 0) a.y[static_cast<int64_t>(m) * a.n + row] = s + (a.bias ? a.bias[row] : 0.0f);
            }
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // no copy outlives the CTA's shared memory
}

template <typename XT, int MT, int kRingChunks>
void fp8_ring_launch(const GemvArgs& a, cudaStream_t stream) {
    constexpr int kSmem = kRingWarps * kRingDepth * kRingChunks * 16;
    static std::atomic<int> cached[64];
    auto kernel = gemv_fp8_ring_kernel<XT, MT, kRingChunks>;
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    int grid = device < 64 ? cached[device].load(std::memory_order_acquire) : 0;
    if (grid == 0) {  // host-only queries: capturable
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));
        int sms = 0, per_sm = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kRingWarps * 32, kSmem));
        grid = std::max(1, per_sm) * sms;
        if (device < 64) cached[device].store(grid, std::memory_order_release);
    }
    grid = std::min(grid, (a.n + kRingWarps - 1) / kRingWarps);
    launch_pdl(kernel, grid, kRingWarps * 32, kSmem, stream, a);
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

void qkv_gemv_rope(const GemvArgs& g, const QkvRopeArgs& r, cudaStream_t stream) {
    const bool fp8 = g.w_scale != nullptr;
    ENGINE_CHECK(g.num_tokens >= 1 && g.num_tokens <= kGemvMaxTokens && g.k % (fp8 ? 16 : 8) == 0 &&
                     r.head_dim % 2 == 0 && g.n == (r.num_heads + 2 * r.num_kv_heads) * r.head_dim &&
                     g.num_tokens == r.num_tokens && (!fp8 || (g.w_ld >= g.k && g.w_ld % 128 == 0)),
                 "qkv_gemv_rope: %d tokens, n %d, k %d unsupported", g.num_tokens, g.n, g.k);
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
    if (a.n == 0) return;
    const int blocks = (a.n + kWarps - 1) / kWarps;
    if (fp8) {  // one round of loads: 6 chunks a lane for k ≤ 3072, 8 for k ≤ 4096 (O), else loops
        const bool k3 = a.k <= 6 * 32 * 16, one = a.num_tokens == 1;
        if (a.fp8_ring && a.k <= 256 * 16 && a.w_ld % 16 == 0) {
            auto ring = [&](auto chunks) {
                constexpr int C = decltype(chunks)::value;
                if (a.x_bf16)
                    one ? fp8_ring_launch<__nv_bfloat16, 1, C>(a, stream)
                        : fp8_ring_launch<__nv_bfloat16, kGemvMaxTokens, C>(a, stream);
                else
                    one ? fp8_ring_launch<float, 1, C>(a, stream)
                        : fp8_ring_launch<float, kGemvMaxTokens, C>(a, stream);
            };
            if (a.k <= 192 * 16)
                ring(std::integral_constant<int, 192>{});
            else
                ring(std::integral_constant<int, 256>{});
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
