// Device helpers of the FP8 activation / weight quantizers (fp8_gemm.cu) shared with the kernels
// that quantize their own outputs (the residual norm's quantized rows, elementwise.cu).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/fp8_scale_bits.h"

namespace gptoss::kernels::cuda {

// model::fp8_block_scale's power of two for the same amax: from amax's bits where
// kernels/fp8_scale_bits.h applies (every positive normal amax above 2^-118), else operation for
// operation (IEEE division, frexp / ldexp exact).
__device__ __forceinline__ float fp8_pow2_scale(float amax) {
    const uint32_t se = fp8_pow2_scale_exp(__float_as_uint(amax));
    if (se != 0u) return __uint_as_float(se << 23);
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    if (amax <= 448.0f * 0x1p-126f) return 0x1p-126f;  // model::kFp8MinScale: 1 / s finite
    int e = 0;
    frexpf(amax / 448.0f, &e);
    float s = ldexpf(1.0f, e);
    if (amax / (s * 0.5f) <= 448.0f) s *= 0.5f;
    return s;
}

// 1 / s for a power of two s (fp8_pow2_scale's): exact either way, from the bits where they allow.
__device__ __forceinline__ float fp8_pow2_inverse(float s) {
    const uint32_t ie = fp8_pow2_inverse_exp(__float_as_uint(s) >> 23);
    return ie != 0u ? __uint_as_float(ie << 23) : 1.0f / s;
}

// Round to nearest even, saturating to ±448: core/dtype.h's f32_to_fp8e4m3 for finite inputs.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace gptoss::kernels::cuda
