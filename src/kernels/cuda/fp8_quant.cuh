// Device helpers of the FP8 activation / weight quantizers (fp8_gemm.cu) shared with the kernels
// that quantize their own outputs (the residual norm's quantized rows, elementwise.cu).
#pragma once

#include <cuda_fp8.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

// model::fp8_block_scale, operation for operation (IEEE division, frexp/ldexp exact), so device and
// CPU pick the same power of two for the same amax.
__device__ __forceinline__ float fp8_pow2_scale(float amax) {
    if (!(amax > 0.0f) || !isfinite(amax)) return 1.0f;
    int e = 0;
    frexpf(amax / 448.0f, &e);
    float s = ldexpf(1.0f, e);
    if (amax / (s * 0.5f) <= 448.0f) s *= 0.5f;
    return s;
}

// Round to nearest even, saturating to ±448: core/dtype.h's f32_to_fp8e4m3 for finite inputs.
__device__ __forceinline__ uint8_t to_e4m3(float v) {
    return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

}  // namespace gptoss::kernels::cuda
