// MoE kernels: router top-k, routing plans, weight-only MXFP4 experts (small batches), and the
// gather / SwiGLU / scatter steps around the grouped bf16 GEMMs (large batches).
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <atomic>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/moe_common.cuh"

namespace gptoss::kernels::cuda {
namespace {

constexpr int kMaxExperts = 256;

// ---- router ---------------------------------------------------------------------------------
// The k chosen experts (descending logit) and their softmax weights: vals[0] is the largest.
__device__ __forceinline__ void write_topk(const int (&chosen)[8], float (&vals)[8], int k, int32_t* ids,
                                           float* weights) {
    float sum = 0.0f;
    const float mx = vals[0];
    for (int s = 0; s < k; ++s) {
        vals[s] = __expf(vals[s] - mx);
        sum += vals[s];
    }
    for (int s = 0; s < k; ++s) {
        ids[s] = chosen[s];
        weights[s] = vals[s] / sum;
    }
}

// The k largest logits (ties to the lower index), then softmax over them.
__device__ void select_topk(const float* logits, int num_experts, int k, int32_t* ids, float* weights) {
    int chosen[8];
    float vals[8];
    for (int s = 0; s < k; ++s) {
        int best = -1;
        for (int e = 0; e < num_experts; ++e) {
            bool taken = false;
            for (int q = 0; q < s; ++q) taken |= chosen[q] == e;
            if (!taken && (best < 0 || logits[e] > logits[best])) best = e;
        }
        chosen[s] = best;
        vals[s] = logits[best];
    }
    write_topk(chosen, vals, k, ids, weights);
}

__global__ void router_topk_kernel(const RouterTopkArgs a) {
    __shared__ float logits[kMaxExperts];
    const int t = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const float* h = a.h + static_cast<int64_t>(t) * a.hidden_size;
    const auto* w = static_cast<const __nv_bfloat16*>(a.weight);
    for (int e = warp; e < a.num_experts; e += nwarps) {
        const __nv_bfloat16* row = w + static_cast<int64_t>(e) * a.hidden_size;
        float acc = 0.0f;
        for (int i = lane; i < a.hidden_size; i += 32) acc += h[i] * __bfloat162float(row[i]);
        acc = warp_sum(acc);
        if (lane == 0) logits[e] = acc + a.bias[e];
    }
    __syncthreads();
    if (threadIdx.x == 0)
        select_topk(logits, a.num_experts, a.experts_per_token, a.expert_ids + t * a.experts_per_token,
                    a.expert_weights + t * a.experts_per_token);
}

constexpr int kRouterThreads = 128;
constexpr int kRouterMaxTokens = 8;

__global__ void __launch_bounds__(kRouterThreads)
    router_logits_small_kernel(const float* __restrict__ h, const __nv_bfloat16* __restrict__ w, int T, int H, int E,
                               float* logits) {
    __shared__ float part[kRouterMaxTokens][kRouterThreads / 32];
    const int e = blockIdx.x;
    const uint4* row = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(e) * H);
    float acc[kRouterMaxTokens] = {};
    for (int c = threadIdx.x; c < H / 8; c += blockDim.x) {
        const uint4 u = __ldg(row + c);
        const uint32_t ww[4] = {u.x, u.y, u.z, u.w};
        float wf[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            wf[2 * i] = __uint_as_float(ww[i] << 16);
            wf[2 * i + 1] = __uint_as_float(ww[i] & 0xffff0000u);
        }
#pragma unroll
        for (int t = 0; t < kRouterMaxTokens; ++t) {
            if (t < T) {
                const float4 a = __ldg(reinterpret_cast<const float4*>(h + static_cast<int64_t>(t) * H) + 2 * c);
                const float4 b = __ldg(reinterpret_cast<const float4*>(h + static_cast<int64_t>(t) * H) + 2 * c + 1);
                acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y +
                          wf[6] * b.z + wf[7] * b.w;
            }
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
        if (t < T) {
            const float v = warp_sum(acc[t]);
            if (lane == 0) part[t][warp] = v;
        }
    }
    __syncthreads();
    if (threadIdx.x < T) {
        float sum = 0.0f;
        for (int i = 0; i < kRouterThreads / 32; ++i) sum += part[threadIdx.x][i];
        logits[static_cast<int64_t>(threadIdx.x) * E + e] = sum;
    }
}

// One warp per token: lane j holds logits j, j + 32, ... (the sum of `splits` partial arrays
// [splits, T, E], + bias); k rounds of a warp arg-max
// (ties to the lower index, as select_topk), the winner taken from lane 0 so that every lane
// agrees even with NaNs; then the softmax over the k (descending order, as select_topk).
constexpr int kTopkWarps = 4;
__global__ void __launch_bounds__(32 * kTopkWarps)
    topk_softmax_kernel(const float* __restrict__ logits, const float* __restrict__ bias, int T, int E, int k,
                        int splits, int32_t* ids, float* weights) {
    constexpr int kPer = kMaxExperts / 32;
    constexpr int kNone = 0x7fffffff;
    pdl_wait();  // the logits come from the kernel just before
    pdl_trigger();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * kTopkWarps + (threadIdx.x >> 5);
    if (t >= T) return;
    float v[kPer];
    bool free_[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int e = lane + 32 * i;
        free_[i] = e < E;
        float l = 0.0f;  // the split-K partial sums (router_topk), in a fixed order
        for (int p = 0; p < splits && e < E; ++p) l += logits[(static_cast<int64_t>(p) * T + t) * E + e];
        v[i] = e < E ? l + bias[e] : 0.0f;
    }
    float vals[8];
    int chosen[8];
    for (int s = 0; s < k; ++s) {
        float bv = 0.0f;
        int bi = kNone;
#pragma unroll
        for (int i = 0; i < kPer; ++i)  // ascending index: strict > keeps the lower one on ties
            if (free_[i] && (bi == kNone || v[i] > bv)) bv = v[i], bi = lane + 32 * i;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, off);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, off);
            if (oi != kNone && (bi == kNone || ov > bv || (ov == bv && oi < bi))) bv = ov, bi = oi;
        }
        bv = __shfl_sync(0xffffffffu, bv, 0);
        bi = __shfl_sync(0xffffffffu, bi, 0);
#pragma unroll
        for (int i = 0; i < kPer; ++i)  // unrolled compares keep free_ in registers
            if (bi == lane + 32 * i) free_[i] = false;
        vals[s] = bv;
        chosen[s] = bi;
    }
    if (lane == 0) write_topk(chosen, vals, k, ids + t * k, weights + t * k);
}

