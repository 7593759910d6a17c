// Device helpers shared by the grouped MoE kernels (moe_mma.cu, moe_wgmma.cu) and the decode GEMVs
// (gemv.cu): shared-memory addresses and cp.async, bf16x2 multiplies, the MMAs, e4m3 -> f16, and
// the clamped SwiGLU (the e2m1 bit tricks:
// kernels/mxfp4_bits.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mxfp4_bits.h"

namespace gptoss::kernels::cuda {

// 16 bytes from global memory that are read once (weights): through the non-coherent path, not
// kept in L1, so the activations there stay.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
// The same, or 16 zero bytes when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// D += A · B on the tensor cores, m16n8k16, bf16 inputs, fp32 accumulation. Lane (g, t) = (lane / 4,
// lane % 4) holds A rows g, g + 8 at k (2t, 2t + 1) in a0, a1 and at (2t + 8, 2t + 9) in a2, a3; B
// column g at k (2t, 2t + 1) in b0 and (2t + 8, 2t + 9) in b1; D rows g, g + 8 × columns 2t, 2t + 1.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// e4m3 bytes (value · 2^-6) of the low nibbles (codes 0, 2, 4, 6) and of the high nibbles (1, 3, 5,
// 7) of a word of 8 e2m1 codes: e2m1's and e4m3's subnormals both sit at their formats' smallest
// normal exponent, so moving the sign to bit 7 and the magnitude bits to bits 2-4 is exact.
__device__ __forceinline__ uint32_t e2m1_lo_to_e4m3(uint32_t w) {
    return ((w & 0x07070707u) << 2) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t e2m1_hi_to_e4m3(uint32_t w) { return ((w >> 2) & 0x1C1C1C1Cu) | (w & 0x80808080u); }

// D = A · B (C = 0) on the tensor cores, m16n8k32, e4m3 inputs, fp32 accumulation. Lane (g, t) holds
// A rows g, g + 8 at k 4t..4t + 3 in a0, a1 and at 16 + 4t..19 + 4t in a2, a3; B column g at k
// 4t..4t + 3 in b0 and 16 + 4t.. in b1; D rows g, g + 8 × columns 2t, 2t + 1.
__device__ __forceinline__ void mma_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

// D += A · B, the same m16n8k32 e4m3 MMA accumulating into d.
__device__ __forceinline__ void mma_e4m3_acc(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
}

// An e4m3 pair (the low or the high two bytes of w) as an f16 pair, exact (subnormals included): one
// F2FP.F16.E4M3.UNPACK_B (cvt_bench, r50: 141 values an SM-clock, against 65 for e4m3 -> bf16 by bit
// moves and a multiply).
__device__ __forceinline__ uint32_t cvt_e4m3x2_f16x2_lo(uint32_t w) {
    uint32_t d;
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, l;\n}" : "=r"(d) : "r"(w));
    return d;
}
__device__ __forceinline__ uint32_t cvt_e4m3x2_f16x2_hi(uint32_t w) {
    uint32_t d;
    asm("{ .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n cvt.rn.f16x2.e4m3x2 %0, h;\n}" : "=r"(d) : "r"(w));
    return d;
}
// D += A · B, m16n8k16, f16 inputs, fp32 accumulation (the fragments as mma_bf16's).
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
}
// ---- Input rows staged as f16 for the f16 MMAs (the decode GEMVs, moe_decode_fp8) ---------------
// Row j < n (row_ptr(j): k values, fp32 where f32, else bf16) is rounded to bf16 (as the bf16 MMA
// paths round it), then written as f16 pairs to xs + j · pitch (k/2 words; 16-byte aligned). f16 holds
// every bf16 value of [2^-14, 65504] exactly (below, its subnormals round within 2^-25). A row with a
// magnitude ≥ 65504 (inf in f16) is staged again times 2^-s, s = ⌊log2 max⌋ - 14 (its values then
// below 2^15; those under max · 2^-38 round within that), and its sums are to be scaled back by 2^s.
inline constexpr int kF16StageMaxRows = 8;
inline constexpr int kF16StageMaxWarps = 8;
struct F16StageShared {
    uint32_t red[kF16StageMaxWarps][kF16StageMaxRows];  // the rows' magnitudes' bits, a warp each
    int shift[kF16StageMaxRows];                        // s of each row staged down (valid for its bit)
};
__device__ __forceinline__ void f16_stage_load8(const void* row, int c, bool f32, float (&v)[8]) {
    uint32_t b[4];
    if (f32) {
        const float4 p0 = *(reinterpret_cast<const float4*>(row) + 2 * c);
        const float4 p1 = *(reinterpret_cast<const float4*>(row) + 2 * c + 1);
        b[0] = pack_bf16x2(p0.x, p0.y), b[1] = pack_bf16x2(p0.z, p0.w);
        b[2] = pack_bf16x2(p1.x, p1.y), b[3] = pack_bf16x2(p1.z, p1.w);
    } else {
        const uint4 u = *(reinterpret_cast<const uint4*>(row) + c);
        b[0] = u.x, b[1] = u.y, b[2] = u.z, b[3] = u.w;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[2 * i] = __uint_as_float(b[i] << 16);
        v[2 * i + 1] = __uint_as_float(b[i] & 0xffff0000u);
    }
}
// Every thread of the CTA calls it (blockDim.x ≤ 32 · kF16StageMaxWarps, n ≤ kF16StageMaxRows); it ends
// in a barrier. Returns the rows staged down (bits, the same in every thread); sh.shift holds their s.
template <typename RowPtr>
__device__ __forceinline__ uint32_t f16_stage_rows(uint32_t* xs, int pitch, int n, int k, bool f32, RowPtr row_ptr,
                                                   F16StageShared& sh) {
    const int n8 = k / 8;
    bool big = false;
    for (int j = 0; j < n; ++j) {
        const void* row = row_ptr(j);
        for (int c = threadIdx.x; c < n8; c += blockDim.x) {
            float v[8];
            f16_stage_load8(row, c, f32, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) big |= !(fabsf(v[i]) < 65504.0f);  // NaN too: harmless
            *reinterpret_cast<uint4*>(xs + j * pitch + 4 * c) = make_uint4(
                pack_f16x2(v[0], v[1]), pack_f16x2(v[2], v[3]), pack_f16x2(v[4], v[5]), pack_f16x2(v[6], v[7]));
        }
    }
    if (!__syncthreads_or(big)) return 0u;  // nothing has read xs yet
    // Each row's largest magnitude (its bits: non-negative floats order as integers).
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int j = 0; j < kF16StageMaxRows; ++j) {
        uint32_t m = 0;
        if (j < n)
            for (int c = threadIdx.x; c < n8; c += blockDim.x) {
                float v[8];
                f16_stage_load8(row_ptr(j), c, f32, v);
#pragma unroll
                for (int i = 0; i < 8; ++i) m = max(m, __float_as_uint(fabsf(v[i])));
            }
        m = __reduce_max_sync(0xffffffffu, m);
        if (lane == 0) sh.red[warp][j] = m;
    }
    __syncthreads();
    const auto row_max = [&](int j) {
        uint32_t m = 0;
        for (int w = 0; w < warps; ++w) m = max(m, sh.red[w][j]);
        return m;
    };
    // s = ⌊log2 max⌋ - 14 (a max ≥ 65504 is normal, or inf / NaN: s ≤ 114).
    const auto shift_of = [](uint32_t m) { return static_cast<int>(m >> 23) - 127 - 14; };
    uint32_t down = 0;
    for (int j = 0; j < n; ++j) {
        const uint32_t m = row_max(j);
        if (!(__uint_as_float(m) < 65504.0f)) down |= 1u << j;
        if (threadIdx.x == 0) sh.shift[j] = shift_of(m);
    }
    for (int j = 0; j < n; ++j) {
        if (!((down >> j) & 1u)) continue;
        const float scale = __uint_as_float(static_cast<uint32_t>(127 - shift_of(row_max(j))) << 23);  // 2^-s
        for (int c = threadIdx.x; c < n8; c += blockDim.x) {
            float v[8];
            f16_stage_load8(row_ptr(j), c, f32, v);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] *= scale;
            *reinterpret_cast<uint4*>(xs + j * pitch + 4 * c) = make_uint4(
                pack_f16x2(v[0], v[1]), pack_f16x2(v[2], v[3]), pack_f16x2(v[4], v[5]), pack_f16x2(v[6], v[7]));
        }
    }
    __syncthreads();
    return down;
}
// A sum of row j's staged values, scaled back: × 2^s where j was staged down.
__device__ __forceinline__ float f16_unstage(float v, uint32_t down, int j, const F16StageShared& sh) {
    return ((down >> j) & 1u) ? v * __uint_as_float(static_cast<uint32_t>(127 + sh.shift[j]) << 23) : v;
}

