// MXFP4 (e2m1 codes with an e8m0 scale per 32) to e4m3 under a power-of-two block scale, four
// codes at a time through byte permutes (quantize_weight_fp8_mxfp4 in fp8_gemm.cu, and moe_fp8's
// MXFP4 variant, which must produce the same bytes).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace gptoss::kernels::cuda {

// The e4m3 bytes of the e2m1 magnitudes 0, 0.5, ..., 6 times a group scale (rounded to bf16 as
// mxfp4_to_bf16 writes them) over the block scale (times inv, its reciprocal): the 8-byte table
// {y:x} that __byte_perm indexes. Round to nearest even, saturating (as quantize_weight_fp8_bf16).
__device__ __forceinline__ uint2 e4m3_magnitude_table(float gscale, float inv) {
    uint32_t w[2] = {0u, 0u};
#pragma unroll
    for (int m = 1; m < 8; ++m) {
        const float v = __bfloat162float(__float2bfloat16(e2m1_value(m) * gscale)) * inv;
        w[m / 4] |= static_cast<uint32_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)) << (8 * (m & 3));
    }
    return make_uint2(w[0], w[1]);
}

// Four e2m1 codes (the low 16 bits, code j in bits 4j..4j+3) to four e4m3 bytes through the table:
// the magnitude by byte permute, the sign bit moved to bit 7 (e4m3 rounding is sign-symmetric, and
// -0 becomes 0x80 as the converter gives it).
__device__ __forceinline__ uint32_t e2m1x4_to_e4m3(uint32_t codes, uint2 t) {
    const uint32_t mag = __byte_perm(t.x, t.y, codes & 0x7777u);
    const uint32_t sgn = __byte_perm(0x8000u, 0u, (codes >> 3) & 0x1111u);
    return mag | sgn;
}

// 32 codes (16 packed bytes, element 2i in the low nibble of byte i) to 32 e4m3 bytes.
__device__ __forceinline__ void e2m1x32_to_e4m3(uint4 p, uint2 t, uint4& lo, uint4& hi) {
    lo = make_uint4(e2m1x4_to_e4m3(p.x, t), e2m1x4_to_e4m3(p.x >> 16, t), e2m1x4_to_e4m3(p.y, t),
                    e2m1x4_to_e4m3(p.y >> 16, t));
    hi = make_uint4(e2m1x4_to_e4m3(p.z, t), e2m1x4_to_e4m3(p.z >> 16, t), e2m1x4_to_e4m3(p.w, t),
                    e2m1x4_to_e4m3(p.w >> 16, t));
}

}  // namespace gptoss::kernels::cuda