// Router logits of many tokens: a CTA computes a tile of 4·TT tokens × 32 experts (a warp TT
// tokens, a lane one expert) over the hidden dimension in 32-wide chunks staged in shared memory
// (weights converted to fp32 once, double-buffered, the next chunk's loads issued before the
// current chunk's math). Sums are fp32 per chunk, then across chunks (two levels: less rounding
// than one running sum over 2,880 terms). With gridDim.z = S > 1 each CTA takes 1/S of the chunks
// and writes partial sums to logits[z] (more CTAs for small batches: the loop is latency-bound).
// logits[z, t, e] = h[t, chunks of z] · W[e, same], no bias (topk adds it and sums the partials).
constexpr int kRouterTileK = 32, kRouterTileE = 32, kRouterTileThreads = 128;
constexpr int kRouterMaxSplits = 8, kRouterMaxSplitTokens = 1024;  // split K only up to this many tokens
constexpr int kRouterMmaSplits = 4;  // the tensor-core kernel's K splits the scratch holds at any batch
template <int TT>
__global__ void __launch_bounds__(kRouterTileThreads)
    router_logits_tiled_kernel(const float* __restrict__ h, const __nv_bfloat16* __restrict__ w, int T, int H, int E,
                               float* __restrict__ logits) {
    constexpr int BT = 4 * TT;
    constexpr int kHLoads = (BT * kRouterTileK / 4 + kRouterTileThreads - 1) / kRouterTileThreads;
    __shared__ __align__(16) float s_w[2][kRouterTileE][kRouterTileK + 4];  // +4: conflict-free float4 rows
    __shared__ __align__(16) float s_h[2][BT][kRouterTileK];                // read as warp-wide broadcasts
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t0 = blockIdx.x * BT, e0 = blockIdx.y * kRouterTileE;
    const int wr = tid >> 2, wq = tid & 3;  // weights: row wr, 8 elements at 8·wq of the chunk
    const bool w_ok = e0 + wr < E;
    const uint4* wsrc = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(w_ok ? e0 + wr : 0) * H) + wq;
    uint4 wv;
    float4 hv[kHLoads];
    auto load = [&](int c) {
        wv = w_ok ? __ldg(wsrc + c * (kRouterTileK / 8)) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int i = 0; i < kHLoads; ++i) {
            const int f = tid + i * kRouterTileThreads, r = f / (kRouterTileK / 4), q = f % (kRouterTileK / 4);
            const bool ok = f < BT * kRouterTileK / 4 && t0 + r < T;
            hv[i] =
                ok ? __ldg(reinterpret_cast<const float4*>(h + static_cast<int64_t>(t0 + r) * H + c * kRouterTileK) + q)
                   : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    auto store = [&](int buf) {
        const uint32_t u[4] = {wv.x, wv.y, wv.z, wv.w};
        float* dst = &s_w[buf][wr][wq * 8];
        *reinterpret_cast<float4*>(dst) = make_float4(__uint_as_float(u[0] << 16), __uint_as_float(u[0] & 0xffff0000u),
                                                      __uint_as_float(u[1] << 16), __uint_as_float(u[1] & 0xffff0000u));
        *reinterpret_cast<float4*>(dst + 4) =
            make_float4(__uint_as_float(u[2] << 16), __uint_as_float(u[2] & 0xffff0000u), __uint_as_float(u[3] << 16),
                        __uint_as_float(u[3] & 0xffff0000u));
#pragma unroll
        for (int i = 0; i < kHLoads; ++i) {
            const int f = tid + i * kRouterTileThreads;
            if (f < BT * kRouterTileK / 4) reinterpret_cast<float4*>(&s_h[buf][0][0])[f] = hv[i];
        }
    };
    float acc[TT] = {};
    const int all = H / kRouterTileK, S = gridDim.z, z = blockIdx.z;
    const int c0 = all * z / S, chunks = all * (z + 1) / S;  // this CTA's chunks [c0, chunks)
    logits += static_cast<int64_t>(z) * T * E;
    load(c0);
    store(0);
    __syncthreads();
    for (int c = c0; c < chunks; ++c) {
        const int buf = (c - c0) & 1;
        if (c + 1 < chunks) load(c + 1);
        float part[TT] = {};
#pragma unroll
        for (int k4 = 0; k4 < kRouterTileK / 4; ++k4) {
            const float4 wf = *reinterpret_cast<const float4*>(&s_w[buf][lane][4 * k4]);
#pragma unroll
            for (int j = 0; j < TT; ++j) {
                const float4 x = *reinterpret_cast<const float4*>(&s_h[buf][warp * TT + j][4 * k4]);
                part[j] = fmaf(x.x, wf.x, part[j]);
                part[j] = fmaf(x.y, wf.y, part[j]);
                part[j] = fmaf(x.z, wf.z, part[j]);
                part[j] = fmaf(x.w, wf.w, part[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < TT; ++j) acc[j] += part[j];
        if (c + 1 < chunks) store(buf ^ 1);  // the other buffer: last read before the previous barrier
        __syncthreads();
    }
    const int e = e0 + lane;
    if (e < E)
#pragma unroll
        for (int j = 0; j < TT; ++j) {
            const int t = t0 + warp * TT + j;
            if (t < T) logits[static_cast<int64_t>(t) * E + e] = acc[j];
        }
}

// The same logits on the tensor cores (RouterTopkArgs::tensor_cores; the default). The fp32 tiled
// kernel above is bound by shared-memory reads (40 LDS.128 per 128 FMAs a thread) and fp32 FMA:
// 20b at 8k tokens ~150 us a layer (r23 profile: router 3.6 ms), 120b several times that. Here h
// (fp32) is split into bf16 hi + lo (h - hi rounded again: |h - hi - lo| <= 2^-17 |h|) and both
// halves multiply the bf16 weights exactly on m16n8k16 MMAs with fp32 accumulation: the split
// leaves at most 2^-17 |h| per element; with the tensor cores' fp32 sums (not round-to-nearest) a
// logit is typically within 2^-20 of sum|h·w| (the test's bound: 2^-16).
// A CTA: 64 tokens (warp w the m16 tile of tokens 16w ..) × all experts (8·kN ≥ E), K in 64-wide
// chunks through a 2-stage cp.async ring: h as [64][72] fp32 (rows padded so a warp's float2
// A-fragment reads take the minimum two wavefronts), W as [8·kN][64] bf16 rows of 128 bytes with
// the 16-byte chunks XOR-swizzled by row (conflict-free ldmatrix for the B fragments). Every h
// element leaves global memory once. K is split over gridDim.z as the tiled kernel's.
// r26, 8k --fp8 prefill (against the previous kernel: 32 tokens a CTA, A fragments straight from
// global memory by each of the 4 warps): router 2.12 -> 1.21 ms on 20b, 5.71 -> 3.46 ms on 120b.
constexpr int kRmTokens = 64, kRmChunk = 64, kRmHStride = 72, kRmThreads = 128;
constexpr int kRmMaxExperts = 128;
// kNorm (RouterTopkArgs::norm_inv_rms): + [2][kRmChunk] fp32 of the norm weight's chunk.
constexpr int rm_smem_bytes(int kN, bool kNorm = false) {
    return 2 * kRmTokens * kRmHStride * 4 + 2 * 8 * kN * 128 + (kNorm ? 2 * kRmChunk * 4 : 0);
}

__device__ __forceinline__ void rm_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// (x, y) -> bf16x2 hi and the bf16x2 of the remainders.
__device__ __forceinline__ void split_bf16x2(float2 v, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 vh = __floats2bfloat162_rn(v.x, v.y);
    const float2 vf = __bfloat1622float2(vh);
    const __nv_bfloat162 vl = __floats2bfloat162_rn(v.x - vf.x, v.y - vf.y);
    hi = *reinterpret_cast<const uint32_t*>(&vh);
    lo = *reinterpret_cast<const uint32_t*>(&vl);
}

// kNorm: h is the residual stream x, normalized here as the norm would ((x · inv_rms) · weight).
template <int kN, bool kNorm>  // n8 tiles, even (an ldmatrix x4 loads two): 8·kN ≥ experts
__global__ void __launch_bounds__(kRmThreads)
    router_logits_mma_kernel(const float* __restrict__ h, const __nv_bfloat16* __restrict__ w, int T, int H, int E,
                             float* __restrict__ logits, const float* __restrict__ inv_rms,
                             const float* __restrict__ norm_weight) {
    static_assert(kN % 2 == 0, "n8 tiles in pairs");
    constexpr int kRowsW = 8 * kN;
    extern __shared__ __align__(16) uint8_t rm_smem[];
    float* s_h = reinterpret_cast<float*>(rm_smem);                  // [2][kRmTokens][kRmHStride]
    uint8_t* s_w = rm_smem + 2 * kRmTokens * kRmHStride * 4;         // [2][kRowsW][128 bytes]
    float* s_nw = reinterpret_cast<float*>(s_w + 2 * kRowsW * 128);  // kNorm: [2][kRmChunk]
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int t0 = blockIdx.x * kRmTokens;
    const int chunks = H / kRmChunk, S = gridDim.z, z = blockIdx.z;
    const int c0 = chunks * z / S, c1 = chunks * (z + 1) / S;  // this CTA's K chunks
    logits += static_cast<int64_t>(z) * T * E;
    // kNorm: this lane's rows' 1 / rms (rows g and g + 8 of the warp's 16; 0 past T: zero rows).
    float inv0 = 0.0f, inv1 = 0.0f;
    if constexpr (kNorm) {
        const int r0 = t0 + warp * 16 + g;
        inv0 = r0 < T ? inv_rms[r0] : 0.0f;
        inv1 = r0 + 8 < T ? inv_rms[r0 + 8] : 0.0f;
    }

    // Chunk c of h (rows past T zero-filled) and of every expert row (rows past E zero-filled).
    const auto load = [&](int c, int stage) {
        const int k0 = c * kRmChunk;
        float* dh = s_h + stage * kRmTokens * kRmHStride;
#pragma unroll
        for (int i = tid; i < kRmTokens * 16; i += kRmThreads) {
            const int r = i >> 4, q = i & 15;
            const bool ok = t0 + r < T;
            cp_async16(dh + r * kRmHStride + q * 4, h + static_cast<int64_t>(ok ? t0 + r : 0) * H + k0 + q * 4, ok);
        }
        uint8_t* dw = s_w + stage * kRowsW * 128;
#pragma unroll
        for (int i = tid; i < kRowsW * 8; i += kRmThreads) {
            const int r = i >> 3, q = i & 7;
            const bool ok = r < E;
            cp_async16(dw + r * 128 + ((q ^ (r & 7)) << 4), w + static_cast<int64_t>(ok ? r : 0) * H + k0 + q * 8, ok);
        }
        if constexpr (kNorm) {
            if (tid < kRmChunk / 4) cp_async16(s_nw + stage * kRmChunk + tid * 4, norm_weight + k0 + tid * 4);
        }
    };

    float acc[kN][4] = {};
    if (c0 < c1) load(c0, 0);
    cp_async_commit();
    for (int c = c0; c < c1; ++c) {
        const int stage = (c - c0) & 1;
        if (c + 1 < c1) load(c + 1, stage ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // chunk c has landed (this thread's copies)
        __syncthreads();     // ... and every thread's
        const float* hh = s_h + stage * kRmTokens * kRmHStride + warp * 16 * kRmHStride;
        const uint32_t wb = smem_addr(s_w + stage * kRowsW * 128);
        // The row element pair at (r, k): as stored, or normalized as residual_rmsnorm's out_f32.
        const auto pair = [&](int r, int k, float inv) {
            float2 v = *reinterpret_cast<const float2*>(hh + r * kRmHStride + k);
            if constexpr (kNorm) {
                const float2 nw = *reinterpret_cast<const float2*>(s_nw + stage * kRmChunk + k);
                v = make_float2(__fmul_rn(__fmul_rn(v.x, inv), nw.x), __fmul_rn(__fmul_rn(v.y, inv), nw.y));
            }
            return v;
        };
#pragma unroll
        for (int ks = 0; ks < kRmChunk / 16; ++ks) {
            const int kk = ks * 16 + 2 * t;
            uint32_t hi[4], lo[4];  // a0..a3: (row g, k), (g + 8, k), (g, k + 8), (g + 8, k + 8)
            split_bf16x2(pair(g, kk, inv0), hi[0], lo[0]);
            split_bf16x2(pair(g + 8, kk, inv1), hi[1], lo[1]);
            split_bf16x2(pair(g, kk + 8, inv0), hi[2], lo[2]);
            split_bf16x2(pair(g + 8, kk + 8, inv1), hi[3], lo[3]);
#pragma unroll
            for (int j = 0; j < kN; j += 2) {
                // Matrices: (tile j, k 0-7), (j, k 8-15), (j + 1, k 0-7), (j + 1, k 8-15) of this step.
                uint32_t b[4];
                const int row = 8 * j + (lane & 7) + ((lane >> 4) << 3);
                const int chunk = 2 * ks + ((lane >> 3) & 1);
                rm_ldmatrix_x4(b, wb + row * 128 + ((chunk ^ (row & 7)) << 4));
                mma_bf16(acc[j], hi[0], hi[1], hi[2], hi[3], b[0], b[1]);
                mma_bf16(acc[j + 1], hi[0], hi[1], hi[2], hi[3], b[2], b[3]);
                mma_bf16(acc[j], lo[0], lo[1], lo[2], lo[3], b[0], b[1]);
                mma_bf16(acc[j + 1], lo[0], lo[1], lo[2], lo[3], b[2], b[3]);
            }
        }
        __syncthreads();  // the stage is refilled next iteration
    }
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
        for (int e2 = 0; e2 < 4; ++e2) {
            const int tok = t0 + warp * 16 + g + 8 * (e2 >> 1), ex = 8 * j + 2 * t + (e2 & 1);
            if (tok < T && ex < E) logits[static_cast<int64_t>(tok) * E + ex] = acc[j][e2];
        }
}

template <int kN, bool kNorm>
void launch_router_logits_mma(dim3 grid, const RouterTopkArgs& a, cudaStream_t stream) {
    constexpr int smem = rm_smem_bytes(kN, kNorm);
    fit_dynamic_smem(router_logits_mma_kernel<kN, kNorm>, smem);
    router_logits_mma_kernel<kN, kNorm>
        <<<grid, kRmThreads, smem, stream>>>(a.h, static_cast<const __nv_bfloat16*>(a.weight), a.num_tokens,
                                             a.hidden_size, a.num_experts, a.logits, a.norm_inv_rms, a.norm_weight);
}
template <int kN>
void launch_router_logits_mma(dim3 grid, const RouterTopkArgs& a, cudaStream_t stream) {
    if (a.norm_inv_rms != nullptr)
        launch_router_logits_mma<kN, true>(grid, a, stream);
    else
        launch_router_logits_mma<kN, false>(grid, a, stream);
}

// ---- fused decode router: logits -> top-k -> softmax -> plan, one launch -----------------------
constexpr int kRouterMaxChunks = 4;  // 16-byte weight chunks per thread: hidden_size <= 128·8·4 = 4096
constexpr int kRouterMaxK = 8;

// The router's end (router_plan_small_kernel's last CTA): every logit is readable through `load(t, e)`; a
// warp per token takes the top-k by k rounds of a warp arg-max over (value descending, index
// ascending), a strict total order, so every lane ends with the same winner and ties go to the lower
// index as in cpu::router; softmax over the chosen k; then the stable plan of
// moe_plan (offsets[e] = #assignments with a lower expert; an assignment's place = its expert's
// offset + #earlier assignments of the same expert; ≤ 64 assignments). Every thread of the CTA calls
// it; `warps` = the CTA's warps, kChunks · 32 ≥ the experts.
template <int kChunks, typename Load>
__device__ __forceinline__ void router_finish(const RouterPlanSmallArgs& a, int warps, Load load, int32_t* s_ids) {
    const int T = a.num_tokens, E = a.num_experts, K = a.experts_per_token;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int t = warp; t < T; t += warps) {
        float v[kChunks];
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            const int ex = lane + 32 * j;
            v[j] = ex < E ? load(t, ex) : 0.0f;
        }
        float top_v[kRouterMaxK];
        int top_e[kRouterMaxK];
        warp_topk(v, E, K, top_v, top_e);  // moe_common.cuh
        if (lane == 0) {
            float w[kRouterMaxK];
            float sum = 0.0f;
#pragma unroll
            for (int s = 0; s < kRouterMaxK; ++s) {
                w[s] = s < K ? expf(top_v[s] - top_v[0]) : 0.0f;
                sum += w[s];
            }
#pragma unroll
            for (int s = 0; s < kRouterMaxK; ++s) {
                if (s < K) {
                    a.expert_ids[t * K + s] = top_e[s];
                    a.expert_weights[t * K + s] = w[s] / sum;
                    s_ids[t * K + s] = top_e[s];
                }
            }
        }
    }
    __syncthreads();
    // The stable plan of moe_plan: offsets[e] = #assignments with a lower expert; an assignment's
    // place = its expert's offset + #earlier assignments of the same expert (≤ 64 assignments).
    const int A = T * K;
    for (int i = threadIdx.x; i <= E; i += blockDim.x) {
        int c = 0;
        for (int j = 0; j < A; ++j) c += s_ids[j] < i;
        a.expert_offsets[i] = c;
    }
    for (int i = threadIdx.x; i < A; i += blockDim.x) {
        const int ei = s_ids[i];
        int start = 0, rank = 0;
        for (int j = 0; j < A; ++j) {
            start += s_ids[j] < ei;
            rank += j < i && s_ids[j] == ei;
        }
        a.sorted_assignments[start + rank] = i;
    }
}

// The fused norm's outputs for token t's chunk c (elements 8c .. 8c + 7): the updated residual v,
// the normalized row hn in fp32 and, if asked, in bf16. Both router kernels write them so.
__device__ __forceinline__ void router_store_norm_chunk(const RouterPlanSmallArgs& a, int t, int c, const float (&v)[8],
                                                        const float (&hn)[8]) {
    const int64_t H = a.hidden_size;
    float4* ro = reinterpret_cast<float4*>(a.residual_out + t * H) + 2 * c;
    float4* ho = reinterpret_cast<float4*>(a.h_out + t * H) + 2 * c;
    ro[0] = make_float4(v[0], v[1], v[2], v[3]);
    ro[1] = make_float4(v[4], v[5], v[6], v[7]);
    ho[0] = make_float4(hn[0], hn[1], hn[2], hn[3]);
    ho[1] = make_float4(hn[4], hn[5], hn[6], hn[7]);
    if (a.h_bf16_out != nullptr) {
        uint32_t packed[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const __nv_bfloat162 b2 = __floats2bfloat162_rn(hn[2 * j], hn[2 * j + 1]);
            packed[j] = *reinterpret_cast<const uint32_t*>(&b2);
        }
        *(reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.h_bf16_out) + t * H) + c) =
            make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
}

__global__ void __launch_bounds__(kRouterThreads)
    router_plan_small_kernel(const __grid_constant__ RouterPlanSmallArgs a) {
    __shared__ float part[kRouterMaxTokens][kRouterThreads / 32];
    __shared__ float part_ss[kRouterMaxTokens][kRouterThreads / 32];
    __shared__ float s_inv[kRouterMaxTokens];
    __shared__ int32_t s_ids[kRouterMaxTokens * kRouterMaxK];
    __shared__ bool s_last;
    const int e = blockIdx.x;
    const int T = a.num_tokens, H = a.hidden_size, E = a.num_experts;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = H / 8;
    const bool fused = a.residual != nullptr;  // the residual update + RMSNorm fused in

    // Phase 1 (every CTA): row e of the logits for all tokens. All of the thread's weight loads go
    // out before any math (the row is 5.6 KB: one round trip per CTA), and before pdl_wait: the
    // weights do not change.
    const uint4* row =
        reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.weight) + static_cast<int64_t>(e) * H);
    uint4 wv[kRouterMaxChunks];