// The top k of a warp's values (lane + 32j holds value v[j] of index lane + 32j, indices < n) by k rounds of a
// warp arg-max over (value descending, index ascending), a strict total order: every lane ends with the same
// top_v / top_e (s < k), and ties go to the lower index as in cpu::router. Each value is mapped to an unsigned
// key in the same order (-0 as +0: they tie, as the float compare has them; NaN lowest), so that a round is two
// warp reductions (redux.sync): the largest key, then the lowest index holding it (r52: where a butterfly of
// (value, index) shuffle pairs took 5 pairs a round, 20b batch 1 −20 µs a step). kMaxK ≥ k.
template <int kChunks, int kMaxK>
__device__ __forceinline__ void warp_topk(const float (&v)[kChunks], int n, int k, float (&top_v)[kMaxK],
                                          int (&top_e)[kMaxK]) {
    const int lane = threadIdx.x & 31;
    uint32_t key[kChunks];
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
        const uint32_t u = v[j] == 0.0f ? 0u : __float_as_uint(v[j]);
        key[j] = v[j] != v[j] ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    uint32_t taken = 0;
#pragma unroll
    for (int s = 0; s < kMaxK; ++s) {
        top_v[s] = 0.0f;
        top_e[s] = 0;
        if (s < k) {
            uint32_t bk = 0u, bi = 0xffffffffu;  // this lane's best: key descending, index ascending
#pragma unroll
            for (int j = 0; j < kChunks; ++j) {
                const int ex = lane + 32 * j;
                if (ex < n && !((taken >> j) & 1u) && (bi == 0xffffffffu || key[j] > bk)) {
                    bk = key[j];
                    bi = static_cast<uint32_t>(ex);
                }
            }
            const uint32_t wk = __reduce_max_sync(0xffffffffu, bi == 0xffffffffu ? 0u : bk);
            const uint32_t we = __reduce_min_sync(0xffffffffu, bi != 0xffffffffu && bk == wk ? bi : 0xffffffffu);
            const int be = static_cast<int>(we);
            if ((be & 31) == lane) taken |= 1u << (be >> 5);
            top_v[s] = __uint_as_float((wk & 0x80000000u) ? (wk & 0x7fffffffu) : ~wk);
            top_e[s] = be;
        }
    }
}

__device__ __forceinline__ float swiglu(float gate, float up, float limit, float alpha) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const float glu = gate / (1.0f + __expf(-alpha * gate));
    return (up + 1.0f) * glu;
}

}  // namespace gptoss::kernels::cuda
