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
__device__ __forceinline__ float swiglu(float gate, float up, float limit, float alpha) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const float glu = gate / (1.0f + __expf(-alpha * gate));
    return (up + 1.0f) * glu;
}

}  // namespace gptoss::kernels::cuda