#pragma unroll
    for (int i = 0; i < kRouterMaxChunks; ++i) {
        const int c = threadIdx.x + kRouterThreads * i;
        wv[i] = c < chunks ? __ldg(row + c) : make_uint4(0u, 0u, 0u, 0u);
    }
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    // Eight elements 8c .. 8c + 7 of token t's input row: h, or (fused) v = residual + add + bias
    // times the norm weight, with Σ v² into ss (the 1 / rms is applied to the sum below).
    auto load8 = [&](const float* p, int t, int c, float(&v)[8]) {
        const float4* q = reinterpret_cast<const float4*>(p + static_cast<int64_t>(t) * H) + 2 * c;
        const float4 x0 = __ldg(q), x1 = __ldg(q + 1);
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    };
    auto residual8 = [&](int t, int c, float(&v)[8]) {  // v = residual + add (+ add_bias)
        float r[8], d[8], b[8] = {};
        load8(a.residual, t, c, r);
        load8(a.add, t, c, d);
        if (a.add_bias != nullptr) load8(a.add_bias, 0, c, b);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = r[j] + (b[j] + d[j]);  // residual_rmsnorm's order: x + (bias + add)
    };
    // A token's loads for all of the thread's chunks are issued together (chunk indices clamped,
    // no branch between them; the token-independent ones once): one L2 round trip a token. (Before
    // r28 each chunk's loads sat in that chunk's and token's branch: ~3 round trips a token.) The
    // sums are the same expressions in the same chunk order.
    float acc[kRouterMaxTokens] = {}, ss[kRouterMaxTokens] = {};
    int cc[kRouterMaxChunks];
    bool cv[kRouterMaxChunks];
    float wf[kRouterMaxChunks][8], nw[kRouterMaxChunks][8], bb[kRouterMaxChunks][8];
#pragma unroll
    for (int i = 0; i < kRouterMaxChunks; ++i) {
        const int c = threadIdx.x + kRouterThreads * i;
        cv[i] = c < chunks;
        cc[i] = min(c, chunks - 1);
        const uint32_t ww[4] = {wv[i].x, wv[i].y, wv[i].z, wv[i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            wf[i][2 * j] = __uint_as_float(ww[j] << 16);
            wf[i][2 * j + 1] = __uint_as_float(ww[j] & 0xffff0000u);
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) nw[i][j] = bb[i][j] = 0.0f;
        if (fused) {
            load8(a.norm_weight, 0, cc[i], nw[i]);
            if (a.add_bias != nullptr) load8(a.add_bias, 0, cc[i], bb[i]);
        }
    }
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
        if (t < T) {
            float x[kRouterMaxChunks][8];
            if (fused) {
                float r[kRouterMaxChunks][8], d[kRouterMaxChunks][8];
#pragma unroll
                for (int i = 0; i < kRouterMaxChunks; ++i) {
                    load8(a.residual, t, cc[i], r[i]);
                    load8(a.add, t, cc[i], d[i]);
                }
#pragma unroll
                for (int i = 0; i < kRouterMaxChunks; ++i) {
#pragma unroll
                    for (int j = 0; j < 8; ++j) {
                        x[i][j] = r[i][j] + (bb[i][j] + d[i][j]);  // residual_rmsnorm's order: x + (bias + add)
                        if (cv[i]) ss[t] += x[i][j] * x[i][j];
                        x[i][j] *= nw[i][j];
                    }
                }
            } else {
#pragma unroll
                for (int i = 0; i < kRouterMaxChunks; ++i) load8(a.h, t, cc[i], x[i]);
            }
#pragma unroll
            for (int i = 0; i < kRouterMaxChunks; ++i)
                if (cv[i])
                    acc[t] += wf[i][0] * x[i][0] + wf[i][1] * x[i][1] + wf[i][2] * x[i][2] + wf[i][3] * x[i][3] +
                              wf[i][4] * x[i][4] + wf[i][5] * x[i][5] + wf[i][6] * x[i][6] + wf[i][7] * x[i][7];
        }
    }
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
        if (t < T) {  // T is uniform: every lane takes part in the shuffle
            const float v = warp_sum(acc[t]);
            const float q = fused ? warp_sum(ss[t]) : 0.0f;
            if (lane == 0) {
                part[t][warp] = v;
                part_ss[t][warp] = q;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < T) {
        float sum = 0.0f, sq = 0.0f;
#pragma unroll
        for (int i = 0; i < kRouterThreads / 32; ++i) {
            sum += part[threadIdx.x][i];
            sq += part_ss[threadIdx.x][i];
        }
        if (fused) {  // Σ w · (v · nw) · inv = the logit of the normalized row
            const float inv = rsqrtf(sq / static_cast<float>(H) + a.eps);
            s_inv[threadIdx.x] = inv;
            sum *= inv;
        }
        a.logits[static_cast<int64_t>(threadIdx.x) * E + e] = sum + a.bias[e];
    }
    __syncthreads();
    // The ticket right after the logits (session 17): thread 0's fence is cumulative over the
    // logits the barrier ordered before it, so one round trip covers them (r31 fenced each logit,
    // then again after the fused writes below: two round trips before the ticket). The fused writes
    // are not covered and need not be: only the next kernels read them, after this grid completes.
    if (threadIdx.x == 0) {
        __threadfence();
        const bool last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
        if (last) __threadfence();  // acquire for the whole CTA: ordered before the barrier below
        s_last = last;
    }
    if (fused) {
        // The updated residual and the normalized rows (the MoE's input), written once: CTA e takes
        // chunks [e·chunks/E, (e+1)·chunks/E) of every token, recomputed from the same loads in the
        // same order as above (every CTA has every token's 1 / rms).
        const int c0 = static_cast<int>(static_cast<int64_t>(e) * chunks / E);
        const int c1 = static_cast<int>(static_cast<int64_t>(e + 1) * chunks / E);
        for (int c = c0 + static_cast<int>(threadIdx.x); c < c1; c += kRouterThreads) {
            float nw[8];
            load8(a.norm_weight, 0, c, nw);
            for (int t = 0; t < T; ++t) {
                float v[8];
                residual8(t, c, v);
                float hn[8];
#pragma unroll
                for (int j = 0; j < 8; ++j) hn[j] = v[j] * s_inv[t] * nw[j];
                router_store_norm_chunk(a, t, c, v, hn);
            }
        }
    }
    __syncthreads();      // s_last
    if (!s_last) return;  // CTA-uniform

    // Phase 2 (the last CTA only): every row is in memory; top-k, softmax and plan (router_finish).
    __threadfence();
    router_finish<kMaxExperts / 32>(
        a, kRouterThreads / 32,
        [&](int t, int ex) { return __ldcg(a.logits + static_cast<int64_t>(t) * E + ex); },  // L2: other CTAs'
        s_ids);
    if (threadIdx.x == 0) *a.counter = 0u;  // every other CTA has taken its ticket: reset for the next call
}

// ---- the same router in one thread-block cluster (session 22) ----------------------------------
// router_plan_small_kernel ends in a ticket: every CTA fences its logit and takes a global counter,
// and the last one fences again and reads every logit back from L2 (r36's trace: the kernel adds
// 9.4 µs to a decode step where a kernel boundary is ~4). Here one cluster of up to 8 CTAs does
// the same work: CTA r stages experts [r·kEpc, (r+1)·kEpc)'s rows in shared memory by cp.async
// before pdl_wait (no registers held, so that the CTA fits beside the O GEMV's; r37's trace still
// has cluster launches starting only 0.7-2.3 µs before the previous kernel ends, against ~4 for
// plain ones), computes their logits for every token (each CTA sums every token's Σ v² itself, as
// every CTA did before), and stores them into CTA 0's shared memory (DSMEM); one cluster barrier
// orders them, and CTA 0 runs router_finish on its copy. No global atomics or fences. r37: the
// router adds 5.8 µs to a 20b step instead of 9.4. Two ways of removing this launch were correct and slower: its
// work in the O GEMV's last CTA by a ticket (r52), and its logits from precomputed rows (the router times the norm's
// gain, and that times O) in extra CTAs of the O GEMV with the MoE kernels routing the token themselves (r54,
// bench/results/2026-12-04_h200_r54/s39b-router-fold.patch: 20b batch 1 1.395 -> 1.48 ms a step): the routing's
// chain moved into gate_up's start, and gate_up's CTAs lost their residency behind this kernel's few CTAs.
// Thread i of a CTA takes chunks i, i + kRcThreads, ... (kCpt of them) of 8 elements of the row.
constexpr int kRcThreads = 384;
constexpr int kRcWarps = kRcThreads / 32;
constexpr int kRcMaxCtas = 16;      // a non-portable cluster size (RouterPlanSmallArgs::cluster_ctas)
constexpr int kRcPortableCtas = 8;  // the default

