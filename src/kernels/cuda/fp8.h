// FP8 e4m3 weights with 128×128 block scales (model/fp8_convert.h) on the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace gptoss::kernels::cuda {

// out[m, r, c] = bf16(e4m3(q[m, r, c]) · scales[m, r / 128, c / 128]) for `mats` matrices of
// [rows, cols] (scales [mats, ⌈rows/128⌉, ⌈cols/128⌉]). Exact when the scale is a power of two and
// the product fits bf16 (e4m3's 3 mantissa bits fit bf16's 7).
void fp8_block_to_bf16(const uint8_t* q, const float* scales, int64_t mats, int rows, int cols, void* out,
                       cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
