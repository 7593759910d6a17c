// Device helpers shared by the grouped MoE kernels (moe_mma.cu, moe_wgmma.cu): shared-memory
// addresses and cp.async, the MXFP4 e2m1 pair to bf16 bit trick, and the clamped SwiGLU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

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

// Two e2m1 codes (byte b, bits above 7 zero; low nibble -> low half) as bf16 bit patterns worth
// value · 2^-126. Two multiplies place both nibbles at once: b · (2^6 + 2^18) puts magnitude bits
// 2:0 at 8:6 and 6:4 at 24:22 (the other copies land outside the mask), b · (2^12 + 2^24) the sign
// bits 3 and 7 at 15 and 31. Four integer ops for two weights.
__device__ __forceinline__ uint32_t e2m1x2_raw(uint32_t b) {
    return ((b * 0x00040040u) & 0x01C001C0u) | ((b * 0x01001000u) & 0x80008000u);
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

__device__ __forceinline__ float swiglu(float gate, float up, float limit, float alpha) {
    gate = fminf(gate, limit);
    up = fminf(fmaxf(up, -limit), limit);
    const float glu = gate / (1.0f + __expf(-alpha * gate));
    return (up + 1.0f) * glu;
}

}  // namespace gptoss::kernels::cuda