template <int kEpc, int kCpt, int kMaxCtas = kRcPortableCtas>
__global__ void __launch_bounds__(kRcThreads)
    router_plan_cluster_kernel(const __grid_constant__ RouterPlanSmallArgs a) {
    extern __shared__ uint4 s_w[];  // [kEpc][kCpt · kRcThreads]: the CTA's rows, 16-byte chunks
    __shared__ float part[kRouterMaxTokens][kRcWarps][kEpc + 1];  // per warp: kEpc dot products, Σ v²
    __shared__ float s_inv[kRouterMaxTokens];
    __shared__ float s_logits[kRouterMaxTokens * kMaxCtas * kEpc];  // CTA 0's is the cluster's
    __shared__ int32_t s_ids[kRouterMaxTokens * kRouterMaxK];
    const uint32_t rank = cooperative_groups::this_cluster().block_rank();
    // Every CTA of the cluster has started before any stores into CTA 0's shared memory: this
    // arrival, and the wait just before those stores (long satisfied by then).
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
    const int T = a.num_tokens, H = a.hidden_size, E = a.num_experts;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int chunks = H / 8;
    const bool fused = a.residual != nullptr;
    const int e0 = static_cast<int>(rank) * kEpc;
    constexpr int kRow = kCpt * kRcThreads;

    // Before the wait: the CTA's expert rows (each thread the chunks it reads back itself: no CTA
    // barrier), and the norm weight and bias (weights, constant).
    const auto* w = static_cast<const __nv_bfloat16*>(a.weight);
    int cc[kCpt];
    bool cv[kCpt];
    float nw[kCpt][8], bb[kCpt][8];
    auto load8 = [&](const float* p, int t, int c, float(&v)[8]) {
        const float4* q = reinterpret_cast<const float4*>(p + static_cast<int64_t>(t) * H) + 2 * c;
        const float4 x0 = __ldg(q), x1 = __ldg(q + 1);
        v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
    };
#pragma unroll
    for (int i = 0; i < kCpt; ++i) {
        const int c = threadIdx.x + kRcThreads * i;
        cv[i] = c < chunks;
        cc[i] = min(c, chunks - 1);
#pragma unroll
        for (int e = 0; e < kEpc; ++e) {
            uint4* dst = s_w + e * kRow + c;
            if (cv[i] && e0 + e < E) {
                const uint4* src = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(e0 + e) * H) + c;
                const uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
            } else {
                *dst = make_uint4(0u, 0u, 0u, 0u);
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) nw[i][j] = bb[i][j] = 0.0f;
        if (fused) {
            load8(a.norm_weight, 0, cc[i], nw[i]);
            if (a.add_bias != nullptr) load8(a.add_bias, 0, cc[i], bb[i]);
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight

    for (int t = 0; t < T; ++t) {
        float x[kCpt][8];
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < kCpt; ++i) {
            if (fused) {
                float r[8], d[8];
                load8(a.residual, t, cc[i], r);
                load8(a.add, t, cc[i], d);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    x[i][j] = r[j] + (bb[i][j] + d[j]);  // residual_rmsnorm's order: x + (bias + add)
                    if (cv[i]) ss += x[i][j] * x[i][j];
                    x[i][j] *= nw[i][j];
                }
            } else {
                load8(a.h, t, cc[i], x[i]);
            }
        }
        if (t == 0) asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // this thread's chunks of s_w
        float acc[kEpc];
#pragma unroll
        for (int e = 0; e < kEpc; ++e) {
            acc[e] = 0.0f;
#pragma unroll
            for (int i = 0; i < kCpt; ++i) {
                const uint4 wq = s_w[e * kRow + threadIdx.x + kRcThreads * i];
                const uint32_t ww[4] = {wq.x, wq.y, wq.z, wq.w};
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    s += __uint_as_float(ww[j] << 16) * x[i][2 * j] +
                         __uint_as_float(ww[j] & 0xffff0000u) * x[i][2 * j + 1];
                if (cv[i]) acc[e] += s;
            }
        }
#pragma unroll
        for (int e = 0; e < kEpc; ++e) acc[e] = warp_sum(acc[e]);
        if (fused) ss = warp_sum(ss);
        if (lane == 0) {
#pragma unroll
            for (int e = 0; e < kEpc; ++e) part[t][warp][e] = acc[e];
            part[t][warp][kEpc] = ss;
        }
    }
    __syncthreads();
    // Thread (t, e): the logit of token t and expert e0 + e, into CTA 0's s_logits (and the global
    // scratch, as router_plan_small_kernel writes it). Each sums the Σ v² of its token itself.
    float* s_logits0 = cooperative_groups::this_cluster().map_shared_rank(s_logits, 0);
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");  // the entry arrivals: CTA 0 runs
    if (threadIdx.x < T * kEpc) {
        const int t = threadIdx.x / kEpc, e = threadIdx.x % kEpc;
        float sum = 0.0f, sq = 0.0f;
#pragma unroll
        for (int i = 0; i < kRcWarps; ++i) {
            sum += part[t][i][e];
            sq += part[t][i][kEpc];
        }
        if (fused) {
            const float inv = rsqrtf(sq / static_cast<float>(H) + a.eps);
            if (e == 0) s_inv[t] = inv;
            sum *= inv;
        }
        if (e0 + e < E) {
            const float logit = sum + a.bias[e0 + e];
            a.logits[static_cast<int64_t>(t) * E + e0 + e] = logit;
            s_logits0[t * E + e0 + e] = logit;
        }
    }
    __syncthreads();  // s_inv
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    if (fused) {
        // The updated residual and the normalized rows: CTA r writes chunks [r·chunks/n, (r+1)·chunks/n)
        // of every token, recomputed from the same loads in the same order (L1 hits).
        const int n = static_cast<int>(gridDim.x);
        const int c0 = static_cast<int>(static_cast<int64_t>(rank) * chunks / n);
        const int c1 = static_cast<int>(static_cast<int64_t>(rank + 1) * chunks / n);
        for (int c = c0 + static_cast<int>(threadIdx.x); c < c1; c += kRcThreads) {
            float nw8[8], b8[8] = {};
            load8(a.norm_weight, 0, c, nw8);
            if (a.add_bias != nullptr) load8(a.add_bias, 0, c, b8);
            for (int t = 0; t < T; ++t) {
                float r[8], d[8], v[8], hn[8];
                load8(a.residual, t, c, r);
                load8(a.add, t, c, d);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    v[j] = r[j] + (b8[j] + d[j]);
                    hn[j] = v[j] * s_inv[t] * nw8[j];
                }
                router_store_norm_chunk(a, t, c, v, hn);
            }
        }
    }
    // Every CTA waits: CTA 0's shared memory must outlive the others' stores into it, and the
    // acquire makes them visible to CTA 0.
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (rank != 0) return;
    router_finish<(kEpc * kMaxCtas + 31) / 32>(
        a, kRcWarps, [&](int t, int ex) { return s_logits[t * E + ex]; }, s_ids);
}

// ---- routing plan -----------------------------------------------------------------------------
// A stable counting sort of the assignments by expert, by kC CTAs of kPlanWarps warps (one thread-
// block cluster; kC = 1 for small batches). Global warp w takes the assignments [w·chunk,
// (w + 1)·chunk) in order, 32 at a time; the lanes holding the same expert find each other by one
// ballot per bit of the expert index (no atomics). Pass 1 counts per (warp, expert) in shared
// memory; each CTA sums its warps, the CTAs exchange their sums through distributed shared memory,
// and a scan gives each (warp, expert) its first slot; pass 2 scatters each assignment to its slot
// plus its rank among the lower lanes with its expert. Inside an expert the order is the assignment
// order (deterministic at any size). r40 trace, 8k prompt (32,768 assignments): the kernel it
// replaced (shared-memory atomics on E counters in one CTA; the stable order only by an O(n²) scan)
// took 25.6 µs a layer on 20b, 34.7 on 120b; this form in one CTA 44.2 / 50.8 (4 schedulers issue
// every ballot: hence the cluster).
constexpr int kPlanWarps = 32;
constexpr int kPlanMaxExperts = kMaxExperts + 1;  // an EP plan's extra bucket (other ranks' experts)
constexpr int kPlanUnroll = 4;                    // 32-assignment groups a warp loads ahead
constexpr int kPlanCluster = 8;                   // CTAs (portable cluster size) from kPlanClusterMin on
constexpr int kPlanClusterMin = 4096;

// The lanes whose expert equals this lane's (e < 2^bits; every lane of the warp takes part).
__device__ __forceinline__ unsigned plan_peers(int e, int bits) {
    unsigned peers = 0xffffffffu;
    for (int b = 0; b < bits; ++b) {
        const bool one = (e >> b) & 1;
        const unsigned m = __ballot_sync(0xffffffffu, one);
        peers &= one ? m : ~m;
    }
    return peers;
}

// Calls f(i, e, peers) for each of the warp's assignment groups, in order: i this lane's assignment
// index, e its expert (num_experts past the warp's range: a bucket nobody counts).
template <typename F>
__device__ __forceinline__ void plan_warp_groups(const int32_t* __restrict__ ids, int beg, int end, int num_experts,
                                                 int bits, F&& f) {
    const int lane = threadIdx.x & 31;
    for (int i0 = beg; i0 < end; i0 += 32 * kPlanUnroll) {
        int e[kPlanUnroll];
#pragma unroll
        for (int u = 0; u < kPlanUnroll; ++u) {
            const int i = i0 + 32 * u + lane;
            e[u] = i < end ? __ldg(ids + i) : num_experts;
        }
#pragma unroll
        for (int u = 0; u < kPlanUnroll; ++u) {
            if (i0 + 32 * u >= end) break;  // warp-uniform
            f(i0 + 32 * u + lane, e[u], plan_peers(e[u], bits));
            __syncwarp();
        }
    }
}

template <int kC>
__global__ void __launch_bounds__(kPlanWarps * 32)
    moe_plan_kernel(const int32_t* __restrict__ ids, int n, int num_experts, int32_t* __restrict__ offsets,
                    int32_t* __restrict__ sorted) {
    __shared__ int hist[kPlanWarps * kPlanMaxExperts];               // [warp][expert]: counts, then first slots
    __shared__ int ctot[kPlanMaxExperts];                            // this CTA's counts (read by the cluster)
    __shared__ int total[kPlanMaxExperts], before[kPlanMaxExperts];  // all CTAs' / earlier CTAs' counts
    __shared__ int starts[kPlanMaxExperts + 1];
    pdl_wait();  // the ids come from the router just before
    pdl_trigger();
    const int E = num_experts, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rank = kC > 1 ? static_cast<int>(cooperative_groups::this_cluster().block_rank()) : 0;
    const int bits = 32 - __clz(E);  // E itself (the bucket past a warp's range) needs these bits
    const int chunk = ((n + kC * kPlanWarps - 1) / (kC * kPlanWarps) + 31) & ~31;
    const int beg = min(n, (rank * kPlanWarps + warp) * chunk), end = min(n, beg + chunk);
    int* h = hist + warp * E;
    for (int e = lane; e < E; e += 32) h[e] = 0;
    __syncwarp();
    plan_warp_groups(ids, beg, end, E, bits, [&](int, int e, unsigned peers) {
        if (e < E && lane == __ffs(peers) - 1) h[e] += __popc(peers);  // one leader an expert
    });
    __syncthreads();
    // Per expert: the warps' exclusive prefix (in place) and the CTA's count.
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int w = 0; w < kPlanWarps; ++w) {
            const int c = hist[w * E + e];
            hist[w * E + e] = run;
            run += c;
        }
        ctot[e] = run;
    }
    if constexpr (kC > 1) {  // every CTA's counts written (and every CTA started) before any is read
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
        asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            int all = 0, earlier = 0;
#pragma unroll
            for (int r = 0; r < kC; ++r) {
                const int v = cluster.map_shared_rank(ctot, r)[e];
                all += v;
                earlier += r < rank ? v : 0;
            }
            total[e] = all;
            before[e] = earlier;
        }
        // The remote reads are done: the wait before the exit keeps this CTA's counts alive for the others.
        asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    } else {
        __syncthreads();
        for (int e = threadIdx.x; e < E; e += blockDim.x) {
            total[e] = ctot[e];
            before[e] = 0;
        }
    }
    __syncthreads();
    if (warp == 0) {  // exclusive scan of the totals: lane j sums experts [j·per, (j + 1)·per)
        const int per = (E + 31) / 32;
        int local = 0;
        for (int j = 0; j < per; ++j)
            if (lane * per + j < E) local += total[lane * per + j];
        int incl = local;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += v;
        }
        int run = incl - local;
        for (int j = 0; j < per; ++j)
            if (lane * per + j < E) {
                starts[lane * per + j] = run;
                run += total[lane * per + j];
            }
        if (lane == 31) starts[E] = incl;
    }
    __syncthreads();
    if (rank == 0)
        for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = starts[e];
    for (int e = lane; e < E; e += 32) h[e] += starts[e] + before[e];
    __syncwarp();
    plan_warp_groups(ids, beg, end, E, bits, [&](int i, int e, unsigned peers) {
        const int base = e < E ? h[e] : 0;
        __syncwarp();  // every peer has read the base before its leader moves it
        if (e < E) {
            sorted[base + __popc(peers & ((1u << lane) - 1u))] = i;
            if (lane == __ffs(peers) - 1) h[e] = base + __popc(peers);
        }
    });
    if constexpr (kC > 1) asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// ---- weight-only MXFP4 experts ------------------------------------------------------------------
// One CTA per (expert, slice of output rows); the expert's tokens are processed kTok at a time with
// their inputs staged in shared memory as fp32, so each weight byte is read from memory once per
// kTok tokens. Within a row, 4 lanes share a 32-element group (one 32-bit word = 8 codes each), and
// a lane loads all of its words of the row before using any, to keep enough bytes in flight.
constexpr int kTok = 4;
constexpr int kWarps = 8;
constexpr int kMaxWordsPerLane = 16;  // rows of up to 32·4·16 = 4096 inputs

template <int kRows>
__device__ __forceinline__ void mxfp4_rows_dot(const uint8_t* const* blocks, const uint8_t* const* scales, int groups,
                                               const float* xs, int x_stride, int nt, float (&acc)[kRows][kTok]) {
    const int lane = threadIdx.x & 31;
    const int words = groups * 4;
    uint32_t w[kRows][kMaxWordsPerLane];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const uint32_t* b = reinterpret_cast<const uint32_t*>(blocks[r]);
#pragma unroll
        for (int i = 0; i < kMaxWordsPerLane; ++i) {
            const int word = lane + 32 * i;
            w[r][i] = word < words ? __ldg(b + word) : 0u;
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTok; ++t) acc[r][t] = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxWordsPerLane; ++i) {
        const int word = lane + 32 * i;
        if (word >= words) break;
        const int g = word >> 2, q = word & 3;
        const int col = 32 * g + 8 * q;  // first input of this word: byte 4q+b holds elements 8q+2b, 8q+2b+1
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const float s = e8m0_to_f32(__ldg(scales[r] + g));
            float v[8];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const uint32_t byte = (w[r][i] >> (8 * b)) & 0xffu;
                v[2 * b] = e2m1_value(byte & 15u) * s;
                v[2 * b + 1] = e2m1_value(byte >> 4) * s;
            }
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
                if (t < nt) {
                    const float4 x0 = *reinterpret_cast<const float4*>(xs + t * x_stride + col);
                    const float4 x1 = *reinterpret_cast<const float4*>(xs + t * x_stride + col + 4);
                    acc[r][t] += v[0] * x0.x + v[1] * x0.y + v[2] * x0.z + v[3] * x0.w + v[4] * x1.x + v[5] * x1.y +
                                 v[6] * x1.z + v[7] * x1.w;
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int t = 0; t < kTok; ++t)
            if (t < nt) acc[r][t] = warp_sum(acc[r][t]);  // nt is warp-uniform
}

// 32 row pairs (gate_up) or rows (down) per CTA, 4 per warp: one pair per warp was measured slower
// (r3: 5.1 vs 3.6 ms per decode step) because every CTA stages the token's 11.5 KB input.
constexpr int kPairsPerCta = 32;
constexpr int kDownRowsPerCta = 32;

__global__ void __launch_bounds__(kWarps * 32) moe_gate_up_mxfp4_kernel(const MoeMxfp4Args a) {
    extern __shared__ float xs[];  // [kTok, hidden_size]
    const int e = blockIdx.x;
    const int begin = a.expert_offsets[e], end = a.expert_offsets[e + 1];
    if (begin == end) return;
    const int H = a.hidden_size, I = a.intermediate_size, G = H / 32, K = a.experts_per_token;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const auto* h = static_cast<const __nv_bfloat16*>(a.h);
    for (int tb = begin; tb < end; tb += kTok) {
        const int nt = min(kTok, end - tb);
        __syncthreads();
        for (int t = 0; t < nt; ++t) {
            const int64_t base = static_cast<int64_t>(a.sorted_assignments[tb + t] / K) * H;
            if (a.h_f32) {
                const float4* src = reinterpret_cast<const float4*>(a.h_f32 + base);
                for (int c = threadIdx.x; c < H / 4; c += blockDim.x) reinterpret_cast<float4*>(xs + t * H)[c] = src[c];
            } else {
                for (int c = threadIdx.x; c < H; c += blockDim.x) xs[t * H + c] = __bfloat162float(h[base + c]);
            }
        }
        __syncthreads();
        for (int p = warp; p < kPairsPerCta; p += kWarps) {
            const int j = blockIdx.y * kPairsPerCta + p;
            if (j >= I) break;
            const int64_t row0 = static_cast<int64_t>(e) * 2 * I + 2 * j;  // gate row; up is row0 + 1
            const uint8_t* blocks[2] = {a.gate_up_blocks + row0 * G * 16, a.gate_up_blocks + (row0 + 1) * G * 16};
            const uint8_t* scales[2] = {a.gate_up_scales + row0 * G, a.gate_up_scales + (row0 + 1) * G};
            float acc[2][kTok];
            mxfp4_rows_dot<2>(blocks, scales, G, xs, H, nt, acc);
            if (lane < nt) {
                float gate = 0.0f, up = 0.0f;
#pragma unroll
                for (int t = 0; t < kTok; ++t)
                    if (t == lane) {
                        gate = acc[0][t];
                        up = acc[1][t];
                    }
                gate = fminf(gate + a.gate_up_bias[row0], a.swiglu_limit);
                up = fminf(fmaxf(up + a.gate_up_bias[row0 + 1], -a.swiglu_limit), a.swiglu_limit);
                const float glu = gate / (1.0f + __expf(-a.swiglu_alpha * gate));
                const int as = a.sorted_assignments[tb + lane];
                a.act[static_cast<int64_t>(as) * I + j] = (up + 1.0f) * glu;
            }
        }
    }
}

__global__ void __launch_bounds__(kWarps * 32) moe_down_mxfp4_kernel(const MoeMxfp4Args a) {
    extern __shared__ float xs[];  // [kTok, intermediate_size]
    const int e = blockIdx.x;
    const int begin = a.expert_offsets[e], end = a.expert_offsets[e + 1];
    if (begin == end) return;
    const int H = a.hidden_size, I = a.intermediate_size, G = I / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int tb = begin; tb < end; tb += kTok) {
        const int nt = min(kTok, end - tb);
        __syncthreads();
        for (int t = 0; t < nt; ++t) {
            const float4* src =
                reinterpret_cast<const float4*>(a.act + static_cast<int64_t>(a.sorted_assignments[tb + t]) * I);
            for (int c = threadIdx.x; c < I / 4; c += blockDim.x) reinterpret_cast<float4*>(xs + t * I)[c] = src[c];
        }
        __syncthreads();
        for (int p = warp; p < kDownRowsPerCta; p += kWarps) {
            const int r = blockIdx.y * kDownRowsPerCta + p;
            if (r >= H) break;
            const int64_t row = static_cast<int64_t>(e) * H + r;
            const uint8_t* blocks[1] = {a.down_blocks + row * G * 16};
            const uint8_t* scales[1] = {a.down_scales + row * G};
            float acc[1][kTok];
            mxfp4_rows_dot<1>(blocks, scales, G, xs, I, nt, acc);
            if (lane < nt) {
                float v = 0.0f;
#pragma unroll
                for (int t = 0; t < kTok; ++t)
                    if (t == lane) v = acc[0][t];
                const int as = a.sorted_assignments[tb + lane];
                a.y[static_cast<int64_t>(as) * H + r] = v + a.down_bias[row];
            }
        }
    }
}

// ---- weight-only MXFP4 experts, v2 (default) --------------------------------------------------
// Work: the rows of the experts that have tokens, concatenated in expert order and cut into steps of
// 4 rows (2 gate/up pairs, or 4 down rows). A persistent grid (blocks per SM × SMs) splits the steps
// evenly, so the grid does not depend on which experts were chosen (graph-capturable) and every SM
// gets the same bytes whatever the routing. A CTA walks its range expert segment by segment; its
// 8 warps take the steps of a tile round-robin, and each expert's tokens go kT at a time through
// shared memory, so weights are read once per kT tokens (re-reads of a tile stay in L2).
//
// Per step a lane loads its groups g = lane, lane+32, lane+64 of the 4 rows: one uint4 (32 codes)
// plus the scale byte per group, 12 × 16 B in flight per lane before any math. Codes decode two at a
// time into a half2 (e2m1 bits placed in fp16 so that the half is value·2^-14 exactly: magnitude at
// bits 9..11, sign at 15; subnormal half = the e2m1 subnormal), then to fp32; group partial sums
// Σ v·x are scaled once per group, and the 2^14 is restored at the end (exact power-of-2 scaling).
// Inputs are staged as fp32 with each 32-element group padded to 36 floats, so the float4 reads of
// 8 consecutive lanes (consecutive groups) land in distinct banks.
constexpr int kV2Warps = 8;
constexpr int kV2Rows = 4;                  // rows per warp step
constexpr int kV2GroupsPerLane = 3;         // inputs ≤ 32·32·3 = 3072 per row on this path
constexpr int kV2GroupStride = 36;          // floats per staged group (32 + 4 padding)
constexpr int kV2TileSteps = 4 * kV2Warps;  // steps per tile: 128 rows, ~196 KB of weights

__device__ __forceinline__ uint4 ld_weights(const uint8_t* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t word_of(const uint4& v, int q) {
    return q == 0 ? v.x : q == 1 ? v.y : q == 2 ? v.z : v.w;  // q is a compile-time constant
}

// 8 codes of one 32-bit word (element k in nibble k) -> e2m1(k) · 2^-14 as fp32, in element order.
__device__ __forceinline__ void decode8(uint32_t w, float (&v)[8]) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        // After << 4j the top nibble of the low half is element 3-j, of the high half element 7-j.
        const uint32_t s = w << (4 * j);
        const uint32_t bits = (s & 0x80008000u) | ((s & 0x70007000u) >> 3);
        __half2 h;
        memcpy(&h, &bits, 4);
        const float2 f = __half22float2(h);
        v[3 - j] = f.x;
        v[7 - j] = f.y;
    }
}

struct V2Weights {
    uint4 w[kV2Rows][kV2GroupsPerLane];
    uint32_t s[kV2Rows][kV2GroupsPerLane];
};

// Rows row0..row0+3 (consecutive) of a [rows, G, 16] / [rows, G] tensor pair.
__device__ __forceinline__ void v2_load(V2Weights& wt, const uint8_t* blocks, const uint8_t* scales, int64_t row0,
                                        int G) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < kV2Rows; ++r) {
        const uint8_t* b = blocks + (row0 + r) * G * 16;
        const uint8_t* sc = scales + (row0 + r) * G;
#pragma unroll
        for (int i = 0; i < kV2GroupsPerLane; ++i) {
            const int g = lane + 32 * i;
            if (g < G) {
                wt.w[r][i] = ld_weights(b + g * 16);
                wt.s[r][i] = __ldg(sc + g);
            } else {
                wt.w[r][i] = make_uint4(0u, 0u, 0u, 0u);
                wt.s[r][i] = 127u;
            }
        }
    }
}

// acc[r][t] = Σ_c W[row0 + r, c] · x_t[c] over the whole row, summed over the warp (every lane
// gets the totals). xs: NT staged inputs, xs_stride floats apart.
template <int NT>
__device__ __forceinline__ void v2_dot(const V2Weights& wt, const float* xs, int xs_stride, int G,
                                       float (&acc)[kV2Rows][NT]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < kV2Rows; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = 0.0f;
#pragma unroll
    for (int i = 0; i < kV2GroupsPerLane; ++i) {
        const int g = lane + 32 * i;
        if (g < G) {
            float part[kV2Rows][NT];
#pragma unroll
            for (int r = 0; r < kV2Rows; ++r)
#pragma unroll
                for (int t = 0; t < NT; ++t) part[r][t] = 0.0f;
            const float* xg = xs + g * kV2GroupStride;
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                float x[NT][8];
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const float4 x0 = *reinterpret_cast<const float4*>(xg + t * xs_stride + 8 * q);
                    const float4 x1 = *reinterpret_cast<const float4*>(xg + t * xs_stride + 8 * q + 4);
                    x[t][0] = x0.x;
                    x[t][1] = x0.y;
                    x[t][2] = x0.z;
                    x[t][3] = x0.w;
                    x[t][4] = x1.x;
                    x[t][5] = x1.y;
                    x[t][6] = x1.z;
                    x[t][7] = x1.w;
                }
#pragma unroll
                for (int r = 0; r < kV2Rows; ++r) {
                    float v[8];
                    decode8(word_of(wt.w[r][i], q), v);
#pragma unroll
                    for (int t = 0; t < NT; ++t)
#pragma unroll
                        for (int k = 0; k < 8; ++k) part[r][t] = fmaf(v[k], x[t][k], part[r][t]);
                }
            }
#pragma unroll
            for (int r = 0; r < kV2Rows; ++r) {
                const float s = e8m0_to_f32(wt.s[r][i]);
#pragma unroll
                for (int t = 0; t < NT; ++t) acc[r][t] = fmaf(part[r][t], s, acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < kV2Rows; ++r)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[r][t] = warp_sum(acc[r][t]) * 16384.0f;  // undo the 2^-14
}

// The steps [st, end) of this warp (every kV2Warps-th from its first), the first step's weights
// already in wt. `local` converts a step index to the step inside the expert.
template <bool kGateUp, int NT>
__device__ __forceinline__ void v2_run_steps(const MoeMxfp4Args& a, V2Weights& wt, int st, int end, int step_base,
                                             int e, const float* xs, int xs_stride, const int* s_as) {
    const int lane = threadIdx.x & 31;
    const int H = a.hidden_size, I = a.intermediate_size;
    const int G = (kGateUp ? H : I) / 32;
    const int rows = kGateUp ? 2 * I : H;
    const uint8_t* blocks = kGateUp ? a.gate_up_blocks : a.down_blocks;
    const uint8_t* scales = kGateUp ? a.gate_up_scales : a.down_scales;
    while (st < end) {
        float acc[kV2Rows][NT];
        v2_dot<NT>(wt, xs, xs_stride, G, acc);
        const int r0 = kV2Rows * (st - step_base);  // first row of the step inside the expert
        const int64_t grow0 = static_cast<int64_t>(e) * rows + r0;
        if (kGateUp) {
            // acc rows: gate p0, up p0, gate p1, up p1. Lane 2t + p writes pair p of token t.
            if (lane < 2 * NT) {
                const int t = lane >> 1, p = lane & 1;
                float gate = 0.0f, up = 0.0f;
#pragma unroll
                for (int tt = 0; tt < NT; ++tt)
#pragma unroll
                    for (int pp = 0; pp < 2; ++pp)
                        if (tt == t && pp == p) {
                            gate = acc[2 * pp][tt];
                            up = acc[2 * pp + 1][tt];
                        }
                gate = fminf(gate + a.gate_up_bias[grow0 + 2 * p], a.swiglu_limit);
                up = fminf(fmaxf(up + a.gate_up_bias[grow0 + 2 * p + 1], -a.swiglu_limit), a.swiglu_limit);
                const float glu = gate / (1.0f + __expf(-a.swiglu_alpha * gate));
                a.act[static_cast<int64_t>(s_as[t]) * I + r0 / 2 + p] = (up + 1.0f) * glu;
            }
        } else {
            // Lane 4t + r writes row r of token t.
            if (lane < kV2Rows * NT) {
                const int t = lane >> 2, r = lane & 3;
                float v = 0.0f;
#pragma unroll
                for (int tt = 0; tt < NT; ++tt)
#pragma unroll
                    for (int rr = 0; rr < kV2Rows; ++rr)
                        if (tt == t && rr == r) v = acc[rr][tt];
                a.y[static_cast<int64_t>(s_as[t]) * H + r0 + r] = v + a.down_bias[grow0 + r];
            }
        }
        st += kV2Warps;
        if (st < end) v2_load(wt, blocks, scales, static_cast<int64_t>(e) * rows + kV2Rows * (st - step_base), G);
    }
}

// kT: most tokens per pass (1, 2 or 4); 2 CTAs per SM for kT ≤ 2 (≤ 128 registers), 1 for kT = 4.
template <bool kGateUp, int kT>
__global__ void __launch_bounds__(kV2Warps * 32, kT <= 2 ? 2 : 1) moe_mxfp4_v2_kernel(const MoeMxfp4Args a) {
    pdl_wait();
    pdl_trigger();  // after the wait: at most this kernel and the next one in flight
    extern __shared__ float4 v2_smem[];
    float* xs = reinterpret_cast<float*>(v2_smem);  // [kT][G · kV2GroupStride]
    __shared__ int s_expert[kMaxExperts];
    __shared__ int s_tok0[kMaxExperts], s_tok1[kMaxExperts];
    __shared__ int s_nactive;
    __shared__ int s_as[kT];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int H = a.hidden_size, I = a.intermediate_size, E = a.num_experts, K = a.experts_per_token;
    const int in_dim = kGateUp ? H : I, G = in_dim / 32;
    const int rows = kGateUp ? 2 * I : H;
    const int steps_per_expert = rows / kV2Rows;
    const int xs_stride = G * kV2GroupStride;
    const uint8_t* blocks = kGateUp ? a.gate_up_blocks : a.down_blocks;
    const uint8_t* scales = kGateUp ? a.gate_up_scales : a.down_scales;

    // Experts with tokens, in expert order (the same list in every CTA).
    if (warp == 0) {
        int lo[kMaxExperts / 32], hi[kMaxExperts / 32];
#pragma unroll
        for (int c = 0; c < kMaxExperts / 32; ++c) {
            const int e = 32 * c + lane;
            lo[c] = e < E ? a.expert_offsets[e] : 0;
            hi[c] = e < E ? a.expert_offsets[e + 1] : 0;
        }
        int n = 0;
#pragma unroll
        for (int c = 0; c < kMaxExperts / 32; ++c) {
            const bool active = hi[c] > lo[c];
            const unsigned m = __ballot_sync(0xffffffffu, active);
            if (active) {
                const int at = n + __popc(m & ((1u << lane) - 1u));
                s_expert[at] = 32 * c + lane;
                s_tok0[at] = lo[c];
                s_tok1[at] = hi[c];
            }
            n += __popc(m);
        }
        if (lane == 0) s_nactive = n;
    }
    __syncthreads();
    const int total = s_nactive * steps_per_expert;
    const int s_begin = static_cast<int>(static_cast<int64_t>(blockIdx.x) * total / gridDim.x);
    const int s_end = static_cast<int>(static_cast<int64_t>(blockIdx.x + 1) * total / gridDim.x);

    int staged_slot = -1, staged_tb = -1;
    for (int s = s_begin; s < s_end;) {
        const int slot = s / steps_per_expert;
        const int step_base = slot * steps_per_expert;
        const int seg_end = min(s_end, step_base + steps_per_expert);
        const int e = s_expert[slot], tok0 = s_tok0[slot], tok1 = s_tok1[slot];
        for (int tile = s; tile < seg_end; tile += kV2TileSteps) {
            const int tile_end = min(seg_end, tile + kV2TileSteps);
            for (int tb = tok0; tb < tok1; tb += kT) {
                const int nt = min(kT, tok1 - tb);
                // This warp's first step: its loads go out before the staging below.
                const int st = tile + warp;
                V2Weights wt;
                if (st < tile_end)
                    v2_load(wt, blocks, scales, static_cast<int64_t>(e) * rows + kV2Rows * (st - step_base), G);
                if (staged_slot != slot || staged_tb != tb) {  // CTA-uniform
                    __syncthreads();                           // everyone is done with the previous inputs
                    for (int t = 0; t < nt; ++t) {
                        const int as = a.sorted_assignments[tb + t];
                        if (threadIdx.x == 0) s_as[t] = as;
                        float* dst = xs + t * xs_stride;
                        const int n4 = in_dim / 4;
                        if (!kGateUp || a.h_f32) {
                            const float* src = kGateUp ? a.h_f32 + static_cast<int64_t>(as / K) * H
                                                       : a.act + static_cast<int64_t>(as) * I;
                            for (int c = threadIdx.x; c < n4; c += blockDim.x) {
                                const float4 v = reinterpret_cast<const float4*>(src)[c];
                                *reinterpret_cast<float4*>(dst + (c >> 3) * kV2GroupStride + 4 * (c & 7)) = v;
                            }
                        } else {
                            const uint2* src = reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(a.h) +
                                                                              static_cast<int64_t>(as / K) * H);
                            for (int c = threadIdx.x; c < n4; c += blockDim.x) {
                                const uint2 u = src[c];
                                const float4 v =
                                    make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                                                __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
                                *reinterpret_cast<float4*>(dst + (c >> 3) * kV2GroupStride + 4 * (c & 7)) = v;
                            }
                        }
                    }
                    __syncthreads();
                    staged_slot = slot;
                    staged_tb = tb;
                }
                if (kT == 1 || nt == 1) {
                    v2_run_steps<kGateUp, 1>(a, wt, st, tile_end, step_base, e, xs, xs_stride, s_as);
                } else if (kT == 2 || nt == 2) {
                    v2_run_steps<kGateUp, (kT >= 2 ? 2 : 1)>(a, wt, st, tile_end, step_base, e, xs, xs_stride, s_as);
                } else if (nt == 3) {
                    v2_run_steps<kGateUp, (kT >= 3 ? 3 : 1)>(a, wt, st, tile_end, step_base, e, xs, xs_stride, s_as);
                } else {
                    v2_run_steps<kGateUp, kT>(a, wt, st, tile_end, step_base, e, xs, xs_stride, s_as);
                }
            }
        }
        s = seg_end;
    }
}

// ---- large-batch helpers ------------------------------------------------------------------------
__device__ __forceinline__ int expert_of(const int32_t* offsets, int num_experts, int i) {
    int lo = 0, hi = num_experts - 1;  // largest e with offsets[e] <= i
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (offsets[mid] <= i)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

__global__ void gather_kernel(const __nv_bfloat16* h, const int32_t* sorted, int k, int H, __nv_bfloat16* xg) {
    const int i = blockIdx.x;
    const __nv_bfloat16* src = h + static_cast<int64_t>(sorted[i] / k) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x) xg[static_cast<int64_t>(i) * H + c] = src[c];
}

__global__ void swiglu_sorted_kernel(const float* gu, const float* bias, const int32_t* offsets, int num_experts, int I,
                                     float limit, float alpha, __nv_bfloat16* act) {
    const int i = blockIdx.x;
    const int e = expert_of(offsets, num_experts, i);
    const float* row = gu + static_cast<int64_t>(i) * 2 * I;
    const float* b = bias + static_cast<int64_t>(e) * 2 * I;
    for (int j = threadIdx.x; j < I; j += blockDim.x) {
        const float gate = fminf(row[2 * j] + b[2 * j], limit);
        const float up = fminf(fmaxf(row[2 * j + 1] + b[2 * j + 1], -limit), limit);
        const float glu = gate / (1.0f + __expf(-alpha * gate));
        act[static_cast<int64_t>(i) * I + j] = __float2bfloat16((up + 1.0f) * glu);
    }
}

__global__ void scatter_kernel(const float* yd, const float* bias, const int32_t* offsets, int num_experts,
                               const int32_t* sorted, int H, float* y) {
    const int i = blockIdx.x;
    const int e = expert_of(offsets, num_experts, i);
    float* dst = y + static_cast<int64_t>(sorted[i]) * H;
    for (int c = threadIdx.x; c < H; c += blockDim.x)
        dst[c] = yd[static_cast<int64_t>(i) * H + c] + bias[static_cast<int64_t>(e) * H + c];
}

__global__ void mxfp4_to_bf16_kernel(const uint8_t* blocks, const uint8_t* scales, int64_t n_bytes,
                                     __nv_bfloat16* out) {
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_bytes;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
        const uint32_t byte = blocks[i];
        const float s = e8m0_to_f32(scales[i / 16]);  // 16 bytes per 32-element group
        out[2 * i] = __float2bfloat16(e2m1_value(byte & 15u) * s);
        out[2 * i + 1] = __float2bfloat16(e2m1_value(byte >> 4) * s);
    }
}

}  // namespace

void router_topk(const RouterTopkArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.num_experts <= kMaxExperts && a.experts_per_token >= 1 && a.experts_per_token <= 8 &&
                     a.experts_per_token <= a.num_experts,
                 "router: %d experts, k %d unsupported", a.num_experts, a.experts_per_token);
    ENGINE_CHECK(a.norm_inv_rms == nullptr || (a.norm_weight != nullptr && a.logits != nullptr &&
                                               router_topk_normalizes(a.num_experts, a.hidden_size, a.tensor_cores)),
                 "router: the normalizing input needs the tensor-core logits (%d experts, hidden %d)", a.num_experts,
                 a.hidden_size);
    if (a.num_tokens == 0) return;
    if (a.logits == nullptr || a.hidden_size % kRouterTileK != 0) {  // one CTA per token (odd widths)
        router_topk_kernel<<<a.num_tokens, 256, 0, stream>>>(a);
        CUDA_CHECK_LAUNCH();
        return;
    }
    const int T = a.num_tokens, E = a.num_experts, H = a.hidden_size;
    const auto* w = static_cast<const __nv_bfloat16*>(a.weight);
    if (a.tensor_cores && E <= kRmMaxExperts && H % kRmChunk == 0) {
        const int splits = router_topk_splits(T, E, H, true);
        const dim3 grid((T + kRmTokens - 1) / kRmTokens, 1, splits);
        if (E <= 32)
            launch_router_logits_mma<4>(grid, a, stream);
        else if (E <= 64)
            launch_router_logits_mma<8>(grid, a, stream);
        else
            launch_router_logits_mma<16>(grid, a, stream);
        CUDA_CHECK_LAUNCH();
        launch_pdl(topk_softmax_kernel, (T + kTopkWarps - 1) / kTopkWarps, 32 * kTopkWarps, 0, stream, a.logits, a.bias,
                   T, E, a.experts_per_token, splits, a.expert_ids, a.expert_weights);
        CUDA_CHECK_LAUNCH();
        return;
    }
    // Tokens per warp: more CTAs for small batches (the weights are re-read per token tile from
    // L2), fewer shared-memory reads per multiply for large ones; then split K until ~4 CTAs an SM.
    const int etiles = (E + kRouterTileE - 1) / kRouterTileE;
    const int tt = T >= 2048 ? 4 : T >= 512 ? 2 : 1;
    const int ttiles = (T + 4 * tt - 1) / (4 * tt);
    const int splits = router_topk_splits(T, E, H);
    const dim3 grid(ttiles, etiles, splits);
    if (tt == 4)
        router_logits_tiled_kernel<4><<<grid, kRouterTileThreads, 0, stream>>>(a.h, w, T, H, E, a.logits);
    else if (tt == 2)
        router_logits_tiled_kernel<2><<<grid, kRouterTileThreads, 0, stream>>>(a.h, w, T, H, E, a.logits);
    else
        router_logits_tiled_kernel<1><<<grid, kRouterTileThreads, 0, stream>>>(a.h, w, T, H, E, a.logits);
    CUDA_CHECK_LAUNCH();
    launch_pdl(topk_softmax_kernel, (T + kTopkWarps - 1) / kTopkWarps, 32 * kTopkWarps, 0, stream, a.logits, a.bias, T,
               E, a.experts_per_token, splits, a.expert_ids, a.expert_weights);
    CUDA_CHECK_LAUNCH();
}

bool router_topk_normalizes(int num_experts, int hidden_size, bool tensor_cores) {
    return tensor_cores && num_experts <= kRmMaxExperts && hidden_size % kRmChunk == 0 &&
           hidden_size % kRouterTileK == 0;
}

int router_topk_splits(int num_tokens, int num_experts, int hidden_size, bool tensor_cores) {
    if (hidden_size % kRouterTileK != 0) return 1;
    if (tensor_cores && num_experts <= kRmMaxExperts && hidden_size % kRmChunk == 0) {
        // 64 tokens × all experts a CTA: split K until ~4 CTAs an SM, each split ≥ 4 chunks of 64,
        // as far as the scratch holds the partials (router_topk_scratch: at least kRouterMmaSplits
        // partials of every token).
        const int ctas = (num_tokens + kRmTokens - 1) / kRmTokens;
        const int fit = std::max(kRouterMmaSplits, kRouterMaxSplitTokens * kRouterMaxSplits / std::max(num_tokens, 1));
        return std::clamp((528 + ctas - 1) / ctas, 1,
                          std::max(1, std::min({kRouterMaxSplits, hidden_size / kRmChunk / 4, fit})));
    }
    if (num_tokens > kRouterMaxSplitTokens) return 1;
    const int tt = num_tokens >= 512 ? 2 : 1;
    const int ctas = (num_tokens + 4 * tt - 1) / (4 * tt) * ((num_experts + kRouterTileE - 1) / kRouterTileE);
    return std::clamp((528 + ctas - 1) / ctas, 1, std::max(1, std::min(kRouterMaxSplits, hidden_size / kRouterTileK)));
}

int64_t router_topk_scratch(int num_tokens, int num_experts) {
    return static_cast<int64_t>(std::max(kRouterMmaSplits * num_tokens, kRouterMaxSplitTokens * kRouterMaxSplits)) *
           num_experts;
}

void router_logits_small(const float* h, const void* weight, int T, int H, int E, float* logits, cudaStream_t stream) {
    ENGINE_CHECK(T >= 1 && T <= kRouterMaxTokens && H % 8 == 0, "router_logits_small: %d tokens, hidden %d", T, H);
    router_logits_small_kernel<<<E, kRouterThreads, 0, stream>>>(h, static_cast<const __nv_bfloat16*>(weight), T, H, E,
                                                                 logits);
    CUDA_CHECK_LAUNCH();
}

void topk_softmax(const float* logits, const float* bias, int T, int E, int k, int32_t* ids, float* weights,
                  cudaStream_t stream) {
    ENGINE_CHECK(E <= kMaxExperts && k >= 1 && k <= 8 && k <= E, "topk: %d experts, k %d unsupported", E, k);
    if (T == 0) return;
    launch_pdl(topk_softmax_kernel, (T + kTopkWarps - 1) / kTopkWarps, 32 * kTopkWarps, 0, stream, logits, bias, T, E,
               k, 1, ids, weights);
    CUDA_CHECK_LAUNCH();
}

// GPTOSS_ROUTER_CLUSTER: 0 the ticket kernel (router_plan_small_kernel) for every size, for A/B
// runs; 8 clusters of at most 8 CTAs (the portable size); unset or 16: clusters of up to 16 CTAs
// where the device schedules them (r38 call 1, 120b batch 1: 2.477 / 2.486 → 2.406 / 2.389 ms a
// step; 20b's 32 experts take 8 CTAs of 4 either way).
static int router_cluster_env() {
    static const int v = [] {
        const char* e = std::getenv("GPTOSS_ROUTER_CLUSTER");
        if (e == nullptr) return 16;
        return std::strcmp(e, "0") == 0 ? 0 : std::strcmp(e, "8") == 0 ? 8 : 16;
    }();
    return v;
}
// Whether the device schedules a 16-CTA cluster of the 8-experts-a-CTA kernel (with the shared
// memory of hidden 6,144), asked once (the process's GPUs are one kind); the non-portable attribute
// is set per device (it is per device) on every kernel that may launch so.
static bool router_cluster16_ok() {
    constexpr int kMaxDev = 64;
    static std::atomic<bool> attr_done[kMaxDev];
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    if (dev >= kMaxDev) return false;
    if (!attr_done[dev].load(std::memory_order_acquire)) {
        for (auto kernel : {router_plan_cluster_kernel<4, 1, kRcMaxCtas>, router_plan_cluster_kernel<4, 2, kRcMaxCtas>,
                            router_plan_cluster_kernel<8, 1, kRcMaxCtas>, router_plan_cluster_kernel<8, 2, kRcMaxCtas>})
            CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
        attr_done[dev].store(true, std::memory_order_release);
    }
    static const bool ok = [] {
        auto kernel = router_plan_cluster_kernel<8, 2, kRcMaxCtas>;
        const size_t smem = static_cast<size_t>(8) * 2 * kRcThreads * sizeof(uint4);
        fit_dynamic_smem(kernel, smem);
        return max_active_clusters(kernel, dim3(kRcMaxCtas), dim3(kRcThreads), smem) > 0;
    }();
    return ok;
}

void router_plan_small(const RouterPlanSmallArgs& a, cudaStream_t stream) {
    ENGINE_CHECK(a.num_tokens >= 1 && a.num_tokens <= kRouterMaxTokens && a.hidden_size % 8 == 0 &&
                     a.hidden_size >= 8 && a.hidden_size / 8 <= kRouterThreads * kRouterMaxChunks &&
                     a.num_experts <= kMaxExperts && a.experts_per_token >= 1 && a.experts_per_token <= kRouterMaxK &&
                     a.experts_per_token <= a.num_experts && a.counter != nullptr,
                 "router_plan_small: %d tokens, hidden %d, %d experts, k %d unsupported", a.num_tokens, a.hidden_size,
                 a.num_experts, a.experts_per_token);
    // Fused norm: other CTAs read residual and add while the outputs are written, so no output may
    // alias them.
    auto aliases = [&](const void* p) { return p != nullptr && (p == a.residual || p == a.add); };
    ENGINE_CHECK(a.residual == nullptr ||
                     (a.add != nullptr && a.norm_weight != nullptr && a.h_out != nullptr && a.residual_out != nullptr &&
                      !aliases(a.residual_out) && !aliases(a.h_out) && !aliases(a.h_bf16_out)),
                 "router_plan_small: the fused norm needs add, norm_weight, h_out and outputs apart from its inputs");
    const int chunks = a.hidden_size / 8;
    const int env = router_cluster_env();
    // 16 CTAs of at most 8 experts: up to 128 experts (more take the 8-CTA sizing, so the ticket kernel).
    const bool wide = (a.cluster_ctas == 16 || (a.cluster_ctas == 0 && env == 16)) && a.num_experts <= kRcMaxCtas * 8 &&
                      router_cluster16_ok();
    const int max_ctas = wide ? kRcMaxCtas : kRcPortableCtas;
    const int epc = (a.num_experts + max_ctas - 1) / max_ctas;
    if (env != 0 && epc <= 16 && chunks <= 2 * kRcThreads) {
        // 4, 8 or 16 experts a CTA (up to 8 CTAs, or 16 where wide), hidden ≤ 6,144: rows of
        // 24-192 KB in shared memory. Larger sizes take the ticket kernel.
        const int kepc = epc <= 4 ? 4 : epc <= 8 ? 8 : 16;
        const int ctas = (a.num_experts + kepc - 1) / kepc;
        const int cpt = chunks <= kRcThreads ? 1 : 2;
        // The kernels sized for 16 CTAs (logits array, top-k) only where more than 8 run; the others
        // are the ones r37 measured.
        auto kernel = ctas > kRcPortableCtas ? (kepc == 8 ? (cpt == 1 ? router_plan_cluster_kernel<8, 1, kRcMaxCtas>
                                                                      : router_plan_cluster_kernel<8, 2, kRcMaxCtas>)
                                                          : (cpt == 1 ? router_plan_cluster_kernel<4, 1, kRcMaxCtas>
                                                                      : router_plan_cluster_kernel<4, 2, kRcMaxCtas>))
                      : kepc == 16 ? (cpt == 1 ? router_plan_cluster_kernel<16, 1> : router_plan_cluster_kernel<16, 2>)
                      : kepc == 8  ? (cpt == 1 ? router_plan_cluster_kernel<8, 1> : router_plan_cluster_kernel<8, 2>)
                                   : (cpt == 1 ? router_plan_cluster_kernel<4, 1> : router_plan_cluster_kernel<4, 2>);
        const size_t smem = static_cast<size_t>(kepc) * cpt * kRcThreads * sizeof(uint4);
        fit_dynamic_smem(kernel, smem);
        launch_pdl_cluster(kernel, dim3(ctas), dim3(ctas), dim3(kRcThreads), smem, stream, a);
        CUDA_CHECK_LAUNCH();
        return;
    }
    launch_pdl(router_plan_small_kernel, a.num_experts, kRouterThreads, 0, stream, a);
    CUDA_CHECK_LAUNCH();
}

void moe_plan(const int32_t* ids, int n, int num_experts, int32_t* offsets, int32_t* sorted, cudaStream_t stream) {
    ENGINE_CHECK(num_experts >= 1 && num_experts <= kPlanMaxExperts && n >= 0, "moe_plan: %d experts, %d assignments",
                 num_experts, n);
    if (n >= kPlanClusterMin)
        launch_pdl_cluster(moe_plan_kernel<kPlanCluster>, dim3(kPlanCluster), dim3(kPlanCluster), dim3(kPlanWarps * 32),
                           0, stream, ids, n, num_experts, offsets, sorted);
    else
        launch_pdl(moe_plan_kernel<1>, 1, kPlanWarps * 32, 0, stream, ids, n, num_experts, offsets, sorted);
    CUDA_CHECK_LAUNCH();
}

namespace {

// The v2 kernels are the default; the first design stays as the fallback for sizes v2 does not take
// (rows wider than 3072 inputs) and for comparison (kMoeMxfp4Legacy).
constexpr bool kMoeMxfp4Legacy = false;

void moe_mxfp4_legacy(const MoeMxfp4Args& a, cudaStream_t stream) {
    const int smem_gu = kTok * a.hidden_size * static_cast<int>(sizeof(float));
    const int smem_down = kTok * a.intermediate_size * static_cast<int>(sizeof(float));
    // Shared-memory opt-in beyond 48 KB: a per-device attribute (each GPU of a parallel layout).
    CUDA_CHECK(
        cudaFuncSetAttribute(moe_gate_up_mxfp4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTok * 4096 * 4));
    CUDA_CHECK(
        cudaFuncSetAttribute(moe_down_mxfp4_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kTok * 4096 * 4));
    dim3 grid_gu(a.num_experts, (a.intermediate_size + kPairsPerCta - 1) / kPairsPerCta);
    moe_gate_up_mxfp4_kernel<<<grid_gu, kWarps * 32, smem_gu, stream>>>(a);
    CUDA_CHECK_LAUNCH();
    dim3 grid_down(a.num_experts, (a.hidden_size + kDownRowsPerCta - 1) / kDownRowsPerCta);
    moe_down_mxfp4_kernel<<<grid_down, kWarps * 32, smem_down, stream>>>(a);
    CUDA_CHECK_LAUNCH();
}

constexpr int kV2MaxSmem = 4 * 32 * kV2GroupsPerLane * kV2GroupStride * static_cast<int>(sizeof(float));

// Resident CTAs per SM × SMs, measured once per kernel (host-only queries: capturable).
template <bool kGateUp, int kT>
int v2_grid_size() {
    // Per device: the shared-memory opt-in is a per-device attribute, and ranks of a parallel
    // layout call this from their own threads.
    constexpr int kDevices = 64;
    static std::atomic<int> cached[kDevices];
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    if (device < kDevices) {
        const int b = cached[device].load(std::memory_order_acquire);
        if (b != 0) return b;
    }
    auto kernel = moe_mxfp4_v2_kernel<kGateUp, kT>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kV2MaxSmem));
    int sms = 0, per_sm = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kV2Warps * 32, kV2MaxSmem));
    const int blocks = std::max(1, per_sm) * sms;
    if (device < kDevices) cached[device].store(blocks, std::memory_order_release);
    return blocks;
}

template <bool kGateUp, int kT>
void v2_launch(const MoeMxfp4Args& a, cudaStream_t stream) {
    const int in_dim = kGateUp ? a.hidden_size : a.intermediate_size;
    const int rows = kGateUp ? 2 * a.intermediate_size : a.hidden_size;
    const int smem = kT * (in_dim / 32) * kV2GroupStride * static_cast<int>(sizeof(float));
    // At most min(E, assignments) experts have tokens: no more CTAs than steps.
    const int64_t max_steps =
        static_cast<int64_t>(std::min(a.num_experts, a.num_tokens * a.experts_per_token)) * (rows / kV2Rows);
    const int grid = static_cast<int>(std::min<int64_t>(v2_grid_size<kGateUp, kT>(), max_steps));
    launch_pdl(moe_mxfp4_v2_kernel<kGateUp, kT>, grid, kV2Warps * 32, smem, stream, a);
}

template <int kT>
void moe_mxfp4_v2(const MoeMxfp4Args& a, cudaStream_t stream) {
    v2_launch<true, kT>(a, stream);
    v2_launch<false, kT>(a, stream);
}

}  // namespace

void moe_mxfp4(const MoeMxfp4Args& a, cudaStream_t stream) {
    ENGINE_CHECK(a.hidden_size % 32 == 0 && a.intermediate_size % 32 == 0 && a.hidden_size <= 4096 &&
                     a.intermediate_size <= 4096 && a.num_experts <= kMaxExperts,
                 "moe_mxfp4: unsupported sizes %d/%d/%d", a.hidden_size, a.intermediate_size, a.num_experts);
    if (a.num_tokens == 0) return;
    static const int decode_default = [] {
        const char* v = std::getenv("GPTOSS_MOE_DECODE");
        return v == nullptr ? 1 : std::atoi(v);
    }();
    const int decode_kernel = a.kernel >= 0 ? a.kernel : decode_default;
    if (decode_kernel == 4 && moe_decode_wg_supported(a)) {
        moe_decode_wg(a, stream);
        return;
    }
    if (decode_kernel == 1 && moe_decode_mma_supported(a)) {
        moe_decode_mma(a, stream);
        return;
    }
    const int v2_max = 32 * 32 * kV2GroupsPerLane;
    if (kMoeMxfp4Legacy || a.hidden_size > v2_max || a.intermediate_size > v2_max) {
        moe_mxfp4_legacy(a, stream);
    } else if (a.num_tokens == 1) {
        // An expert has at most num_tokens tokens (a token picks an expert once): the narrowest kT
        // that takes them in one pass, up to 4.
        moe_mxfp4_v2<1>(a, stream);
    } else if (a.num_tokens == 2) {
        moe_mxfp4_v2<2>(a, stream);
    } else {
        moe_mxfp4_v2<4>(a, stream);
    }
    // The fp32 kernels have no in-kernel residual tail.
    if (a.tail.x != nullptr) moe_residual_tail(a.tail, a.y, a.hidden_size, a.experts_per_token, stream);
}

void moe_gather(const void* h, const int32_t* sorted, int n, int k, int H, void* xg, cudaStream_t stream) {
    if (n == 0) return;
    gather_kernel<<<n, 256, 0, stream>>>(static_cast<const __nv_bfloat16*>(h), sorted, k, H,
                                         static_cast<__nv_bfloat16*>(xg));
    CUDA_CHECK_LAUNCH();
}

void moe_swiglu_sorted(const float* gu, const float* bias, const int32_t* offsets, int num_experts, int n, int I,
                       float limit, float alpha, void* act, cudaStream_t stream) {
    if (n == 0) return;
    swiglu_sorted_kernel<<<n, 256, 0, stream>>>(gu, bias, offsets, num_experts, I, limit, alpha,
                                                static_cast<__nv_bfloat16*>(act));
    CUDA_CHECK_LAUNCH();
}

void moe_scatter(const float* yd, const float* bias, const int32_t* offsets, int num_experts, const int32_t* sorted,
                 int n, int H, float* y, cudaStream_t stream) {
    if (n == 0) return;
    scatter_kernel<<<n, 256, 0, stream>>>(yd, bias, offsets, num_experts, sorted, H, y);
    CUDA_CHECK_LAUNCH();
}

void mxfp4_to_bf16(const uint8_t* blocks, const uint8_t* scales, int64_t rows, int cols, void* out,
                   cudaStream_t stream) {
    const int64_t n_bytes = rows * cols / 2;
    const int grid = static_cast<int>(std::min<int64_t>((n_bytes + 255) / 256, 65536));
    mxfp4_to_bf16_kernel<<<grid, 256, 0, stream>>>(blocks, scales, n_bytes, static_cast<__nv_bfloat16*>(out));
    CUDA_CHECK_LAUNCH();
}

}  // namespace gptoss::kernels::cuda
